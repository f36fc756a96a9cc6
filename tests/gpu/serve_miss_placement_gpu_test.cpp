// SPDX-License-Identifier: Apache-2.0
// Paged miss placement on the CUDA engine (PagerConfig::miss_cost_model / bypass_window; issue
// #5; docs/serve.md "Miss placement"): a miss is copied into a slot or computed on the CPU from
// the pinned host store while the GPU copies the other misses and runs the slot rows.
//   - ServeMissPlacementRows.*: one MoE layer call of an ExpertExecutor on CUDA (f32 and bf16
//     experts, fresh pager so every expert misses): with the cost model set so that a 1-row miss
//     is cheaper on the CPU and a 2-row one is not, exactly the experts with one row are
//     computed on the host (cpu_misses) and the others copied (pager misses); the copied rows
//     equal an all-slot executor's rows bit for bit; the host rows keep style.md's rule against
//     an f64 loop (err <= 2 x a naive f32 loop's + 1e-6); a second call adds hits (their rows
//     bit-equal too) beside new host rows.
//   - MoeFixtures/ServeMissPlacementCuda.*: whole engines on the Qwen3-MoE, Mixtral and OLMoE
//     fixtures, 3 concurrent requests (prefill chunks beside decodes): the cost model forcing
//     every miss to a copy gives resident's token ids and logits bits (no host-computed miss);
//     the mixed cost model (host misses > 0 and copies > 0, counted), bypass admission (bypassed
//     > 0, copies > 0) and everything on the host (no copy at all) give resident's greedy ids and
//     logits within the golden 1e-4 (max err / max |ref|, the cpu-experts rule), also with the
//     exact CPU kernel, serial miss copies and bf16 experts (against bf16 resident).
// Skips, saying so, without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "serve/engine.h"
#include "serve/expert_executor.h"
#include "serve/sampler.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using ferry::testing::DeviceBuf;
using ferry::testing::down;
using ferry::testing::up;

// The cost model's CPU rate at which a miss of one row is cheaper on the CPU and one of two rows
// is not, for link_gbps = 1: r * 6CF / g < 3CF * elem / 1  <=>  r < g * elem / 2; g = 3 / elem
// puts the threshold at r < 1.5.
PagerConfig one_row_misses_to_host(DType expert_dtype) {
  return {.miss_cost_model = true,
          .link_gbps = 1,
          .cpu_gflops = 3.0 / double(dtype_size(expert_dtype))};
}

float weight(const void* m, DType dt, std::size_t i) {
  return dt == DType::kBF16 ? bf16_to_f32(static_cast<const std::uint16_t*>(m)[i])
                            : static_cast<const float*>(m)[i];
}

// out[C] of one row in f64, and in a naive f32 loop (products rounded to f32 before each add:
// volatile keeps FMA contraction out, whatever the build's -march).
void expert_row_f64(const ExpertRef& w, const float* x, std::int64_t C, std::int64_t F,
                    double* out) {
  std::vector<double> h(static_cast<std::size_t>(F));
  for (std::int64_t f = 0; f < F; ++f) {
    double g = 0, u = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      g += double(weight(w.gate, w.dtype, std::size_t(f * C + c))) * x[c];
      u += double(weight(w.up, w.dtype, std::size_t(f * C + c))) * x[c];
    }
    h[std::size_t(f)] = g / (1.0 + std::exp(-g)) * u;
  }
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (std::int64_t f = 0; f < F; ++f) {
      s += double(weight(w.down, w.dtype, std::size_t(c * F + f))) * h[std::size_t(f)];
    }
    out[c] = s;
  }
}

void expert_row_naive(const ExpertRef& w, const float* x, std::int64_t C, std::int64_t F,
                      float* out) {
  std::vector<float> h(static_cast<std::size_t>(F));
  for (std::int64_t f = 0; f < F; ++f) {
    float g = 0, u = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      volatile float pg = weight(w.gate, w.dtype, std::size_t(f * C + c)) * x[c];
      volatile float pu = weight(w.up, w.dtype, std::size_t(f * C + c)) * x[c];
      g += pg;
      u += pu;
    }
    h[std::size_t(f)] = g / (1.0f + std::exp(-g)) * u;
  }
  for (std::int64_t c = 0; c < C; ++c) {
    float s = 0;
    for (std::int64_t f = 0; f < F; ++f) {
      volatile float p = weight(w.down, w.dtype, std::size_t(c * F + f)) * h[std::size_t(f)];
      s += p;
    }
    out[c] = s;
  }
}

