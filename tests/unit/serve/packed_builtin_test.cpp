// SPDX-License-Identifier: Apache-2.0
// Experts drawn straight into the packed host store (builtin_model.h make_builtin_moe_packed, how
// bench serve builds the 48-layer Qwen3-30B-A3B geometry in bf16 without its f32 experts):
//   - the store's bytes equal ExpertStore::create over make_builtin_moe's f32 model (bf16: that
//     model rounded to nearest even), and the dense weights are the same bits, for any thread
//     count; the model's expert views are views into the store's blocks;
//   - engines given the store (PagerConfig::host_store) read it instead of packing their own,
//     and every mode gives the plain model's tokens and logits bits (CPU engine, f32 store);
//     a store of another geometry or dtype is refused;
//   - bench_host_bytes: the 48-layer bf16 model is ~60 GiB packed (it fits a 128 GiB host);
//   - DeviceWeights' bounded staging (CPU build: the emulated device tier) uploads the same
//     bytes however small the staging buffer is.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "mem/tier.h"
#include "mem/transfer_engine.h"
#include "serve/bench/bench_geometry.h"
#include "serve/device_weights.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

// The engine tests' tiny model with a third layer, drawn as the 48-layer bench geometry is.
BuiltinMoeSpec packed_spec() {
  BuiltinMoeSpec s = testing::tiny_moe_spec();
  s.layers = 3;
  s.parallel_init = true;
  return s;
}

bool same_bytes(const ExpertStore& a, const ExpertStore& b, const model::DecoderGeometry& g) {
  if (a.dtype() != b.dtype() || a.expert_bytes() != b.expert_bytes()) return false;
  for (int l = 0; l < g.layers; ++l) {
    if (!g.layer_is_moe[l]) continue;
    for (int e = 0; e < g.experts; ++e) {
      if (std::memcmp(a.block(l, e), b.block(l, e), a.expert_bytes()) != 0) return false;
    }
  }
  return true;
}

// Every dense (non-expert) view of `a` holds the same f32 bits as `b`'s.
void expect_same_dense(const model::ModelParams& a, const model::ModelParams& b) {
  auto same = [](const ConstTensorView& x, const ConstTensorView& y) {
    if (x.data == nullptr || y.data == nullptr) return x.data == y.data;
    return x.dtype == y.dtype && x.numel() == y.numel() &&
           std::memcmp(x.data, y.data, std::size_t(x.numel()) * dtype_size(x.dtype)) == 0;
  };
  EXPECT_TRUE(same(a.embed, b.embed));
  EXPECT_TRUE(same(a.lm_head, b.lm_head));
  EXPECT_TRUE(same(a.final_norm, b.final_norm));
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    for (auto [p, q] : {std::pair{&x.q, &y.q},
                        {&x.k, &y.k},
                        {&x.v, &y.v},
                        {&x.o, &y.o},
                        {&x.attn_norm, &y.attn_norm},
                        {&x.mlp_norm, &y.mlp_norm},
                        {&x.q_norm, &y.q_norm},
                        {&x.k_norm, &y.k_norm},
                        {&x.router, &y.router}}) {
      EXPECT_TRUE(same(*p, *q)) << "layer " << l;
    }
  }
}

