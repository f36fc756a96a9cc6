// SPDX-License-Identifier: Apache-2.0
// Device-side slot resolution for paged decode (serve/device_resolver.h, docs/serve.md), on CUDA:
//   - ServeDeviceResolveKernels.ResolveEqualsTheCpuTwin*: both resolve kernels' (warp, block)
//     state, pointer table and log equal resolve_slots_twin's exactly after every call of seeded
//     random routing sequences (E up to 128, caps from top-k to E, hot sets, a live cap below
//     the block's max), under the LRU, LFU and LFRU rules (LFRU: half-lives 1, 4, 7, 10, its
//     f64 scores compared bitwise);
//   - ServeDeviceResolveKernels.ResolveLatencyIsPrinted: one resolve call's device time in
//     Qwen3-30B-A3B's routing geometry (printed, not asserted);
//   - ServeDeviceResolveKernels.MissCopy*: the miss-copy kernel moves exactly the logged blocks
//     from pinned host memory (mapped address) into their slots, for 16-, 4- and 1-byte words;
//   - ServeDeviceResolveKernels.PacedWait*: the pacing wait takes at least the logged bytes at
//     the rate;
//   - ServeDeviceResolveKernels.ExpertFfnRowFilter*: the hits / misses launches of the overlapped
//     device path split the rows by the log and together equal one all-rows launch bitwise;
//   - MoeFixtures/ServeDeviceResolveCuda.*: paged decode with device resolution gives resident's
//     token ids and logits bits (and the host path's pager counters) on Qwen3-MoE, Mixtral and
//     OLMoE at caps top-k, top-k + 1 and E/2, f32 and bf16 experts, 3 concurrent requests and a
//     24-token decode, with graphs on: decode steps replay (replays > 0), device-resolved steps
//     cost one host sync each, the budget holds everything (the run fits a budget of exactly
//     its peak, one byte less fails at create), and paced at 2 GB/s it gives the same bits; the
//     device path's serial order (overlap_misses off: the hits' FFN after the copy) the same;
//     under LFU and LFRU the device path gives the same bits and the host pager's counters.
// Skips, saying so, without a CUDA device.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "kernels/cuda/serve_kernels.h"
#include "mem/buffer.h"
#include "serve/link_engine.h"
#include "serve/sampler.h"
#include "serve/slot_resolve.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using ferry::testing::device_copy;
using ferry::testing::host_copy;
using kernels::cuda::KernelVariant;
using testing::expect_same_bits;

class ServeDeviceResolveKernels : public CudaTest {};

