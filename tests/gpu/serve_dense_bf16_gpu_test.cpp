// SPDX-License-Identifier: Apache-2.0
// bf16 dense weights on CUDA (EngineConfig::dense_dtype, docs/serve.md "bf16 dense weights"):
//   - kernels: the small-m GEMM's bf16 twin gives the bits of the backend's f32 GEMM (its small-m
//     kernel) on the widened weight, for m = 1..4 over swept n, k and leading dimensions (vector
//     and scalar paths), with and without bias, alpha, beta; widen_bf16 and embedding_bf16 are
//     exact (an id outside the table gives zeros);
//   - engines on the HF fixtures (Qwen3-MoE, dense Qwen3, dense Qwen2 with tied embeddings,
//     Mixtral): the CUDA engine with bf16 dense weights gives the CUDA f32 engine's token ids and
//     logits bits on the dense weights rounded to bf16, with 3 concurrent requests mixing prefill
//     chunks (widened weight + cuBLASLt) and decodes (small-m twin; CUDA graphs on), and with 6
//     (more than 4 sampled rows: the lm_head through the widening workspace); within the golden
//     1e-4 of the CPU engine with bf16 dense weights; every expert mode (static, paged at caps
//     top-k..E, overlapped and serial copies, bf16 experts too) equals bf16-dense resident;
//   - budget: the dense weights' device bytes fall by the linear weights' half, and the device
//     peak with them.
// Skips, saying so, without a CUDA device.
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "kernels/cuda/serve_kernels.h"
#include "serve/dense_weights.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using ferry::testing::device_copy;
using ferry::testing::host_copy;

TensorView rows(void* p, DType dt, std::int64_t r, std::int64_t c, std::int64_t ld) {
  TensorView v = TensorView::contiguous(p, dt, Device::kCuda, {r, c});
  v.stride[0] = ld;
  return v;
}

class ServeDenseBf16Kernels : public CudaTest {};