TEST(PackedBuiltin, StoreEqualsTheF32ModelPackedForAnyThreadCount) {
  const BuiltinMoeSpec spec = packed_spec();
  auto ref = make_builtin_moe(spec, 17, /*threads=*/1);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const model::DecoderGeometry& g = (*ref)->geometry;
  EXPECT_EQ((*ref)->experts, nullptr);
  // The f32 model's own values do not depend on the thread count either.
  auto ref3 = make_builtin_moe(spec, 17, /*threads=*/3);
  ASSERT_TRUE(ref3.ok());
  EXPECT_EQ((*ref)->storage, (*ref3)->storage);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    auto want = ExpertStore::create(g, (*ref)->params, dt);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    for (int threads : {1, 2, 5, 0}) {
      SCOPED_TRACE(std::string(to_string(dt)) + " threads=" + std::to_string(threads));
      auto m = make_builtin_moe_packed(spec, 17, dt, threads);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      ASSERT_NE((*m)->experts, nullptr);
      const ExpertStore& s = *(*m)->experts;
      EXPECT_EQ(s.dtype(), dt);
      EXPECT_EQ(s.bytes(), std::size_t(g.layers) * g.experts * s.expert_bytes());
      EXPECT_TRUE(same_bytes(s, **want, g));
      expect_same_dense((*m)->params, (*ref)->params);
      // Only the dense tensors are held in f32.
      std::size_t f32 = 0;
      for (const auto& b : (*m)->storage) f32 += b.size();
      const auto counted = bench::count_params(spec);
      ASSERT_TRUE(counted.ok());
      EXPECT_EQ(f32, counted->dense());
      // The expert views are the store's blocks, in its dtype, with the model's shapes.
      for (int l = 0; l < g.layers; ++l) {
        for (int e = 0; e < g.experts; ++e) {
          const auto& lt = (*m)->params.layers[l];
          const ExpertRef r = s.ref(l, e);
          EXPECT_EQ(lt.expert_gate[e].data, r.gate);
          EXPECT_EQ(lt.expert_up[e].data, r.up);
          EXPECT_EQ(lt.expert_down[e].data, r.down);
          EXPECT_EQ(lt.expert_down[e].dtype, dt);
          EXPECT_EQ(lt.expert_gate[e].shape[0], g.expert_width);
          EXPECT_EQ(lt.expert_down[e].shape[0], g.hidden);
        }
      }
    }
  }
  // bf16 is the f32 value rounded to nearest even (spot check of one weight).
  auto m = make_builtin_moe_packed(spec, 17, DType::kBF16, 2);
  ASSERT_TRUE(m.ok());
  const float w = static_cast<const float*>((*ref)->params.layers[2].expert_up[5].data)[7];
  const std::uint16_t b = static_cast<const std::uint16_t*>((*m)->experts->ref(2, 5).up)[7];
  EXPECT_EQ(b, f32_to_bf16(w));
}

// parallel_init's values (Irwin-Hall(4), builtin_model.cpp fill_chunk): mean ~0 and standard
// deviation ~init_std (router: router_std) over a large tensor, never beyond the sum's bound of
// sqrt(12) = 3.464 standard deviations, and not all equal (a broken generator fails one of these).
TEST(PackedBuiltin, ParallelInitDrawsCentredValuesOfTheSpecStd) {
  BuiltinMoeSpec spec = packed_spec();
  spec.init_std = 0.05;
  auto m = make_builtin_moe(spec, 23, 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ConstTensorView& emb = (*m)->params.embed;
  const auto* v = static_cast<const float*>(emb.data);
  const std::int64_t n = emb.numel();
  ASSERT_GE(n, 10000);
  double sum = 0, sq = 0, worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    sum += v[i];
    sq += double(v[i]) * v[i];
    worst = std::max(worst, std::abs(double(v[i])));
  }
  const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
  // Standard errors: mean 0.05 / sqrt(n) (<= 5e-4 at n >= 1e4), sd ~0.05 / sqrt(2n).
  EXPECT_LT(std::abs(mean), 5 * 0.05 / std::sqrt(double(n)));
  EXPECT_NEAR(sd, 0.05, 0.05 * 5 / std::sqrt(2.0 * double(n)) + 1e-4);
  EXPECT_LE(worst, 0.05 * std::sqrt(12.0) * 1.0001);
  EXPECT_GT(worst, 0.05 * 2.0);  // tails reach past 2 sigma somewhere in >= 1e4 draws
}