TEST_F(ServeDeviceResolveKernels, ResolveEqualsTheCpuTwinOnRandomSequences) {
  // The slots are never dereferenced by resolve: a fake base makes the tables comparable.
  auto* const fake_base = reinterpret_cast<unsigned char*>(std::uintptr_t(1) << 40);
  int calls = 0, misses = 0, evictions = 0;
  // Both kernels (the warp kernel, the default, and the block kernel it replaced) from the same
  // random sequences; n = T*K reaches 128 ids, so the warp kernel's 32-id chunks are crossed.
  for (const int rule :
       {kernels::cuda::kSlotRuleLru, kernels::cuda::kSlotRuleLfu, kernels::cuda::kSlotRuleLfru})
    for (const KernelVariant variant : {KernelVariant::kDecode, KernelVariant::kBaseline})
      for (const auto& [E, K] : {std::pair{8, 2}, std::pair{64, 8}, std::pair{128, 8}}) {
        for (std::uint64_t seed = 1; seed <= 6; ++seed) {
          Rng rng(seed * 104729 + std::uint64_t(E));
          const int hot = int(seed % 3);
          const int cap = std::min(E, K + hot + int(rng.next() % std::uint64_t(E)));
          const int M = std::min(E, cap + int(seed % 2) * 3);  // a block wider than the live cap
          std::vector<std::int32_t> state(std::size_t(SlotStateLayout::state_ints(E, M)), 0);
          std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
          std::vector<const void*> table(std::size_t(3 * E), nullptr);
          const SlotStateView st{state.data(), E, M};
          st.cap() = cap;
          st.rule() = rule;
          st.half_life() = 1 + int(seed % 4) * 3;
          const std::vector<double> decay = lfru_decay_table(st.half_life());
          const double* d_decay = device_copy(decay);
          for (int e = 0; e < E; ++e) st.slot_of()[e] = -1;
          for (int s = 0; s < M; ++s) st.expert_in()[s] = -1;
          for (int h = 0; h < hot;
               ++h) {  // hot experts h * 3 in slots 0.. (as the pager loads them)
            const int e = (h * 3) % E;
            st.expert_in()[h] = e;
            st.slot_of()[e] = h;
            st.flags()[h] = kernels::cuda::kSlotHot;
            st.uses()[h] = 1;
            table[std::size_t(e)] = fake_base + h * 96;
          }
          std::int32_t* d_state = device_copy(state);
          std::int32_t* d_log = device_copy(log);
          const void** d_table = device_copy(table);
          std::int32_t* d_ids = nullptr;
          ASSERT_EQ(cudaMalloc(&d_ids, std::size_t(E) * 4), cudaSuccess);
          std::vector<std::int32_t> recent;
          for (int call = 0; call < 60; ++call) {
            const int limit = cap - hot;
            // Every third call has more rows than free slots, naming at most `limit` experts (a
            // pool of that many): SlotResolver::fits admits such calls since it counts distinct
            // experts (4 decoding requests x top-8 rows against a smaller cap).
            const bool wide = call % 3 == 2;
            std::vector<std::int32_t> pool;
            while (wide && int(pool.size()) < limit) {
              const std::int32_t e = std::int32_t(rng.next() % std::uint64_t(E));
              if (std::find(pool.begin(), pool.end(), e) == pool.end()) pool.push_back(e);
            }
            const int T = wide ? 1 + int(rng.next() % std::uint64_t(E / K))
                               : 1 + int(rng.next() % std::uint64_t(std::max(1, limit / K)));
            std::vector<std::int32_t> ids;
            for (int t = 0; t < T; ++t) {
              std::vector<std::int32_t> row;
              while (int(row.size()) < K) {
                std::int32_t e = std::int32_t(rng.next() % std::uint64_t(E));
                if (wide) {
                  e = pool[rng.next() % pool.size()];
                } else if (!recent.empty() && rng.next() % 2 == 0) {
                  e = recent[rng.next() % recent.size()];
                }
                if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
              }
              ids.insert(ids.end(), row.begin(), row.end());
              recent.insert(recent.end(), row.begin(), row.end());
            }
            if (recent.size() > std::size_t(4 * K))
              recent.erase(recent.begin(), recent.end() - 4 * K);
            SlotResolveArgs h = testing::test_resolve_args(ids, E, M, state.data(), table.data(),
                                                           log.data(), fake_base);
            h.lfru_decay = decay.data();
            resolve_slots_twin(h);
            ASSERT_EQ(ferry::testing::copy_to_device(d_ids, ids.data(), ids.size() * 4),
                      cudaSuccess);
            SlotResolveArgs d = h;
            d.ids = d_ids;
            d.state = d_state;
            d.table = d_table;
            d.log = d_log;
            d.lfru_decay = d_decay;
            ASSERT_TRUE(kernels::cuda::resolve_slots(d, variant, stream()).ok());
            sync();
            const std::string what =
                fmt::format("{} {} E {} K {} cap {} max {} hot {} seed {} call {}",
                            rule == kernels::cuda::kSlotRuleLfu    ? "lfu"
                            : rule == kernels::cuda::kSlotRuleLfru ? "lfru"
                                                                   : "lru",
                            variant == KernelVariant::kDecode ? "warp" : "block", E, K, cap, M, hot,
                            seed, call);
            ASSERT_EQ(host_copy(d_state, state.size()), state) << what;
            ASSERT_EQ(host_copy(d_log, log.size()), log) << what;
            ASSERT_EQ(host_copy(d_table, table.size()), table) << what;
            ASSERT_EQ(log[3], 0) << what;  // errors
            misses += log[1];
            evictions += log[2];
            ++calls;
          }
          cudaFree(d_state);
          cudaFree(d_log);
          cudaFree(d_table);
          cudaFree(d_ids);
          cudaFree(const_cast<double*>(d_decay));
        }
      }
  EXPECT_EQ(calls, 3 * 2 * 3 * 6 * 60);
  EXPECT_GT(evictions, 800);
  std::cout << "[serve_gpu] resolve kernel = twin over " << calls << " calls, " << misses
            << " misses, " << evictions << " evictions\n";
}