class ServeMissPlacementRows : public CudaTest, public ::testing::WithParamInterface<DType> {};

TEST_P(ServeMissPlacementRows, OneRowMissesOnTheHostCopiedRowsKeepTheirBits) {
  const DType dt = GetParam();
  const testing::Fixture fx = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(fx.model);
  const model::DecoderGeometry& geo = fx.model->geometry;
  const int E = geo.experts, K = geo.top_k;
  const std::int64_t C = geo.hidden, F = geo.expert_width, T = 5;
  int layer = 0;
  while (!geo.layer_is_moe[std::size_t(layer)]) ++layer;
  auto cuda_te = mem::cuda_transfer_engine(0);
  ASSERT_TRUE(cuda_te.ok()) << cuda_te.status().to_string();
  auto ss = mem::StreamSet::create(Device::kCuda, 0);
  ASSERT_TRUE(ss.ok()) << ss.status().to_string();
  const ExpertDevice dev{
      .te = cuda_te->get(), .compute = &ss->compute(), .copy = &ss->h2d(), .max_tokens = T};
  PagerConfig all_slots{.mode = ExpertMode::kPaged, .slots_per_layer = E, .expert_dtype = dt};
  PagerConfig placed = one_row_misses_to_host(dt);
  placed.mode = ExpertMode::kPaged;
  placed.slots_per_layer = E;  // no eviction, no split: each expert's rows decide alone
  placed.expert_dtype = dt;
  placed.device_resolve = false;
  auto ref_x = ExpertExecutor::create(geo, fx.model->params, all_slots, nullptr, &dev);
  ASSERT_TRUE(ref_x.ok()) << ref_x.status().to_string();
  auto got_x = ExpertExecutor::create(geo, fx.model->params, placed, nullptr, &dev);
  ASSERT_TRUE(got_x.ok()) << got_x.status().to_string();
  ExpertExecutor& ref = **ref_x;
  ExpertExecutor& got = **got_x;

  DeviceBuf d_x(std::size_t(T * C) * 4), d_ids(std::size_t(T * K) * 4),
      d_act(std::size_t(T * K * F) * 4), d_ref(std::size_t(T * K * C) * 4),
      d_got(std::size_t(T * K * C) * 4);
  std::set<int> resident;  // experts the placed pager holds in slots (copied by an earlier call)
  int host_rows_total = 0, copied_rows_total = 0, hit_rows_total = 0;
  for (std::uint64_t call = 0; call < 2; ++call) {
    // Routing with some experts on one row and some on several (seeded; the first seed that
    // gives both is taken, so the test is deterministic).
    std::vector<std::int32_t> ids;
    std::vector<int> rows_of(std::size_t(E), 0);
    for (std::uint64_t seed = 1 + call * 1000;; ++seed) {
      Rng rng(seed);
      ids.clear();
      std::fill(rows_of.begin(), rows_of.end(), 0);
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<int> perm(static_cast<std::size_t>(E));
        for (int e = 0; e < E; ++e) perm[std::size_t(e)] = e;
        for (int k = 0; k < K; ++k) {
          const int j = k + int(rng.next() % std::uint64_t(E - k));
          std::swap(perm[std::size_t(k)], perm[std::size_t(j)]);
          ids.push_back(perm[std::size_t(k)]);
          ++rows_of[std::size_t(perm[std::size_t(k)])];
        }
      }
      int one = 0, several = 0;
      for (int e = 0; e < E; ++e) {
        if (resident.count(e)) continue;
        one += rows_of[std::size_t(e)] == 1;
        several += rows_of[std::size_t(e)] >= 2;
      }
      if (one > 0 && several > 0) break;
    }
    std::vector<float> x(std::size_t(T * C));
    Rng xr(call + 77);
    for (float& v : x) v = float(xr.uniform()) * 2.0f - 1.0f;
    up(d_x.p, x);
    up(d_ids.p, ids);
    ASSERT_EQ(cudaMemsetAsync(d_got.p, 0xff, std::size_t(T * K * C) * 4,
                              static_cast<cudaStream_t>(ss->compute().native())),
              cudaSuccess);
    const std::uint64_t host0 = got.counters().cpu_misses;
    const std::uint64_t miss0 = got.pager()->counters().misses;
    const std::uint64_t hit0 = got.pager()->counters().hits;
    ASSERT_TRUE(ref.run_device(layer, d_x.as<float>(), d_ids.as<std::int32_t>(), T,
                               d_act.as<float>(), d_ref.as<float>())
                    .ok());
    ASSERT_TRUE(ss->compute().synchronize().ok());
    const Status st = got.run_device(layer, d_x.as<float>(), d_ids.as<std::int32_t>(), T,
                                     d_act.as<float>(), d_got.as<float>());
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(ss->compute().synchronize().ok());
    const std::vector<float> want = down<float>(d_ref.p, std::size_t(T * K * C));
    const std::vector<float> have = down<float>(d_got.p, std::size_t(T * K * C));

    // Which experts the rule sends where (every expert of the call is new or resident).
    std::set<int> host, copied, hit;
    for (int e = 0; e < E; ++e) {
      if (rows_of[std::size_t(e)] == 0) continue;
      if (resident.count(e)) {
        hit.insert(e);
      } else if (rows_of[std::size_t(e)] == 1) {
        host.insert(e);
      } else {
        copied.insert(e);
      }
    }
    EXPECT_EQ(got.counters().cpu_misses - host0, host.size()) << "call " << call;
    EXPECT_EQ(got.pager()->counters().misses - miss0, copied.size()) << "call " << call;
    EXPECT_EQ(got.pager()->counters().hits - hit0, hit.size()) << "call " << call;
    std::vector<double> f64(static_cast<std::size_t>(C));
    std::vector<float> naive(static_cast<std::size_t>(C));
    double err = 0, err_naive = 0;
    for (std::int64_t i = 0; i < T * K; ++i) {
      const int e = ids[std::size_t(i)];
      const float* g = have.data() + i * C;
      const float* w = want.data() + i * C;
      if (!host.count(e)) {  // a slot row: the same kernel on the same bits
        EXPECT_EQ(std::memcmp(g, w, std::size_t(C) * 4), 0)
            << "call " << call << " row " << i << " expert " << e
            << (hit.count(e) ? " (hit)" : " (copied)");
        (hit.count(e) ? hit_rows_total : copied_rows_total) += 1;
        continue;
      }
      ++host_rows_total;
      const ExpertRef wr = got.store()->ref(layer, e);
      expert_row_f64(wr, x.data() + (i / K) * C, C, F, f64.data());
      expert_row_naive(wr, x.data() + (i / K) * C, C, F, naive.data());
      for (std::int64_t c = 0; c < C; ++c) {
        err = std::max(err, std::fabs(double(g[c]) - f64[std::size_t(c)]));
        err_naive =
            std::max(err_naive, std::fabs(double(naive[std::size_t(c)]) - f64[std::size_t(c)]));
      }
    }
    EXPECT_LE(err, 2 * err_naive + 1e-6) << "call " << call << " host rows";
    std::cout << "[serve_gpu] miss placement rows (" << to_string(dt) << ", call " << call
              << "): " << host.size() << " experts on the host (err " << err << ", naive f32 "
              << err_naive << "), " << copied.size() << " copied, " << hit.size() << " hits\n";
    resident.insert(copied.begin(), copied.end());
  }
  EXPECT_GT(host_rows_total, 0);
  EXPECT_GT(copied_rows_total, 0);
  EXPECT_GT(hit_rows_total, 0) << "the second call had no hit (resident set empty?)";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ServeMissPlacementRows,
                         ::testing::Values(DType::kF32, DType::kBF16));