TEST_F(ServeDenseBf16Kernels, SmallMTwinEqualsTheF32GemmOnWidenedWeights) {
  struct Shape {
    std::int64_t n, k, pad;  // pad: extra elements per row of a, b and out
  };
  const std::vector<Shape> shapes = {{1, 1, 0},     {7, 13, 0},     {33, 64, 0},  {8, 4, 4},
                                     {130, 768, 0}, {256, 2048, 0}, {64, 96, 4},  {5, 4099, 0},
                                     {17, 100, 1},  {512, 128, 8},  {3, 4096, 0}, {40, 36, 3}};
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int cases = 0;
  for (const Shape& sh : shapes) {
    for (std::int64_t m = 1; m <= 4; ++m) {
      for (int variant = 0; variant < 3; ++variant) {
        // 0: plain; 1: bias; 2: bias, alpha 0.5, beta 0.75 on a prefilled out.
        const bool bias = variant > 0;
        const float alpha = variant == 2 ? 0.5f : 1.0f, beta = variant == 2 ? 0.75f : 0.0f;
        const std::int64_t n = sh.n, k = sh.k, lda = k + sh.pad, ldb = k + sh.pad, ldo = n + sh.pad;
        std::vector<float> a(static_cast<std::size_t>(m * lda));
        std::vector<float> wf(static_cast<std::size_t>(n * ldb));
        std::vector<float> bs(static_cast<std::size_t>(n));
        std::vector<float> o0(static_cast<std::size_t>(m * ldo));
        std::vector<std::uint16_t> wb(wf.size());
        for (float& x : a) x = nd(rng);
        for (std::size_t i = 0; i < wf.size(); ++i) {
          wb[i] = f32_to_bf16(nd(rng) * 0.1f);
          wf[i] = bf16_to_f32(wb[i]);
        }
        for (float& x : bs) x = nd(rng);
        for (float& x : o0) x = nd(rng);
        float* d_a = device_copy(a);
        float* d_wf = device_copy(wf);
        std::uint16_t* d_wb = device_copy(wb);
        float* d_bias = device_copy(bs);
        float* d_of = device_copy(o0);
        float* d_ob = device_copy(o0);
        const std::string what =
            fmt::format("m {} n {} k {} pad {} variant {}", m, n, k, sh.pad, variant);
        const Status f = cuda().gemm(
            {.out = rows(d_of, DType::kF32, m, n, ldo),
             .a = rows(d_a, DType::kF32, m, k, lda),
             .b = rows(d_wf, DType::kF32, n, k, ldb),
             .bias = bias ? ConstTensorView::contiguous(d_bias, DType::kF32, Device::kCuda, {n})
                          : ConstTensorView{},
             .trans_b = true,
             .alpha = alpha,
             .beta = beta},
            stream());
        ASSERT_TRUE(f.ok()) << what << ": " << f.to_string();
        const Status b = kernels::cuda::small_m_gemm_bf16w({.out = d_ob,
                                                            .a = d_a,
                                                            .b = d_wb,
                                                            .bias = bias ? d_bias : nullptr,
                                                            .m = m,
                                                            .n = n,
                                                            .k = k,
                                                            .lda = lda,
                                                            .ldb = ldb,
                                                            .ldo = ldo,
                                                            .alpha = alpha,
                                                            .beta = beta},
                                                           stream());
        ASSERT_TRUE(b.ok()) << what << ": " << b.to_string();
        sync();
        const std::vector<float> gf = host_copy(d_of, o0.size()), gb = host_copy(d_ob, o0.size());
        EXPECT_EQ(std::memcmp(gf.data(), gb.data(), gf.size() * 4), 0)
            << what << ": the bf16 twin differs from the f32 GEMM on the widened weight";
        // Not garbage: row 0, column 0 against an f64 dot product.
        double want = 0;
        for (std::int64_t q = 0; q < k; ++q) want += double(a[std::size_t(q)]) * wf[std::size_t(q)];
        want = alpha * want + (bias ? bs[0] : 0.0) + beta * o0[0];
        EXPECT_NEAR(gb[0], want, 1e-3 * (1 + std::fabs(want))) << what;
        for (void* p :
             {static_cast<void*>(d_a), static_cast<void*>(d_wf), static_cast<void*>(d_wb),
              static_cast<void*>(d_bias), static_cast<void*>(d_of), static_cast<void*>(d_ob)}) {
          cudaFree(p);
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, int(shapes.size()) * 4 * 3);
  // m outside 1..4 is refused, not launched.
  EXPECT_FALSE(kernels::cuda::small_m_gemm_bf16w({.m = 5, .n = 1, .k = 1}, stream()).ok());
}

TEST_F(ServeDenseBf16Kernels, WidenAndEmbeddingAreExact) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const std::int64_t V = 37, C = 300;
  std::vector<std::uint16_t> table(std::size_t(V * C));
  for (auto& w : table) w = f32_to_bf16(nd(rng));
  table[5] = 0x7f80;  // +inf
  table[6] = 0x8000;  // -0
  std::uint16_t* d_t = device_copy(table);
  std::vector<float> ws(table.size(), -1.0f);
  float* d_ws = device_copy(ws);
  ASSERT_TRUE(kernels::cuda::widen_bf16(d_ws, d_t, V * C, stream()).ok());
  const std::vector<std::int32_t> ids = {3, 0, 36, -1, 37, 3};
  std::int32_t* d_ids = device_copy(ids);
  std::vector<float> x(ids.size() * std::size_t(C), -1.0f);
  float* d_x = device_copy(x);
  ASSERT_TRUE(
      kernels::cuda::embedding_bf16(d_x, d_t, d_ids, std::int64_t(ids.size()), C, V, stream())
          .ok());
  sync();
  const std::vector<float> gw = host_copy(d_ws, ws.size()), gx = host_copy(d_x, x.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const float want = bf16_to_f32(table[i]);
    ASSERT_EQ(std::memcmp(&gw[i], &want, 4), 0) << i;
  }
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      const float want =
          ids[t] >= 0 && ids[t] < V ? bf16_to_f32(table[std::size_t(ids[t] * C + c)]) : 0.0f;
      ASSERT_EQ(std::memcmp(&gx[t * std::size_t(C) + std::size_t(c)], &want, 4), 0)
          << t << " " << c;
    }
  }
  for (void* p : {static_cast<void*>(d_t), static_cast<void*>(d_ws), static_cast<void*>(d_ids),
                  static_cast<void*>(d_x)}) {
    cudaFree(p);
  }
}

// ---- Whole engines on the HF fixtures. ----

EngineConfig config(ExpertMode mode, int cap, DType dense, int running = 3, bool overlap = true,
                    DType experts = DType::kF32) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = cap;
  cfg.pager.overlap_misses = overlap;
  cfg.pager.expert_dtype = experts;
  cfg.dense_dtype = dense;
  cfg.max_batch_tokens = 4 * running;  // prompts in chunks, mixed with other requests' decodes
  cfg.max_running = running;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 2 << 20};
  return cfg;
}

// mixed_requests, or those and three more greedy ones (6 concurrent: up to 6 sampled rows).
std::vector<GenerationRequest> requests(int vocab, int n) {
  std::vector<GenerationRequest> r = testing::mixed_requests(vocab);
  for (int j = 3; j < n; ++j) {
    GenerationRequest q;
    for (int i = 0; i < 5 + 2 * j; ++i) q.prompt.push_back((i * 29 + 13 * j) % vocab);
    q.max_new_tokens = 8;
    r.push_back(std::move(q));
  }
  return r;
}

struct Ran {
  testing::RunRecord rec;
  std::size_t weight_bytes = 0, peak = 0;
  std::uint64_t misses = 0, graph_replays = 0;
};