TEST(PackedBuiltin, NeedsParallelInitAndAStoreDtype) {
  BuiltinMoeSpec spec = packed_spec();
  spec.parallel_init = false;
  auto m = make_builtin_moe_packed(spec, 1, DType::kBF16);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  auto h = make_builtin_moe_packed(packed_spec(), 1, DType::kF16);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
}

TEST(PackedBuiltin, EnginesReadTheGivenStoreWithTheSameBits) {
  auto plain = make_builtin_moe(packed_spec(), 5);
  auto packed = make_builtin_moe_packed(packed_spec(), 5, DType::kF32, 3);
  ASSERT_TRUE(plain.ok() && packed.ok());
  const model::DecoderGeometry& g = (*plain)->geometry;
  const auto reqs = testing::mixed_requests(g.vocab);
  EngineConfig base{.max_batch_tokens = 8, .max_running = 3};
  auto ref_eng = Engine::create(g, (*plain)->params, base, kernels::cpu_backend());
  ASSERT_TRUE(ref_eng.ok());
  auto want = testing::run_engine(**ref_eng, reqs);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (ExpertMode mode :
       {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kCpuExperts, ExpertMode::kPaged}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    EngineConfig ec = base;
    ec.pager.mode = mode;
    ec.pager.slots_per_layer = mode == ExpertMode::kPaged ? 3 : 0;
    ec.pager.host_store = (*packed)->experts.get();
    auto eng = Engine::create(g, (*packed)->params, ec, kernels::cpu_backend());
    ASSERT_TRUE(eng.ok()) << eng.status().to_string();
    if (mode != ExpertMode::kResident) {
      EXPECT_EQ((*eng)->experts().store(), (*packed)->experts.get());  // not a second copy
    }
    auto got = testing::run_engine(**eng, reqs);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->tokens, want->tokens);
    ASSERT_EQ(got->logits.size(), want->logits.size());
    for (const auto& [id, rows] : want->logits) {
      ASSERT_EQ(got->logits.at(id).size(), rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        EXPECT_TRUE(testing::same_bits(got->logits.at(id)[i], rows[i])) << id << "/" << i;
      }
    }
  }
}

TEST(PackedBuiltin, EngineRefusesAStoreOfAnotherModel) {
  auto m = testing::tiny_builtin_moe(3);                                   // 2 layers
  auto other = make_builtin_moe_packed(packed_spec(), 3, DType::kF32, 1);  // 3 layers
  BuiltinMoeSpec two_layers = packed_spec();
  two_layers.layers = 2;
  auto bf16 = make_builtin_moe_packed(two_layers, 3, DType::kBF16, 1);
  ASSERT_TRUE(m && other.ok() && bf16.ok());
  for (const ExpertStore* s : {(*other)->experts.get(), (*bf16)->experts.get()}) {
    PagerConfig pc{.mode = ExpertMode::kPaged, .slots_per_layer = 4};
    pc.host_store = s;
    auto x = ExpertExecutor::create(m->geometry, m->params, pc);
    ASSERT_FALSE(x.ok());
    EXPECT_EQ(x.status().code(), StatusCode::kInvalidArgument) << x.status().to_string();
    EXPECT_NE(x.status().message().find("does not match"), std::string::npos);
  }
}

TEST(PackedBuiltin, BenchHostBytes) {
  auto g = bench::find_bench_geometry("qwen3-30b-a3b");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->spec.parallel_init);
  auto bf16 = bench::bench_host_bytes(*g, DType::kBF16);
  auto f32 = bench::bench_host_bytes(*g, DType::kF32);
  ASSERT_TRUE(bf16.ok() && f32.ok());
  const auto p = bench::count_params(g->spec);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(bf16->packed);
  EXPECT_EQ(bf16->f32_weights, p->dense() * 4);
  EXPECT_EQ(bf16->expert_store, p->experts * 2);
  // Qwen3-30B-A3B: ~29e9 expert and ~1.5e9 dense parameters: 58 + 6 GB, within 65 GB.
  EXPECT_GT(bf16->total(), std::size_t(60e9));
  EXPECT_LT(bf16->total(), std::size_t(65e9));
  EXPECT_GT(f32->total(), std::size_t(120e9));  // refused on a 128 GiB host
  // The other geometries keep the f32 model + one engine's store.
  auto mini = bench::find_bench_geometry("qwen3-30b-a3b-mini");
  ASSERT_TRUE(mini.ok());
  auto mb = bench::bench_host_bytes(*mini, DType::kF32);
  const auto mp = bench::count_params(mini->spec);
  ASSERT_TRUE(mb.ok() && mp.ok());
  EXPECT_FALSE(mb->packed);
  EXPECT_EQ(mb->total(), mp->total * 4 + mp->experts * 4);
}

