// SPDX-License-Identifier: Apache-2.0
// The CUDA engine's per-step fixed cost (issue #5, docs/serve.md "Fewer host syncs per decode
// step"): forced routing uploaded once per step, link pacing of the copy stream, and decode
// steps replayed as CUDA graphs.
//   - ServeStepKernels.ForcedRoutingEqualsItsCpuTwin: the forced_routing kernel gives
//     apply_forced_rows' ids and weights bit for bit (kept, equal and replaced rows, with and
//     without renormalisation);
//   - ServeForcedRoutingCuda.*: on the MoE fixtures, a replayed trace forced ahead (one upload per
//     step) gives the per-layer hook path's token ids and logits bits in resident, static and
//     paged modes, with one host sync per MoE layer and step fewer;
//   - ServeLinkPace.*: a LinkEngine paced to G GB/s never moves a copy faster than G (host-timed
//     big copies, event-timed small copies after idle gaps), delivers the bytes, and an engine
//     with paced expert copies gives the unpaced bits;
//   - ServeGraphsCuda.*: decode steps replayed from CUDA graphs give the eager steps' token ids
//     and logits bits (resident and static, f32 and bf16 experts, with and without forced
//     routing, one and three concurrent sequences), really replay (replays > 0, nothing
//     disabled), keep one host sync per step, and count the same expert and read-back bytes;
//   - ServeDeviceCopy.*: a kernel reading pinned host memory (the device-side miss path's copy)
//     delivers the bytes; its rate vs the copy engine's is printed (a measurement, not asserted).
// Skips, saying so, without a CUDA device.
#include <chrono>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>

#include "kernels/cuda/serve_kernels.h"
#include "mem/buffer.h"
#include "mem/stream_set.h"
#include "serve/link_engine.h"
#include "serve/model_runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using ferry::testing::device_copy;
using ferry::testing::host_copy;
using testing::expect_same_bits;

class ServeStepKernels : public CudaTest {};

TEST_F(ServeStepKernels, ForcedRoutingEqualsItsCpuTwin) {
  for (const auto& [T, K, E] :
       std::vector<std::tuple<int, int, int>>{{1, 8, 128}, {37, 2, 8}, {130, 4, 60}}) {
    std::mt19937 rng(T * 31 + K);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> probs(std::size_t(T) * E), weights(std::size_t(T) * K);
    for (float& p : probs) p = u(rng);
    for (float& w : weights) w = u(rng);
    std::vector<std::int32_t> ids(std::size_t(T) * K), forced(std::size_t(T) * K);
    std::vector<std::int32_t> perm(E);
    for (int t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + K, ids.begin() + t * K);
      std::shuffle(perm.begin(), perm.end(), rng);
      switch (t % 3) {
        case 0:  // kept: the hook left the router's choice
          std::fill(forced.begin() + t * K, forced.begin() + (t + 1) * K, -1);
          break;
        case 1:  // equal to the router's choice: its weights stay
          std::copy(ids.begin() + t * K, ids.begin() + (t + 1) * K, forced.begin() + t * K);
          break;
        default:  // replaced
          std::copy(perm.begin(), perm.begin() + K, forced.begin() + t * K);
      }
    }
    for (bool renorm : {false, true}) {
      std::vector<std::int32_t> want_ids = ids;
      std::vector<float> want_w = weights;
      apply_forced_rows(forced.data(), T, K, E, renorm, probs.data(), want_ids.data(),
                        want_w.data());
      auto* d_ids = device_copy(ids);
      auto* d_w = device_copy(weights);
      auto* d_p = device_copy(probs);
      auto* d_f = device_copy(forced);
      ASSERT_TRUE(kernels::cuda::forced_routing({.ids = d_ids,
                                                 .weights = d_w,
                                                 .probs = d_p,
                                                 .forced = d_f,
                                                 .T = T,
                                                 .E = E,
                                                 .K = K,
                                                 .renormalize = renorm},
                                                stream())
                      .ok());
      sync();
      EXPECT_EQ(host_copy(d_ids, ids.size()), want_ids) << T << " " << K << " " << renorm;
      const std::vector<float> got_w = host_copy(d_w, weights.size());
      EXPECT_EQ(std::memcmp(got_w.data(), want_w.data(), want_w.size() * 4), 0)
          << "weights differ from apply_forced_rows: T " << T << " K " << K << " renorm " << renorm;
      for (void* p : {static_cast<void*>(d_ids), static_cast<void*>(d_w), static_cast<void*>(d_p),
                      static_cast<void*>(d_f)}) {
        cudaFree(p);
      }
    }
  }
}