// What one layer's resolve + (empty) miss copy cost on the device, in Qwen3-30B-A3B's routing
// geometry (E 128, top-8, 51 slots): printed, not asserted (a decode token runs 48 of them).
TEST_F(ServeDeviceResolveKernels, ResolveLatencyIsPrinted) {
  const int E = 128, K = 8, M = 51, reps = 200;
  std::vector<std::int32_t> ids(std::size_t(reps * K));
  for (int r = 0; r < reps; ++r) {
    for (int k = 0; k < K; ++k) ids[std::size_t(r * K + k)] = std::int32_t((r * 3 + k * 16) % E);
  }
  std::int32_t* d_ids = device_copy(ids);
  unsigned char* d_slots = nullptr;
  ASSERT_EQ(cudaMalloc(&d_slots, 4096), cudaSuccess);
  for (const KernelVariant variant : {KernelVariant::kDecode, KernelVariant::kBaseline}) {
    std::vector<std::int32_t> state(std::size_t(SlotStateLayout::state_ints(E, M)), 0);
    const SlotStateView st{state.data(), E, M};
    st.cap() = M;
    for (int e = 0; e < E; ++e) st.slot_of()[e] = -1;
    for (int s = 0; s < M; ++s) st.expert_in()[s] = -1;
    std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
    std::vector<const void*> table(std::size_t(3 * E), nullptr);
    std::int32_t* d_state = device_copy(state);
    std::int32_t* d_log = device_copy(log);
    const void** d_table = device_copy(table);
    auto e0 = mem::Event::create(Device::kCuda, 0, true);
    auto e1 = mem::Event::create(Device::kCuda, 0, true);
    ASSERT_TRUE(e0.ok() && e1.ok());
    auto run = [&](int r) {
      const SlotResolveArgs a{.ids = d_ids + r * K,
                              .n = K,
                              .E = E,
                              .max_cap = M,
                              .state = d_state,
                              .table = d_table,
                              .log = d_log,
                              .slot_base = d_slots,
                              .expert_bytes = 16,
                              .up_offset = 0,
                              .down_offset = 0};
      EXPECT_TRUE(kernels::cuda::resolve_slots(a, variant, stream()).ok());
    };
    run(0);
    sync();
    ASSERT_TRUE(e0->record(stream()).ok());
    for (int r = 1; r < reps; ++r) run(r);
    ASSERT_TRUE(e1->record(stream()).ok());
    sync();
    auto ms = mem::Event::elapsed_ms(*e0, *e1);
    ASSERT_TRUE(ms.ok());
    EXPECT_EQ(host_copy(d_log, 4)[3], 0);  // no errors
    std::cout << "[serve_gpu] resolve_slots "
              << (variant == KernelVariant::kDecode ? "warp" : "block")
              << " kernel, E 128 top-8 cap 51: " << *ms * 1000.0 / (reps - 1)
              << " us per call (launches back to back)\n";
    cudaFree(d_state);
    cudaFree(d_log);
    cudaFree(d_table);
  }
  cudaFree(d_ids);
  cudaFree(d_slots);
}

