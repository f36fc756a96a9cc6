// SPDX-License-Identifier: Apache-2.0
// The fast CPU expert FFN (expert_ffn_fast.h) against its slow twins:
//   - style.md's rule (a): err(fast) <= 2 * err(naive sequential f32 loop) + 1e-6, both against an
//     f64 loop on the same weights, for f32 and bf16 weights, every ISA this CPU has, shapes
//     C/F = 2048/768 (Qwen3-30B-A3B), 2053/771 and 96/40, 1..8 tokens over several experts;
//   - bitwise independence of the thread count (1 and 6 threads), of the other rows of the step
//     (a row computed alone gives the same bits) and of the rows' order;
//   - the scalar ISA is expert_ffn_row's arithmetic bit for bit;
//   - rows not asked for are not written;
//   - the executor's choice (PagerConfig::cpu_expert_kernel) and the flag's parsing.
#include "serve/expert_ffn_fast.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

using kernels::cpu::Isa;

// E experts' weights of one shape, in f32 or bf16 (bf16: the f32 copy holds the widened bits, so
// the references see exactly the weights the kernels read).
struct Weights {
  std::int64_t C = 0, F = 0;
  int E = 0;
  DType dtype = DType::kF32;
  std::vector<float> f32;          // [E, 3, F*C] gate | up | down
  std::vector<std::uint16_t> b16;  // the same, bf16 bits
  ExpertRef ref(int e) const {
    const std::size_t m = std::size_t(F * C), base = std::size_t(e) * 3 * m;
    if (dtype == DType::kBF16) {
      const std::uint16_t* p = b16.data() + base;
      return {p, p + m, p + 2 * m, DType::kBF16};
    }
    const float* p = f32.data() + base;
    return {p, p + m, p + 2 * m, DType::kF32};
  }
  const float* wide(int e, int which) const {  // 0 gate, 1 up, 2 down
    return f32.data() + (std::size_t(e) * 3 + std::size_t(which)) * std::size_t(F * C);
  }
};

// Uniform in [-1, 1) from a counter (splitmix64): millions of weights in milliseconds.
float uniform_at(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) / float(1 << 23) - 1.0f;
}

Weights make_weights(std::int64_t C, std::int64_t F, int E, DType dt, std::uint64_t seed) {
  Weights w{.C = C, .F = F, .E = E, .dtype = dt};
  const std::size_t m = std::size_t(F * C);
  w.f32.resize(std::size_t(E) * 3 * m);
  // gate/up scaled ~ 1/sqrt(C), down ~ 1/sqrt(F): activations of order 1, as in a real model.
  const float sg = 2.0f / std::sqrt(float(C)), sd = 2.0f / std::sqrt(float(F));
  for (int e = 0; e < E; ++e) {
    for (std::size_t i = 0; i < 3 * m; ++i) {
      const std::size_t at = std::size_t(e) * 3 * m + i;
      w.f32[at] = uniform_at(seed, at) * (i < 2 * m ? sg : sd);
    }
  }
  if (dt == DType::kBF16) {
    w.b16.resize(w.f32.size());
    for (std::size_t i = 0; i < w.f32.size(); ++i) {
      w.b16[i] = f32_to_bf16(w.f32[i]);
      w.f32[i] = bf16_to_f32(w.b16[i]);
    }
  }
  return w;
}

// A step: T tokens, K experts each out of E, drawn so several tokens share experts.
struct Step {
  int T = 0, K = 0;
  std::vector<float> x;            // [T, C]
  std::vector<std::int32_t> ids;   // [T*K]
  std::vector<std::int32_t> rows;  // 0..T*K-1
};