EngineConfig step_config(ExpertMode mode, int cap, DType dt = DType::kF32, bool graphs = true) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = cap;
  cfg.pager.expert_dtype = dt;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  cfg.cuda_graphs = graphs;
  return cfg;
}

struct Run {
  testing::RunRecord rec;
  std::uint64_t host_syncs = 0, steps = 0, h2d = 0, d2h = 0, d2d = 0, static_bytes = 0;
  std::uint64_t expert_rows = 0, misses = 0;
  std::uint64_t device_resolved = 0;  // MoE layer calls whose slots were resolved on the device
  GraphStats graphs;
  LinkPaceStats pace;
};

Result<Run> run_engine_with(const model::LoadedModel& m, const EngineConfig& cfg,
                            kernels::Backend& be, RoutingHook* hook,
                            const std::vector<GenerationRequest>& reqs) {
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg, be));
  eng->set_routing_hook(hook);
  Run r;
  FERRY_ASSIGN_OR_RETURN(r.rec, testing::run_engine(*eng, reqs));
  r.host_syncs = eng->host_syncs();
  r.steps = eng->stats().steps;
  const auto& c = eng->transfer_engine()->counters();
  r.h2d = c.h2d_bytes;
  r.d2h = c.d2h_bytes;
  r.d2d = c.d2d_bytes;
  r.static_bytes = eng->experts().counters().static_bytes_copied;
  r.expert_rows = eng->experts().counters().expert_rows;
  r.device_resolved = eng->experts().counters().device_resolved;
  if (eng->experts().pager() != nullptr) r.misses = eng->experts().pager()->counters().misses;
  r.graphs = eng->graph_stats();
  r.pace = eng->transfer_engine()->pace_stats();
  return r;
}

int moe_layers(const model::DecoderGeometry& g) {
  int n = 0;
  for (bool m : g.layer_is_moe) n += m;
  return n;
}

// A trace recorded on the resident CUDA engine, then varied (testing::varied_trace): kept, equal
// and replaced rows.
RoutingTrace varied_cuda_trace(const model::LoadedModel& m, kernels::Backend& be,
                               const std::vector<GenerationRequest>& reqs) {
  TraceRecorder rec(m.geometry.experts, m.geometry.top_k);
  auto r =
      run_engine_with(m, step_config(ExpertMode::kResident, 0, DType::kF32, false), be, &rec, reqs);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return testing::varied_trace(rec.trace());
}