TEST_F(ServeDeviceResolveKernels, MissCopyMovesExactlyTheLoggedBlocksFromPinnedMemory) {
  for (const std::int64_t eb : {std::int64_t(4096), std::int64_t(52), std::int64_t(51)}) {
    const int E = 6, slots = 4;
    mem::MemoryBudget hb(mem::MemTier::kPinnedHost), db(mem::MemTier::kDevice);
    auto h = mem::Buffer::allocate(mem::MemTier::kPinnedHost, std::size_t(E * eb), hb,
                                   {.what = "store"});
    auto d = mem::Buffer::allocate(mem::MemTier::kDevice, std::size_t(slots * eb), db,
                                   {.what = "slots"});
    ASSERT_TRUE(h.ok() && d.ok());
    for (std::int64_t i = 0; i < E * eb; ++i) h->data()[i] = std::byte((i * 37 + 11) % 251);
    ASSERT_EQ(cudaMemsetAsync(d->data(), 0xEE, std::size_t(slots * eb), raw_stream()), cudaSuccess);
    auto mapped = kernels::cuda::mapped_pointer(h->data());
    ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
    // An address inside the allocation maps to the same offset (a store's layers start there).
    auto inner = kernels::cuda::mapped_pointer(h->data() + eb);
    ASSERT_TRUE(inner.ok()) << inner.status().to_string();
    EXPECT_EQ(static_cast<const unsigned char*>(*inner),
              static_cast<const unsigned char*>(*mapped) + eb);
    std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
    log[1] = 2;                                  // misses
    log[5 + E + 0] = 4, log[5 + 2 * E + 0] = 1;  // expert 4 -> slot 1
    log[5 + E + 1] = 0, log[5 + 2 * E + 1] = 3;  // expert 0 -> slot 3
    std::int32_t* d_log = device_copy(log);
    ASSERT_TRUE(
        kernels::cuda::copy_misses({.slot_base = reinterpret_cast<unsigned char*>(d->data()),
                                    .src_base = static_cast<const unsigned char*>(*mapped),
                                    .expert_bytes = eb,
                                    .log = d_log,
                                    .E = E,
                                    .blocks = 64},
                                   stream())
            .ok());
    sync();
    const auto got =
        host_copy(reinterpret_cast<const unsigned char*>(d->data()), std::size_t(slots * eb));
    const auto* src = reinterpret_cast<const unsigned char*>(h->data());
    for (std::int64_t i = 0; i < eb; ++i) {
      ASSERT_EQ(got[std::size_t(i)], 0xEE) << eb;
      ASSERT_EQ(got[std::size_t(eb + i)], src[4 * eb + i]) << eb << " byte " << i;
      ASSERT_EQ(got[std::size_t(2 * eb + i)], 0xEE) << eb;
      ASSERT_EQ(got[std::size_t(3 * eb + i)], src[i]) << eb << " byte " << i;
    }
    cudaFree(d_log);
  }
}