// ---- Whole engines on the fixtures. ----

struct Counted {
  testing::RunRecord record;
  ExecutorCounters executor;
  PagerCounters pager;
};

Result<Counted> run_cuda(const model::LoadedModel& m, kernels::Backend& be, ExpertMode mode,
                         const PagerConfig& placement, DType dt, int cap, bool overlap = true,
                         CpuExpertKernel kernel = CpuExpertKernel::kDefault) {
  EngineConfig cfg;
  cfg.pager = placement;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = mode == ExpertMode::kPaged ? cap : 0;
  cfg.pager.expert_dtype = dt;
  cfg.pager.overlap_misses = overlap;
  cfg.pager.cpu_expert_kernel = kernel;
  cfg.max_batch_tokens = 8;  // prompt chunks beside the other requests' decodes
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg, be));
  Counted r;
  FERRY_ASSIGN_OR_RETURN(r.record,
                         testing::run_engine(*eng, testing::mixed_requests(m.geometry.vocab)));
  r.executor = eng->experts().counters();
  if (eng->experts().pager() != nullptr) r.pager = eng->experts().pager()->counters();
  return r;
}

double rel_max(const std::vector<float>& got, const std::vector<float>& ref) {
  double mx = 0, err = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    mx = std::max(mx, std::fabs(double(ref[i])));
    err = std::max(err, std::fabs(double(got[i]) - ref[i]));
  }
  return mx > 0 ? err / mx : err;
}