Step make_step(const Weights& w, int T, int K, std::uint64_t seed) {
  Step s{.T = T, .K = K};
  s.x.resize(std::size_t(T * w.C));
  for (std::size_t i = 0; i < s.x.size(); ++i) s.x[i] = uniform_at(seed + 1000, i);
  for (int t = 0; t < T; ++t) {
    // Distinct per token; (t + k * 2) mod E shares experts between neighbouring tokens.
    for (int k = 0; k < K; ++k) s.ids.push_back(std::int32_t((t + k * 2) % w.E));
  }
  s.rows.resize(s.ids.size());
  for (std::size_t i = 0; i < s.rows.size(); ++i) s.rows[i] = std::int32_t(i);
  return s;
}

std::vector<float> run_fast(const Weights& w, const Step& s, Isa isa, ThreadPool& pool,
                            const std::vector<std::int32_t>& rows, float fill = 0.0f) {
  std::vector<ExpertRef> refs(std::size_t(w.E));
  for (int e = 0; e < w.E; ++e) refs[std::size_t(e)] = w.ref(e);
  std::vector<float> out(std::size_t(s.T * s.K * w.C), fill);
  ExpertFfnGrouped k(isa);
  k.run({.ref_of_expert = refs.data(),
         .ids = s.ids.data(),
         .rows = rows.data(),
         .n = std::int64_t(rows.size()),
         .x = s.x.data(),
         .out = out.data(),
         .K = s.K,
         .E = w.E,
         .C = w.C,
         .F = w.F},
        pool);
  return out;
}

// The f64 reference and the naive f32 loop (sequential sums), row i.
void reference_row(const Weights& w, const Step& s, int i, std::vector<double>& ref,
                   std::vector<float>& naive) {
  const int e = s.ids[std::size_t(i)];
  const float* x = s.x.data() + std::size_t(i / s.K) * std::size_t(w.C);
  const float *g = w.wide(e, 0), *u = w.wide(e, 1), *d = w.wide(e, 2);
  std::vector<double> act(std::size_t(w.F));
  std::vector<float> nact(std::size_t(w.F));
  for (std::int64_t f = 0; f < w.F; ++f) {
    double dg = 0, du = 0;
    float ng = 0, nu = 0;
    for (std::int64_t c = 0; c < w.C; ++c) {
      dg += double(g[f * w.C + c]) * x[c];
      du += double(u[f * w.C + c]) * x[c];
      ng += g[f * w.C + c] * x[c];
      nu += u[f * w.C + c] * x[c];
    }
    act[std::size_t(f)] = dg / (1 + std::exp(-dg)) * du;
    nact[std::size_t(f)] = ng / (1.0f + std::exp(-ng)) * nu;
  }
  ref.assign(std::size_t(w.C), 0.0);
  naive.assign(std::size_t(w.C), 0.0f);
  for (std::int64_t c = 0; c < w.C; ++c) {
    double y = 0;
    float ny = 0;
    for (std::int64_t f = 0; f < w.F; ++f) {
      y += double(d[c * w.F + f]) * act[std::size_t(f)];
      ny += d[c * w.F + f] * nact[std::size_t(f)];
    }
    ref[std::size_t(c)] = y;
    naive[std::size_t(c)] = ny;
  }
}

// Every ISA this CPU has; with_scalar false leaves out the scalar one (expert_ffn_row's arithmetic,
// ScalarIsaEqualsTheExactPath), which is as slow as the references in a Debug build.
std::vector<Isa> isas(bool with_scalar = true) {
  std::vector<Isa> v;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (i == Isa::kScalar && !with_scalar) continue;
    if (kernels::cpu::isa_supported(i)) v.push_back(i);
  }
  return v;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  std::int64_t C, F;
  int E, K;
  std::vector<int> tokens;
};