// The overlapped device path's two expert_ffn launches (ExpertRowFilter): the hits launch writes
// exactly the rows whose expert is not among the log's misses, the misses launch exactly the
// others, and together they give the one all-rows launch's bits, for both kernel variants, bf16
// and f32 weights, with no, some and every expert missed (ids outside [0, E) count as hits and
// give zero rows, as in the all-rows launch).
TEST_F(ServeDeviceResolveKernels, ExpertFfnRowFilterSplitsTheRowsByTheLog) {
  using kernels::cuda::ExpertRowFilter;
  const int E = 6, K = 4;
  const std::int64_t T = 3, rows = T * K;
  for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{2048, 768}, {96, 40}}) {
    const std::int64_t C = shape.first, F = shape.second;
    std::mt19937 rng(unsigned(C + F));
    std::uniform_real_distribution<float> ud(-0.05f, 0.05f);
    const std::size_t per = std::size_t(3 * F * C), n = per * E;
    std::vector<std::uint16_t> wb(n);
    std::vector<float> wf(n), x(std::size_t(T * C));
    for (std::size_t i = 0; i < n; ++i) {
      wb[i] = f32_to_bf16(ud(rng));
      wf[i] = bf16_to_f32(wb[i]);
    }
    for (float& v : x) v = ud(rng) * 20.0f;
    // Token 2's last row names no expert (-1): a zero row in every launch that owns it.
    const std::vector<std::int32_t> ids = {0, 1, 2, 3, 4, 5, 0, 2, 3, 1, 4, -1};
    ferry::testing::DeviceBuf d_wb(n * 2), d_wf(n * 4), d_x(x.size() * 4), d_ids(rows * 4),
        d_act(std::size_t(rows * F) * 4), d_tb(3 * E * 8), d_tf(3 * E * 8), d_ref(rows * C * 4),
        d_out(rows * C * 4);
    ferry::testing::up(d_wb.p, wb);
    ferry::testing::up(d_wf.p, wf);
    ferry::testing::up(d_x.p, x);
    ferry::testing::up(d_ids.p, ids);
    auto table_for = [&](const std::byte* base, std::size_t elem) {
      return ferry::testing::expert_pointer_table(base, E, F, C, elem);
    };
    ferry::testing::up(d_tb.p, table_for(static_cast<const std::byte*>(d_wb.p), 2));
    ferry::testing::up(d_tf.p, table_for(static_cast<const std::byte*>(d_wf.p), 4));
    for (const std::vector<std::int32_t>& missed :
         {std::vector<std::int32_t>{}, {4, 1}, {0, 1, 2, 3, 4, 5}}) {
      std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
      log[1] = std::int32_t(missed.size());
      for (std::size_t j = 0; j < missed.size(); ++j) {
        log[std::size_t(SlotStateLayout::kLogHeader + E) + j] = missed[j];
      }
      std::int32_t* d_log = device_copy(log);
      for (const bool bf16 : {true, false}) {
        for (const KernelVariant v : {KernelVariant::kDecode, KernelVariant::kBaseline}) {
          const std::string what =
              fmt::format("C {} F {} misses {} {} {}", C, F, missed.size(), bf16 ? "bf16" : "f32",
                          v == KernelVariant::kDecode ? "decode" : "baseline");
          kernels::cuda::ExpertFfnArgs a{
              .out = d_ref.as<float>(),
              .act = d_act.as<float>(),
              .x = d_x.as<float>(),
              .ids = d_ids.as<std::int32_t>(),
              .table = static_cast<const void* const*>(bf16 ? d_tb.p : d_tf.p),
              .row_begin = 0,
              .row_end = rows,
              .K = K,
              .E = E,
              .C = C,
              .F = F,
              .bf16 = bf16};
          ASSERT_EQ(cudaMemsetAsync(d_ref.p, 0xff, rows * C * 4, raw_stream()), cudaSuccess);
          ASSERT_EQ(cudaMemsetAsync(d_out.p, 0xff, rows * C * 4, raw_stream()),
                    cudaSuccess);  // NaN sentinels
          ASSERT_TRUE(kernels::cuda::expert_ffn(a, v, stream()).ok()) << what;
          a.out = d_out.as<float>();
          a.miss_log = d_log;
          a.row_filter = ExpertRowFilter::kHits;
          ASSERT_TRUE(kernels::cuda::expert_ffn(a, v, stream()).ok()) << what;
          sync();
          const auto ref = ferry::testing::down<std::uint32_t>(d_ref.p, std::size_t(rows * C));
          const auto hits = ferry::testing::down<std::uint32_t>(d_out.p, std::size_t(rows * C));
          for (std::int64_t i = 0; i < rows; ++i) {
            const bool miss =
                std::find(missed.begin(), missed.end(), ids[std::size_t(i)]) != missed.end();
            for (std::int64_t c = 0; c < C; ++c) {
              const std::size_t at = std::size_t(i * C + c);
              ASSERT_EQ(hits[at], miss ? 0xffffffffu : ref[at])
                  << what << ": after the hits launch, row " << i << " col " << c;
            }
          }
          a.row_filter = ExpertRowFilter::kMisses;
          ASSERT_TRUE(kernels::cuda::expert_ffn(a, v, stream()).ok()) << what;
          sync();
          EXPECT_TRUE(ferry::testing::same_bits(
              ferry::testing::down<std::uint32_t>(d_out.p, std::size_t(rows * C)), ref))
              << what << ": hits + misses launches vs one launch";
        }
      }
      cudaFree(d_log);
    }
  }
  // A filter without its log is refused, not launched.
  ferry::testing::DeviceBuf d1(64);
  const kernels::cuda::ExpertFfnArgs bad{.out = d1.as<float>(),
                                         .act = d1.as<float>(),
                                         .x = d1.as<float>(),
                                         .ids = d1.as<std::int32_t>(),
                                         .table = static_cast<const void* const*>(d1.p),
                                         .row_begin = 0,
                                         .row_end = 1,
                                         .K = 1,
                                         .E = 1,
                                         .C = 1,
                                         .F = 1,
                                         .row_filter = ExpertRowFilter::kHits};
  EXPECT_FALSE(kernels::cuda::expert_ffn(bad, KernelVariant::kDefault, stream()).ok());
}

TEST_F(ServeDeviceResolveKernels, PacedWaitTakesTheLoggedBytesAtTheRate) {
  const int E = 8;
  std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
  log[1] = 3;  // 3 misses x 1 MiB at 1 GB/s: >= 3.15 ms
  std::int32_t* d_log = device_copy(log);
  unsigned long long* d_mark = nullptr;
  ASSERT_EQ(cudaMalloc(&d_mark, 8), cudaSuccess);
  auto e0 = mem::Event::create(Device::kCuda, 0, true);
  auto e1 = mem::Event::create(Device::kCuda, 0, true);
  ASSERT_TRUE(e0.ok() && e1.ok());
  ASSERT_TRUE(e0->record(stream()).ok());
  ASSERT_TRUE(kernels::cuda::link_pace_mark(d_mark, stream()).ok());
  ASSERT_TRUE(kernels::cuda::link_pace_wait_misses(d_mark, d_log, 1 << 20, 1.0, stream()).ok());
  ASSERT_TRUE(e1->record(stream()).ok());
  sync();
  auto ms = mem::Event::elapsed_ms(*e0, *e1);
  ASSERT_TRUE(ms.ok());
  EXPECT_GE(*ms, 3.0 * (1 << 20) / 1e6 - 0.01);
  std::cout << "[serve_gpu] paced wait for 3 MiB at 1 GB/s: " << *ms << " ms\n";
  cudaFree(d_log);
  cudaFree(d_mark);
}