class ServeMissPlacementCuda : public CudaTest,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeMissPlacementCuda, CopiedMissesKeepBitsHostMissesWithinTol) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k;
  const int cap = K + 1;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto ref = run_cuda(m, cuda(), ExpertMode::kResident, {}, dt, 0);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();

    // The cost model on, every miss cheaper to copy: resident's bits, nothing on the host.
    const PagerConfig copy_all{.miss_cost_model = true, .link_gbps = 1e6, .cpu_gflops = 1e-6};
    auto copied = run_cuda(m, cuda(), ExpertMode::kPaged, copy_all, dt, cap);
    const std::string cname =
        fmt::format("{} {} cost model, all copied", GetParam(), to_string(dt));
    ASSERT_TRUE(copied.ok()) << cname << ": " << copied.status().to_string();
    EXPECT_EQ(copied->executor.cpu_misses + copied->executor.bypassed, 0u) << cname;
    EXPECT_GT(copied->pager.misses, 0u) << cname << ": no miss (identity vacuous)";
    testing::expect_same_bits(copied->record, ref->record, cname);

    struct V {
      std::string name;
      PagerConfig placement;
      bool overlap = true;
      CpuExpertKernel kernel = CpuExpertKernel::kDefault;
      bool want_copies = true;  // some misses still copied
    };
    PagerConfig all_host{.miss_cost_model = true, .link_gbps = 1e-6, .cpu_gflops = 1e6};
    std::vector<V> variants = {
        {"cost model, 1-row misses on the host", one_row_misses_to_host(dt)},
        {"cost model, exact CPU kernel", one_row_misses_to_host(dt), true, CpuExpertKernel::kExact},
        {"cost model, serial miss copies", one_row_misses_to_host(dt), false},
        {"bypass window 1", PagerConfig{.bypass_window = 1}},
        {"every miss on the host", all_host, true, CpuExpertKernel::kDefault, false},
    };
    for (const V& v : variants) {
      const std::string name = fmt::format("{} {} {}", GetParam(), to_string(dt), v.name);
      auto got = run_cuda(m, cuda(), ExpertMode::kPaged, v.placement, dt, cap, v.overlap, v.kernel);
      ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
      const std::uint64_t host = got->executor.cpu_misses + got->executor.bypassed;
      EXPECT_GT(host, 0u) << name << ": no miss computed on the host";
      if (v.placement.bypass_window > 0) {
        EXPECT_GT(got->executor.bypassed, 0u) << name;
      }
      if (v.want_copies) {
        EXPECT_GT(got->pager.misses, 0u) << name << ": nothing copied";
      } else {
        EXPECT_EQ(got->pager.misses, 0u) << name;
        EXPECT_EQ(got->pager.bytes_copied, 0u) << name;
      }
      double worst = 0;
      for (const auto& [id, rows] : ref->record.logits) {
        const auto& g = got->record.logits.at(id);
        ASSERT_EQ(g.size(), rows.size()) << name;
        for (std::size_t i = 0; i < rows.size(); ++i)
          worst = std::max(worst, rel_max(g[i], rows[i]));
      }
      EXPECT_LE(worst, 1e-4) << name;
      for (RequestId id : {RequestId(0), RequestId(1)}) {  // the greedy requests
        EXPECT_EQ(got->record.tokens.at(id), ref->record.tokens.at(id))
            << name << " request " << id;
      }
      std::cout << "[serve_gpu] " << name << ": " << host << " misses on the host, "
                << got->pager.misses << " copied; logits vs resident " << worst << "\n";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ServeMissPlacementCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"));

}  // namespace
}  // namespace ferry::serve