TEST(PackedBuiltin, DeviceWeightsUploadTheSameBytesThroughAnyStaging) {
  // The upload goes to the device tier and the check reads it back with memcmp: only where that
  // tier is host memory (CPU builds). In a CUDA build it is GPU memory (the GPU serve tests run
  // the upload: resident mode's byte identity).
  if (!mem::device_tier_is_host_memory()) {
    GTEST_SKIP() << "the device tier is GPU memory in this build";
  }
  auto m = make_builtin_moe_packed(packed_spec(), 9, DType::kBF16, 2);
  ASSERT_TRUE(m.ok());
  const model::DecoderGeometry& g = (*m)->geometry;
  const model::ModelParams& host = (*m)->params;
  // 0: the default (one fill); 4 KiB and 100 bytes split the tensors into many pieces.
  for (std::size_t stage : {std::size_t(0), std::size_t(4096), std::size_t(100)}) {
    SCOPED_TRACE("stage=" + std::to_string(stage));
    auto w =
        DeviceWeights::create(g, host, /*with_experts=*/true, DType::kBF16, DType::kF32,
                              mem::host_transfer_engine(), mem::Stream::host(), nullptr, stage);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const model::ModelParams& dev = (*w)->params();
    auto same = [](const ConstTensorView& d, const ConstTensorView& h) {
      return d.numel() == h.numel() && d.dtype == h.dtype &&
             std::memcmp(d.data, h.data, std::size_t(h.numel()) * dtype_size(h.dtype)) == 0;
    };
    EXPECT_TRUE(same(dev.embed, host.embed));
    EXPECT_TRUE(same(dev.lm_head, host.lm_head));
    for (int l = 0; l < g.layers; ++l) {
      const auto &d = dev.layers[l], &h = host.layers[l];
      EXPECT_TRUE(same(d.q, h.q) && same(d.o, h.o) && same(d.router, h.router)) << l;
      EXPECT_TRUE(same(d.attn_norm, h.attn_norm) && same(d.k_norm, h.k_norm)) << l;
      for (int e = 0; e < g.experts; ++e) {
        EXPECT_TRUE(same(d.expert_gate[e], h.expert_gate[e]) &&
                    same(d.expert_up[e], h.expert_up[e]) &&
                    same(d.expert_down[e], h.expert_down[e]))
            << l << "/" << e;
      }
    }
    EXPECT_EQ(std::memcmp((*w)->inv_freq(), g.rope.inv_freq.data(),
                          g.rope.inv_freq.size() * sizeof(float)),
              0);
  }
  // f32 experts from the bf16 views: widened, as ExpertStore's conversion would.
  auto w = DeviceWeights::create(g, host, true, DType::kF32, DType::kF32,
                                 mem::host_transfer_engine(), mem::Stream::host(), nullptr, 256);
  ASSERT_TRUE(w.ok());
  const auto* d = static_cast<const float*>((*w)->params().layers[1].expert_down[3].data);
  const auto* h = static_cast<const std::uint16_t*>(host.layers[1].expert_down[3].data);
  for (int i = 0; i < g.hidden * g.expert_width; ++i) ASSERT_EQ(d[i], bf16_to_f32(h[i])) << i;
}

}  // namespace
}  // namespace ferry::serve