struct Run {
  testing::RunRecord rec;
  std::uint64_t host_syncs = 0, steps = 0, device_resolved = 0;
  PagerCounters pager;
  GraphStats graphs;
  std::size_t peak = 0;
};

EngineConfig paged_config(int cap, DType dt, bool device_resolve) {
  EngineConfig cfg;
  cfg.pager.mode = cap > 0 ? ExpertMode::kPaged : ExpertMode::kResident;
  cfg.pager.slots_per_layer = cap;
  cfg.pager.expert_dtype = dt;
  cfg.pager.device_resolve = device_resolve;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  cfg.cuda_graphs = true;
  return cfg;
}

Result<Run> run_with(const model::LoadedModel& m, const EngineConfig& cfg, kernels::Backend& be,
                     const std::vector<GenerationRequest>& reqs) {
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg, be));
  Run r;
  FERRY_ASSIGN_OR_RETURN(r.rec, testing::run_engine(*eng, reqs));
  r.host_syncs = eng->host_syncs();
  r.steps = eng->stats().steps;
  r.device_resolved = eng->experts().counters().device_resolved;
  if (eng->experts().pager() != nullptr) r.pager = eng->experts().pager()->counters();
  r.graphs = eng->graph_stats();
  r.peak = eng->device_budget().bytes_peak();
  return r;
}