// Rule (a) on every row of steps of the given token counts, and the same bits on 1 and 6 threads.
// The large shapes keep few rows: the f64 and naive loops run unoptimised in CI's Debug build.
void check_shape(const Shape& sh, DType dt, std::uint64_t seed) {
  ThreadPool one(0), many(5);
  const Weights w = make_weights(sh.C, sh.F, sh.E, dt, seed);
  for (int T : sh.tokens) {
    const Step s = make_step(w, T, sh.K, seed * 31 + std::uint64_t(T));
    // References once per row (the slow part).
    std::vector<std::vector<double>> ref(s.rows.size());
    std::vector<std::vector<float>> naive(s.rows.size());
    for (std::size_t i = 0; i < s.rows.size(); ++i) reference_row(w, s, int(i), ref[i], naive[i]);
    for (Isa isa : isas(/*with_scalar=*/sh.C * sh.F < 100000)) {
      const std::string what = fmt::format("{}x{} {} T={} isa={}", sh.C, sh.F, to_string(dt), T,
                                           kernels::cpu::to_string(isa));
      const std::vector<float> got = run_fast(w, s, isa, many, s.rows);
      EXPECT_TRUE(same(got, run_fast(w, s, isa, one, s.rows))) << what << ": thread count";
      double err = 0, nerr = 0;
      for (std::size_t i = 0; i < s.rows.size(); ++i) {
        for (std::int64_t c = 0; c < w.C; ++c) {
          const double want = ref[i][std::size_t(c)];
          err = std::max(err, std::fabs(double(got[i * std::size_t(w.C) + std::size_t(c)]) - want));
          nerr = std::max(nerr, std::fabs(double(naive[i][std::size_t(c)]) - want));
        }
      }
      EXPECT_LE(err, 2 * nerr + 1e-6) << what << " (naive " << nerr << ")";
    }
  }
}

TEST(ExpertFfnFast, QwenShapeWithinTwiceTheNaiveErrorF32) {
  check_shape({2048, 768, 4, 2, {2}}, DType::kF32, 1);  // 4 rows, 4 experts
}

TEST(ExpertFfnFast, QwenShapeWithinTwiceTheNaiveErrorBf16) {
  check_shape({2048, 768, 3, 1, {1, 8}}, DType::kBF16, 2);  // 8 tokens share 3 experts
}

TEST(ExpertFfnFast, OddShapeWithinTwiceTheNaiveError) {
  check_shape({2053, 771, 2, 2, {1}}, DType::kF32, 3);   // one token, two experts
  check_shape({2053, 771, 2, 1, {2}}, DType::kBF16, 4);  // two tokens, two experts
}

TEST(ExpertFfnFast, SmallShapeEveryTokenCountWithinTwiceTheNaiveError) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    check_shape({96, 40, 6, 3, {1, 2, 3, 4, 5, 6, 7, 8}}, dt, 5);
    check_shape({5, 3, 4, 2, {1, 8}}, dt, 6);  // no vector body at all: tails only
  }
}

// A row's bits do not depend on which other rows share the step, nor on the rows' order, nor on
// the thread count; rows not asked for keep their contents.
TEST(ExpertFfnFast, RowBitsIndependentOfTheRestOfTheStep) {
  ThreadPool one(0), many(5);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Weights w = make_weights(96, 40, 6, dt, 7);
    const Step s = make_step(w, 8, 3, 8);
    for (Isa isa : isas()) {
      const std::vector<float> all = run_fast(w, s, isa, many, s.rows);
      std::vector<std::int32_t> reversed(s.rows.rbegin(), s.rows.rend());
      EXPECT_TRUE(same(all, run_fast(w, s, isa, one, reversed)));
      const float sentinel = 12345.0f;
      for (std::int32_t i : {0, 7, 23}) {
        const std::vector<float> alone = run_fast(w, s, isa, many, {i}, sentinel);
        for (std::size_t r = 0; r < s.rows.size(); ++r) {
          for (std::int64_t c = 0; c < w.C; ++c) {
            const std::size_t at = r * std::size_t(w.C) + std::size_t(c);
            if (std::int32_t(r) == i) {
              EXPECT_EQ(std::memcmp(&alone[at], &all[at], sizeof(float)), 0) << i;
            } else {
              ASSERT_EQ(alone[at], sentinel) << "row " << r << " written";
            }
          }
        }
      }
    }
  }
}