class ServeForcedRoutingCuda : public CudaTest,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeForcedRoutingCuda, ForcedAheadSameBitsAsPerLayerHookWithoutItsSyncs) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const auto reqs = testing::mixed_requests(m.geometry.vocab);
  const RoutingTrace trace = varied_cuda_trace(m, cuda(), reqs);
  const int K = m.geometry.top_k, L = moe_layers(m.geometry);
  for (ExpertMode mode : {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kPaged}) {
    // Graphs off on both sides: this compares the two routing paths alone.
    const EngineConfig cfg = step_config(mode, K + 1, DType::kF32, false);
    testing::PerLayerReplayer per_layer(trace, false);
    TraceReplayer ahead(trace, false);
    auto a = run_engine_with(m, cfg, cuda(), &per_layer, reqs);
    auto b = run_engine_with(m, cfg, cuda(), &ahead, reqs);
    const std::string name = fmt::format("{} {}", GetParam(), to_string(mode));
    ASSERT_TRUE(a.ok()) << name << ": " << a.status().to_string();
    ASSERT_TRUE(b.ok()) << name << ": " << b.status().to_string();
    expect_same_bits(b->rec, a->rec, name + " forced ahead vs per-layer hook");
    EXPECT_EQ(ahead.forced(), per_layer.rep.forced()) << name;
    EXPECT_GT(ahead.forced(), 0u) << name;
    ASSERT_EQ(a->steps, b->steps) << name;
    // Forced ahead drops the hook's sync of every MoE layer of every step and, in paged decode,
    // the routed ids' sync of each layer call resolved on the device. Knowing the routes first
    // bounds a step's distinct experts, so it resolves at least the steps the hook run does on
    // the device (which ones depends on the trace: since the resolver fits distinct experts, not
    // rows, the mixtral fixture's trace has one such step more).
    EXPECT_GE(b->device_resolved, a->device_resolved) << name;
    EXPECT_EQ(a->host_syncs - b->host_syncs,
              std::uint64_t(L) * a->steps + (b->device_resolved - a->device_resolved))
        << name;
    if (mode != ExpertMode::kPaged) {
      EXPECT_EQ(b->host_syncs, b->steps) << name << ": one sync per step (the logits)";
      EXPECT_EQ(b->device_resolved, 0u) << name;
    }
    std::cout << "[serve_gpu] " << name << ": forced ahead = per-layer hook bits, host syncs "
              << a->host_syncs << " -> " << b->host_syncs << " over " << b->steps
              << " steps, layer calls resolved on the device " << a->device_resolved << " -> "
              << b->device_resolved << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ServeForcedRoutingCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"));

class ServeLinkPace : public CudaTest {};

TEST_F(ServeLinkPace, CopyStreamNeverFasterThanThePacedRate) {
  auto cuda_te = mem::cuda_transfer_engine(0);
  ASSERT_TRUE(cuda_te.ok()) << cuda_te.status().to_string();
  auto ss = mem::StreamSet::create(Device::kCuda, 0);
  ASSERT_TRUE(ss.ok()) << ss.status().to_string();
  const double gbps = 4.0;
  const std::size_t chunk = 4u << 20;
  auto te = LinkEngine::create(std::move(*cuda_te),
                               {.gbps = gbps, .chunk_bytes = chunk, .stream = &ss->h2d()});
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  const std::size_t n = 64u << 20;
  mem::MemoryBudget hb(mem::MemTier::kPinnedHost), db(mem::MemTier::kDevice);
  auto h = mem::Buffer::allocate(mem::MemTier::kPinnedHost, n, hb, {.what = "pace test"});
  auto d = mem::Buffer::allocate(mem::MemTier::kDevice, n, db, {.what = "pace test"});
  ASSERT_TRUE(h.ok() && d.ok());
  for (std::size_t i = 0; i < n; ++i) h->data()[i] = std::byte(i * 131 % 251);
  using Clock = std::chrono::steady_clock;
  // One big copy (16 chunks), host-timed: bytes / time <= the rate.
  const auto t0 = Clock::now();
  ASSERT_TRUE((*te)->h2d(d->data(), h->data(), n, ss->h2d()).ok());
  ASSERT_TRUE(ss->h2d().synchronize().ok());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = double(n) / s / 1e9;
  EXPECT_LE(rate, gbps) << "paced copy ran at " << rate << " GB/s";
  EXPECT_GE(rate, 0.5 * gbps) << "pacing far slower than asked";
  EXPECT_EQ((*te)->pace_stats().chunks, n / chunk);
  EXPECT_EQ((*te)->counters().h2d_bytes.load(), n);
  std::vector<std::byte> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), d->data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), h->data(), n), 0) << "paced copy corrupted the bytes";
  // Small copies after idle gaps (the stream was idle: no credit carried over), event-timed on
  // the stream: each takes at least bytes / rate.
  auto e0 = mem::Event::create(Device::kCuda, 0, true);
  auto e1 = mem::Event::create(Device::kCuda, 0, true);
  ASSERT_TRUE(e0.ok() && e1.ok());
  for (std::size_t bytes : {std::size_t(1) << 20, std::size_t(3) << 20, std::size_t(9437184)}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(e0->record(ss->h2d()).ok());
    ASSERT_TRUE((*te)->h2d(d->data(), h->data(), bytes, ss->h2d()).ok());
    ASSERT_TRUE(e1->record(ss->h2d()).ok());
    ASSERT_TRUE(e1->synchronize().ok());
    auto ms = mem::Event::elapsed_ms(*e0, *e1);
    ASSERT_TRUE(ms.ok());
    const double want_ms = double(bytes) / (gbps * 1e9) * 1e3;
    EXPECT_GE(*ms, want_ms * 0.999)
        << bytes << " B in " << *ms << " ms, paced minimum " << want_ms << " ms";
  }
  // Copies on another stream are not paced (step inputs ride the compute stream).
  const auto t1 = Clock::now();
  ASSERT_TRUE((*te)->h2d(d->data(), h->data(), n, ss->compute()).ok());
  ASSERT_TRUE(ss->compute().synchronize().ok());
  const double unpaced = double(n) / std::chrono::duration<double>(Clock::now() - t1).count() / 1e9;
  EXPECT_GT(unpaced, 2 * gbps) << "the unpaced stream was slowed too";
  std::cout << "[serve_gpu] link pacing at " << gbps << " GB/s: 64 MiB at " << rate
            << " GB/s; unpaced stream " << unpaced << " GB/s\n";
}