class ServeDeviceResolveCuda : public CudaTest,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeDeviceResolveCuda, PagedDecodeGivesResidentBitsAsGraphsWithOneSyncPerStep) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts;
  int L = 0;
  for (bool moe : m.geometry.layer_is_moe) L += moe;
  GenerationRequest one;
  for (int i = 0; i < 9; ++i) one.prompt.push_back((i * 29 + 3) % m.geometry.vocab);
  one.max_new_tokens = 24;
  const std::vector<std::vector<GenerationRequest>> workloads = {
      testing::mixed_requests(m.geometry.vocab), {one}};
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    for (std::size_t w = 0; w < workloads.size(); ++w) {
      auto ref = run_with(m, paged_config(0, dt, true), cuda(), workloads[w]);
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      for (const int cap : {K, K + 1, std::max(K, E / 2)}) {
        const std::string name =
            fmt::format("{} {} workload {} cap {}", GetParam(), to_string(dt), w, cap);
        auto dev = run_with(m, paged_config(cap, dt, true), cuda(), workloads[w]);
        auto host = run_with(m, paged_config(cap, dt, false), cuda(), workloads[w]);
        // The device path in the serial order (the hits' FFN after the miss copy, one launch),
        // the reference of its default order (hits beside the copy on the copy stream).
        EngineConfig serial_cfg = paged_config(cap, dt, true);
        serial_cfg.pager.overlap_misses = false;
        auto serial = run_with(m, serial_cfg, cuda(), workloads[w]);
        ASSERT_TRUE(dev.ok()) << name << ": " << dev.status().to_string();
        ASSERT_TRUE(host.ok()) << name << ": " << host.status().to_string();
        ASSERT_TRUE(serial.ok()) << name << ": " << serial.status().to_string();
        expect_same_bits(dev->rec, ref->rec, name + " device resolve vs resident");
        expect_same_bits(host->rec, ref->rec, name + " host path vs resident");
        expect_same_bits(serial->rec, ref->rec,
                         name + " device resolve, serial order, vs resident");
        EXPECT_EQ(serial->device_resolved, dev->device_resolved) << name;
        EXPECT_EQ(serial->pager.misses, dev->pager.misses) << name;
        // The pager mirrored the device: the host path's decisions and counters.
        EXPECT_EQ(dev->pager.hits, host->pager.hits) << name;
        EXPECT_EQ(dev->pager.misses, host->pager.misses) << name;
        EXPECT_EQ(dev->pager.evictions, host->pager.evictions) << name;
        EXPECT_EQ(dev->pager.bytes_copied, host->pager.bytes_copied) << name;
        EXPECT_EQ(host->device_resolved, 0u) << name;
        EXPECT_GT(dev->device_resolved, 0u) << name;
        ASSERT_EQ(dev->device_resolved % std::uint64_t(L), 0u) << name << ": whole steps only";
        if (cap < E) {
          EXPECT_GT(dev->pager.misses, 0u) << name;
        }
        // One sync per step, plus one per MoE layer for each step the host path resolved.
        const std::uint64_t dev_steps = dev->device_resolved / std::uint64_t(L);
        EXPECT_EQ(dev->host_syncs, dev->steps + std::uint64_t(L) * (dev->steps - dev_steps))
            << name;
        EXPECT_EQ(dev->graphs.disabled_reason, "") << name;
        EXPECT_EQ(host->graphs.eligible_steps, 0u) << name << ": the host path waits inside";
        // The 24-token decode replays all but its first two device steps; the mixed workload's
        // decode-only steps of 3 and 2 sequences may exceed the slots (host path), so only the
        // bookkeeping is checked there.
        if (w == 1) {
          EXPECT_GE(dev->graphs.replays, 15u) << name << ": decode steps were not replayed";
        }
        EXPECT_EQ(dev->graphs.warmup_steps + dev->graphs.captures + dev->graphs.replays,
                  dev->graphs.eligible_steps)
            << name;
        std::cout << "[serve_gpu] " << name << ": device resolve = resident bits; " << dev_steps
                  << " of " << dev->steps << " steps on the device, host syncs " << host->host_syncs
                  << " -> " << dev->host_syncs << ", " << dev->graphs.replays << " replays, "
                  << dev->pager.misses << " misses\n";
        // LFU and LFRU resolve on the device too: the host pager's decisions, resident's bits.
        for (const EvictionPolicy policy : {EvictionPolicy::kLfu, EvictionPolicy::kLfru}) {
          const std::string pn = name + " " + std::string(to_string(policy));
          EngineConfig pdev = paged_config(cap, dt, true), phost = paged_config(cap, dt, false);
          pdev.pager.policy = phost.pager.policy = policy;
          auto ld = run_with(m, pdev, cuda(), workloads[w]);
          auto lh = run_with(m, phost, cuda(), workloads[w]);
          ASSERT_TRUE(ld.ok()) << pn << ": " << ld.status().to_string();
          ASSERT_TRUE(lh.ok()) << pn << ": " << lh.status().to_string();
          expect_same_bits(ld->rec, ref->rec, pn + " device resolve vs resident");
          EXPECT_EQ(ld->pager.hits, lh->pager.hits) << pn;
          EXPECT_EQ(ld->pager.misses, lh->pager.misses) << pn;
          EXPECT_EQ(ld->pager.evictions, lh->pager.evictions) << pn;
          EXPECT_GT(ld->device_resolved, 0u) << pn;
          EXPECT_EQ(lh->device_resolved, 0u) << pn;
        }
        if (w == 0 && cap == K) {
          // The hard budget holds all of it: a budget of exactly the peak runs the same bits,
          // one byte less is refused at create (nothing is allocated while stepping).
          EngineConfig tight = paged_config(cap, dt, true);
          tight.device_budget_bytes = dev->peak;
          auto fits = run_with(m, tight, cuda(), workloads[w]);
          ASSERT_TRUE(fits.ok()) << name << ": " << fits.status().to_string();
          expect_same_bits(fits->rec, ref->rec, name + " at a budget of its peak");
          EXPECT_LE(fits->peak, dev->peak) << name;
          tight.device_budget_bytes = dev->peak - 1;
          auto over = Engine::create(m.geometry, m.params, tight, cuda());
          EXPECT_FALSE(over.ok()) << name;
          // Paced copies (the device path paces its copy kernel's bytes): the same bits.
          EngineConfig paced = paged_config(cap, dt, true);
          paced.link_pace_gbps = 2;
          auto p = run_with(m, paced, cuda(), workloads[w]);
          ASSERT_TRUE(p.ok()) << name << ": " << p.status().to_string();
          expect_same_bits(p->rec, ref->rec, name + " paced at 2 GB/s");
          EXPECT_EQ(p->device_resolved, dev->device_resolved) << name;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ServeDeviceResolveCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"));

}  // namespace
}  // namespace ferry::serve