// The scalar variant is expert_ffn_row's arithmetic (dot_fixed, the same silu) bit for bit.
TEST(ExpertFfnFast, ScalarIsaEqualsTheExactPath) {
  ThreadPool many(5);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Weights w = make_weights(2053 % 200, 771 % 100, 5, dt, 9);  // 53 x 71
    const Step s = make_step(w, 6, 2, 10);
    const std::vector<float> got = run_fast(w, s, Isa::kScalar, many, s.rows);
    std::vector<float> want(got.size()), scratch(std::size_t(w.F));
    for (std::size_t i = 0; i < s.rows.size(); ++i) {
      expert_ffn_row(w.ref(s.ids[i]), s.x.data() + std::size_t(int(i) / s.K) * std::size_t(w.C),
                     want.data() + i * std::size_t(w.C), w.C, w.F, scratch.data());
    }
    EXPECT_TRUE(same(got, want)) << to_string(dt);
  }
}

TEST(ExpertFfnFast, ParsesTheKernelFlag) {
  auto fast = parse_cpu_expert_kernel("fast");
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(*fast, CpuExpertKernel::kFast);
  auto exact = parse_cpu_expert_kernel("exact");
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(*exact, CpuExpertKernel::kExact);
  for (const char* bad : {"", "default", "Fast", "simd", "fast "}) {
    auto r = parse_cpu_expert_kernel(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(to_string(CpuExpertKernel::kFast), "fast");
  EXPECT_EQ(to_string(CpuExpertKernel::kExact), "exact");
}

// The CPU engine: cpu-experts stays on the exact kernel by default (bit-identical to resident);
// with kFast its logits are within a tolerance of resident's and its greedy ids equal.
TEST(ExpertFfnFast, CpuEngineUsesExactByDefaultAndFastWhenAsked) {
  auto m = testing::tiny_builtin_moe(11);
  ASSERT_TRUE(m);
  auto run = [&](ExpertMode mode, CpuExpertKernel k, CpuExpertKernel* ran) {
    EngineConfig cfg;
    cfg.pager.mode = mode;
    cfg.pager.cpu_expert_kernel = k;
    cfg.max_batch_tokens = 8;
    cfg.max_running = 3;
    cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
    auto eng = Engine::create(m->geometry, m->params, cfg);
    EXPECT_TRUE(eng.ok()) << eng.status().to_string();
    if (ran != nullptr) *ran = (*eng)->experts().cpu_expert_kernel();
    std::vector<GenerationRequest> reqs = testing::mixed_requests(m->geometry.vocab);
    for (auto& r : reqs) r.sampling = {};  // greedy: ids comparable under a tolerance
    auto rec = testing::run_engine(**eng, reqs);
    EXPECT_TRUE(rec.ok()) << rec.status().to_string();
    return std::move(*rec);
  };
  const testing::RunRecord ref = run(ExpertMode::kResident, CpuExpertKernel::kDefault, nullptr);
  CpuExpertKernel ran = CpuExpertKernel::kDefault;
  const testing::RunRecord exact = run(ExpertMode::kCpuExperts, CpuExpertKernel::kDefault, &ran);
  EXPECT_EQ(ran, CpuExpertKernel::kExact);
  testing::expect_same_bits(exact, ref, "cpu-experts, default kernel");
  const testing::RunRecord fast = run(ExpertMode::kCpuExperts, CpuExpertKernel::kFast, &ran);
  EXPECT_EQ(ran, CpuExpertKernel::kFast);
  EXPECT_EQ(fast.tokens, ref.tokens);
  double worst = 0;
  for (const auto& [id, rows] : ref.logits) {
    const auto& g = fast.logits.at(id);
    ASSERT_EQ(g.size(), rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (std::size_t v = 0; v < rows[i].size(); ++v) {
        worst = std::max(worst, std::fabs(double(g[i][v]) - double(rows[i][v])));
      }
    }
  }
  EXPECT_LE(worst, 1e-4);  // f32 logits of order 1: summation-order differences only
}

}  // namespace
}  // namespace ferry::serve