TEST_F(ServeLinkPace, PacedEngineGivesTheUnpacedBits) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const auto reqs = testing::mixed_requests(m.geometry.vocab);
  for (ExpertMode mode : {ExpertMode::kPaged, ExpertMode::kStatic}) {
    EngineConfig cfg = step_config(mode, m.geometry.top_k);
    auto plain = run_engine_with(m, cfg, cuda(), nullptr, reqs);
    cfg.link_pace_gbps = 2.0;
    cfg.link_pace_chunk_bytes = 64 << 10;
    auto paced = run_engine_with(m, cfg, cuda(), nullptr, reqs);
    ASSERT_TRUE(plain.ok() && paced.ok())
        << plain.status().to_string() << paced.status().to_string();
    expect_same_bits(paced->rec, plain->rec, std::string("paced ") + std::string(to_string(mode)));
    EXPECT_GT(paced->pace.copies, 0u);
    EXPECT_EQ(plain->pace.copies, 0u);
    std::cout << "[serve_gpu] qwen3_moe " << to_string(mode)
              << " paced at 2 GB/s: " << paced->pace.copies << " copies, " << paced->pace.bytes
              << " B, same bits\n";
  }
}

// The open question of the device-side miss path (docs/serve.md "Device-side slot resolution"):
// how fast a kernel reads the pinned host store through its mapped address, against the copy
// engine. Checks the bytes; prints the rates (no rate asserted: this is the measurement).
class ServeDeviceCopy : public CudaTest {};