Result<Ran> run_on(const model::LoadedModel& m, const model::ModelParams& params,
                   const EngineConfig& cfg, kernels::Backend& be) {
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, params, cfg, be));
  Ran r;
  FERRY_ASSIGN_OR_RETURN(r.rec,
                         testing::run_engine(*eng, requests(m.geometry.vocab, cfg.max_running)));
  r.weight_bytes = eng->device_weight_bytes();
  r.peak = eng->device_budget().bytes_peak();
  if (eng->experts().pager() != nullptr) r.misses = eng->experts().pager()->counters().misses;
  r.graph_replays = eng->graph_stats().replays;
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

class ServeDenseBf16Cuda : public CudaTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeDenseBf16Cuda, EqualsTheF32EngineOnRoundedWeightsBitForBit) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const auto rounded = testing::round_dense_to_bf16(m.params);
  for (int running : {3, 6}) {
    const std::string what = fmt::format("{} bf16 dense, {} concurrent", GetParam(), running);
    auto want =
        run_on(m, rounded->params, config(ExpertMode::kResident, 0, DType::kF32, running), cuda());
    ASSERT_TRUE(want.ok()) << what << ": " << want.status().to_string();
    auto got = run_on(m, m.params, config(ExpertMode::kResident, 0, DType::kBF16, running), cuda());
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().to_string();
    ASSERT_EQ(got->rec.logits.size(), std::size_t(running)) << what;
    testing::expect_same_bits(got->rec, want->rec, what);
    EXPECT_GT(got->graph_replays, 0u) << what << ": no decode step ran as a graph";
    // The dense weights' device bytes: the linear weights' half (up to slot padding) less.
    const std::size_t saved =
        dense_weight_bytes(m.params, DType::kF32) - dense_weight_bytes(m.params, DType::kBF16);
    EXPECT_LT(got->weight_bytes, want->weight_bytes) << what;
    EXPECT_LE(want->weight_bytes - got->weight_bytes, saved + 256 * 64) << what;
    EXPECT_GE(want->weight_bytes - got->weight_bytes + 256 * 64, saved) << what;
    EXPECT_LT(got->peak, want->peak) << what;
    std::cout << "[serve_dense_bf16] " << what << ": same ids and logits bits as f32 on rounded "
              << "weights; dense device bytes " << got->weight_bytes << " vs " << want->weight_bytes
              << ", peak " << got->peak << " vs " << want->peak << "\n";
  }
  // The CPU engine with bf16 dense weights (the same f32 arithmetic on the widened weights, CPU
  // order): the golden tolerance, greedy tokens equal.
  auto gpu = run_on(m, m.params, config(ExpertMode::kResident, 0, DType::kBF16), cuda());
  auto cpu =
      run_on(m, m.params, config(ExpertMode::kResident, 0, DType::kBF16), kernels::cpu_backend());
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  double worst = 0;
  for (const auto& [id, rows] : cpu->rec.logits) {
    const auto& g = gpu->rec.logits.at(id);
    for (std::size_t i = 0; i < std::min(g.size(), rows.size()); ++i) {
      worst = std::max(worst, rel_max(g[i], rows[i]));
    }
  }
  for (RequestId id : {RequestId(0), RequestId(1)}) {
    EXPECT_EQ(gpu->rec.tokens.at(id), cpu->rec.tokens.at(id)) << GetParam() << " request " << id;
  }
  EXPECT_LE(worst, 1e-4) << GetParam();
  std::cout << "[serve_dense_bf16] " << GetParam() << " cuda vs cpu, bf16 dense: " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeDenseBf16Cuda,
                         ::testing::Values("qwen3_moe", "qwen3", "qwen2", "mixtral"));

class ServeDenseBf16ModesCuda : public CudaTest,
                                public ::testing::WithParamInterface<const char*> {};

TEST_P(ServeDenseBf16ModesCuda, EveryModeGivesBf16DenseResidentsBits) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts;
  for (DType experts : {DType::kF32, DType::kBF16}) {
    auto ref = run_on(m, m.params, config(ExpertMode::kResident, 0, DType::kBF16, 3, true, experts),
                      cuda());
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    struct V {
      ExpertMode mode;
      int cap;
      bool overlap;
    };
    const std::vector<V> variants = {{ExpertMode::kStatic, 0, true},
                                     {ExpertMode::kPaged, K, true},
                                     {ExpertMode::kPaged, K + 1, false},
                                     {ExpertMode::kPaged, E, true}};
    for (const V& v : variants) {
      const std::string name =
          fmt::format("{} bf16 dense, {} experts, {} cap {}{}", GetParam(), to_string(experts),
                      to_string(v.mode), v.cap, v.overlap ? "" : " serial copies");
      auto got =
          run_on(m, m.params, config(v.mode, v.cap, DType::kBF16, 3, v.overlap, experts), cuda());
      ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
      testing::expect_same_bits(got->rec, ref->rec, name);
      if (v.mode == ExpertMode::kPaged && v.cap < E) {
        EXPECT_GT(got->misses, 0u) << name;
      }
      std::cout << "[serve_dense_bf16] " << name << ": same ids and logits bits as resident ("
                << got->misses << " misses)\n";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ServeDenseBf16ModesCuda,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"));

}  // namespace
}  // namespace ferry::serve