TEST_F(ServeDeviceCopy, KernelReadsPinnedHostMemoryAndItsRateIsPrinted) {
  const std::size_t n = 9437184;  // one bf16 Qwen3-30B-A3B expert (3 x 768 x 2048 x 2 B)
  const int reps = 8;
  mem::MemoryBudget hb(mem::MemTier::kPinnedHost), db(mem::MemTier::kDevice);
  auto h = mem::Buffer::allocate(mem::MemTier::kPinnedHost, n * reps, hb, {.what = "copy test"});
  auto d = mem::Buffer::allocate(mem::MemTier::kDevice, n * reps, db, {.what = "copy test"});
  ASSERT_TRUE(h.ok() && d.ok());
  for (std::size_t i = 0; i < n * reps; ++i) h->data()[i] = std::byte((i * 7 + i / 4096) % 253);
  auto e0 = mem::Event::create(Device::kCuda, 0, true);
  auto e1 = mem::Event::create(Device::kCuda, 0, true);
  ASSERT_TRUE(e0.ok() && e1.ok());
  auto time_gbps = [&](auto&& enqueue) {
    EXPECT_TRUE(enqueue().ok());  // warm-up (mapping, module load)
    EXPECT_TRUE(e0->record(stream()).ok());
    EXPECT_TRUE(enqueue().ok());
    EXPECT_TRUE(e1->record(stream()).ok());
    EXPECT_TRUE(e1->synchronize().ok());
    auto ms = mem::Event::elapsed_ms(*e0, *e1);
    return ms.ok() && *ms > 0 ? double(n * reps) / (*ms * 1e-3) / 1e9 : 0.0;
  };
  const double ce = time_gbps([&] {
    for (int r = 0; r < reps; ++r) {
      if (cudaMemcpyAsync(d->data() + r * n, h->data() + r * n, n, cudaMemcpyHostToDevice,
                          static_cast<cudaStream_t>(stream().native())) != cudaSuccess) {
        return Status(internal_error("cudaMemcpyAsync failed"));
      }
    }
    return ok_status();
  });
  std::cout << "[serve_gpu] 8 x 9.4 MB pinned host -> GPU: copy engine " << ce << " GB/s\n";
  for (int blocks : {32, 132, 264, 528, 1056}) {
    ASSERT_EQ(cudaMemsetAsync(d->data(), 0, n * reps, raw_stream()), cudaSuccess);
    const double k = time_gbps([&] {
      for (int r = 0; r < reps; ++r) {
        FERRY_TRY(kernels::cuda::copy_from_host(d->data() + r * n, h->data() + r * n, n, blocks,
                                                stream()));
      }
      return ok_status();
    });
    std::vector<std::byte> back(n * reps);
    ASSERT_EQ(cudaMemcpy(back.data(), d->data(), back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), h->data(), back.size()), 0) << blocks << " blocks";
    std::cout << "[serve_gpu] same copy by a kernel of " << blocks << " x 256 threads: " << k
              << " GB/s\n";
  }
  EXPECT_FALSE(kernels::cuda::copy_from_host(d->data() + 1, h->data(), 16, 1, stream()).ok());
}

class ServeGraphsCuda : public CudaTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeGraphsCuda, ReplayedDecodeStepsGiveTheEagerBits) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const bool moe = m.geometry.experts > 0;
  // Three concurrent sequences (mixed prefill chunks and decodes, then decode-only steps of 3, 2
  // and 1 tokens), and one long single-stream decode (the bench's shape).
  std::vector<std::vector<GenerationRequest>> workloads = {
      testing::mixed_requests(m.geometry.vocab)};
  GenerationRequest one;
  for (int i = 0; i < 9; ++i) one.prompt.push_back((i * 29 + 3) % m.geometry.vocab);
  one.max_new_tokens = 24;
  workloads.push_back({one});
  std::vector<std::pair<ExpertMode, DType>> modes = {{ExpertMode::kResident, DType::kF32}};
  if (moe) {
    modes.push_back({ExpertMode::kStatic, DType::kF32});
    modes.push_back({ExpertMode::kResident, DType::kBF16});
    modes.push_back({ExpertMode::kStatic, DType::kBF16});
  }
  for (std::size_t w = 0; w < workloads.size(); ++w) {
    const RoutingTrace trace = moe ? varied_cuda_trace(m, cuda(), workloads[w]) : RoutingTrace{};
    for (const auto& [mode, dt] : modes) {
      for (bool forced : {false, true}) {
        if (forced && !moe) continue;
        const std::string name =
            fmt::format("{} workload {} {} {}{}", GetParam(), w, to_string(mode), to_string(dt),
                        forced ? " forced routing" : "");
        TraceReplayer rep_a(trace, false), rep_b(trace, false);
        auto eager = run_engine_with(m, step_config(mode, 0, dt, false), cuda(),
                                     forced ? &rep_a : nullptr, workloads[w]);
        auto graph = run_engine_with(m, step_config(mode, 0, dt, true), cuda(),
                                     forced ? &rep_b : nullptr, workloads[w]);
        ASSERT_TRUE(eager.ok()) << name << ": " << eager.status().to_string();
        ASSERT_TRUE(graph.ok()) << name << ": " << graph.status().to_string();
        expect_same_bits(graph->rec, eager->rec, name + " graph vs eager");
        const GraphStats& g = graph->graphs;
        EXPECT_EQ(g.disabled_reason, "") << name;
        // Workload 0 has few decode-only steps per shape (3, 2 and 1 sequences: about 1 replay);
        // the 24-token decode replays all but its first two decode steps.
        if (w == 1) {
          EXPECT_GE(g.replays, 15u) << name << ": decode steps were not replayed";
        } else {
          EXPECT_GT(g.captures + g.replays, 0u) << name << ": no decode step ran as a graph";
        }
        EXPECT_EQ(eager->graphs.eligible_steps, 0u) << name;
        EXPECT_EQ(g.warmup_steps + g.captures + g.replays, g.eligible_steps) << name;
        ASSERT_EQ(graph->steps, eager->steps) << name;
        EXPECT_EQ(graph->host_syncs, graph->steps) << name << ": one sync per step";
        // What replays moved is counted as if each step ran eagerly: the same logits read-back,
        // logits-row copies, static bulk bytes and expert rows; step inputs are larger (graph
        // steps pad the block tables to the pool's capacity).
        EXPECT_EQ(graph->d2h, eager->d2h) << name;
        EXPECT_EQ(graph->d2d, eager->d2d) << name;
        EXPECT_EQ(graph->static_bytes, eager->static_bytes) << name;
        EXPECT_EQ(graph->expert_rows, eager->expert_rows) << name;
        EXPECT_GE(graph->h2d, eager->h2d) << name;
        std::cout << "[serve_gpu] " << name << ": graph bits = eager bits; " << g.captures
                  << " captured, " << g.replays << " replays, " << g.warmup_steps << " warm-up of "
                  << graph->steps << " steps\n";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeGraphsCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe", "qwen3"));

class ServeGraphsCudaOff : public CudaTest {};

TEST_F(ServeGraphsCudaOff, PagedStepsPerLayerHooksAndTheFlagStayEager) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const auto reqs = testing::mixed_requests(m.geometry.vocab);
  // Paged on the host path (device slot resolution off: serve_device_resolve_gpu_test.cpp covers
  // paged decode steps as graphs).
  EngineConfig host_paged = step_config(ExpertMode::kPaged, m.geometry.top_k);
  host_paged.pager.device_resolve = false;
  auto paged = run_engine_with(m, host_paged, cuda(), nullptr, reqs);
  ASSERT_TRUE(paged.ok()) << paged.status().to_string();
  EXPECT_EQ(paged->graphs.eligible_steps, 0u) << "paged waits on routed ids: never a graph";
  auto off = run_engine_with(m, step_config(ExpertMode::kResident, 0, DType::kF32, false), cuda(),
                             nullptr, reqs);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->graphs.eligible_steps + off->graphs.captures + off->graphs.replays, 0u);
  // A per-layer routing hook waits on the host inside the step: no graph either.
  testing::PerLayerReplayer per_layer(varied_cuda_trace(m, cuda(), reqs), false);
  auto hooked = run_engine_with(m, step_config(ExpertMode::kResident, 0), cuda(), &per_layer, reqs);
  ASSERT_TRUE(hooked.ok());
  EXPECT_EQ(hooked->graphs.eligible_steps, 0u);
}

}  // namespace
}  // namespace ferry::serve
