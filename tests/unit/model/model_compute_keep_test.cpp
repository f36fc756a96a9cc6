// SPDX-License-Identifier: Apache-2.0
// ModelCompute's kept layers (create()'s kept_layers: a dedicated workspace per kept layer, the
// rest sharing l % work_layers), on the host:
//   - planned_bytes() equals what create() allocates with kept workspaces, and grows by exactly
//     kept_layer_bytes() per kept layer (dense and MoE layers, several T and work_layers); the
//     layer -> workspace map is what the header says; wrong-sized lists are refused;
//   - train/stream's per-layer order with keeps (forward every layer, the loss, then from the top
//     a re-forward only for layers not kept, and the backward) gives the whole-model path's loss
//     and gradients bit for bit: f32 and bf16 GEMMs (the down projection's bf16 copy in gemm.x16
//     is reused only when the kept layer's own forward wrote it last), with attention in bf16 as
//     on CUDA (Bf16AttentionBackend: the shared q16/k16/v16/o16 are recast for a kept layer
//     whose forward was followed by other layers'), dense and MoE fixtures;
//   - a kept dense layer keeps no SwiGLU output (kept_layer_bytes: the geometry's buffers without
//     act, 4 T F bytes + alignment less than with it); its backward recomputes act with the
//     forward's kernel call exactly when another dense layer wrote the shared act buffer since its
//     forward (swiglu_recomputes(), the backend's swiglu calls), with the whole model's bits under
//     f32 and bf16 GEMMs (CPU twin), GEMM input reuse on and off, 1 or 2 shared workspaces.
// The executor's use is tested in tests/unit/train/stream_keep_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model_fixtures.h"
#include "unit/kernels/forwarding_backend.h"
#include "unit/model/bf16_attention_backend.h"
#include "unit/model/model_compute_test_util.h"

namespace ferry::model {
namespace {

using kernels::Backend;
using testing::Bf16AttentionBackend;
using testing::Case;
using testing::load_case;

struct Pass {
  double loss = 0.0;
  testing::Grads grads;
  int layer_forwards = 0;
  // Per layer, during its layer_backward: ModelCompute::swiglu_recomputes() and
  // gemm_input_converts() added, the backend's swiglu calls (PerLayerOptions::swiglu_calls;
  // those writing a bf16 copy, SwiGluArgs::out16, apart) and its f32 -> bf16 converts
  // (PerLayerOptions::casts_down).
  std::vector<std::uint64_t> recomputes_in_backward, converts_in_backward;
  std::vector<int> swiglus_in_backward, swiglu16s_in_backward, casts_down_in_backward;
};

// per_layer's knobs beyond the keeps (the defaults are what the executor runs).
struct PerLayerOptions {
  int work_layers = 1;
  std::optional<bool> gemm_input_reuse;  // nullopt: the environment's default
  // The backend's swiglu call counters, read around each layer_backward (SwigluCounting below).
  const int* swiglu_calls = nullptr;
  const int* swiglu16_calls = nullptr;
  // The backend's f32 -> bf16 convert counter (Bf16AttentionBackend::casts_down), likewise.
  const int* casts_down = nullptr;
};

// The CPU backend, counting swiglu calls (all, and those that also write the bf16 copy).
class SwigluCounting final : public testing::ForwardingBackend {
 public:
  Status swiglu(const kernels::SwiGluArgs& a, mem::Stream& s) override {
    ++calls;
    if (a.out16.data != nullptr) ++calls16;
    return ForwardingBackend::swiglu(a, s);
  }
  int calls = 0, calls16 = 0;
};

Pass whole_model(Case& c, Backend& be, GemmPrecision precision) {
  testing::LossAndGrads w = testing::whole_model_pass(c, be, precision);
  Pass r;
  r.loss = w.loss;
  r.grads = std::move(w.grads);
  return r;
}

// train/stream's order with keeps: forward every layer (kept ones into their own workspace), the
// loss, then from the top: a re-forward for layers not kept (the shared workspace), the backward.
Pass per_layer(Case& c, Backend& be, GemmPrecision precision, const std::vector<bool>& keep,
               const PerLayerOptions& opt = {}) {
  Pass r;
  auto mc = ModelCompute::create(c.m->geometry, c.T, be, opt.work_layers, nullptr, precision,
                                 AttnBwdWorkspace::kDefault, keep);
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(mc.ok() && grads.ok()) << mc.status().to_string();
  if (!mc.ok() || !grads.ok()) return r;
  ModelCompute& m = **mc;
  if (opt.gemm_input_reuse) m.set_gemm_input_reuse(*opt.gemm_input_reuse);
  const int L = c.m->geometry.layers;
  r.recomputes_in_backward.assign(static_cast<std::size_t>(L), 0);
  r.converts_in_backward.assign(static_cast<std::size_t>(L), 0);
  r.swiglus_in_backward.assign(static_cast<std::size_t>(L), 0);
  r.swiglu16s_in_backward.assign(static_cast<std::size_t>(L), 0);
  r.casts_down_in_backward.assign(static_cast<std::size_t>(L), 0);
  const auto read = [](const int* counter) { return counter != nullptr ? *counter : 0; };
  testing::PerLayerRun run(m, c, (*grads)->grads);
  run.forward();
  r.loss = run.loss();
  r.layer_forwards = L;
  for (int l = L - 1; l >= 0; --l) {
    EXPECT_EQ(m.layer_kept(l), !keep.empty() && keep[static_cast<std::size_t>(l)]);
    if (!m.layer_kept(l)) {
      run.reforward(l);
      ++r.layer_forwards;
    }
    const std::uint64_t recomputes = m.swiglu_recomputes(), converts = m.gemm_input_converts();
    const int swiglus = read(opt.swiglu_calls), swiglu16s = read(opt.swiglu16_calls),
              casts_down = read(opt.casts_down);
    run.backward(l);
    const auto i = static_cast<std::size_t>(l);
    r.recomputes_in_backward[i] = m.swiglu_recomputes() - recomputes;
    r.converts_in_backward[i] = m.gemm_input_converts() - converts;
    r.swiglus_in_backward[i] = read(opt.swiglu_calls) - swiglus;
    r.swiglu16s_in_backward[i] = read(opt.swiglu16_calls) - swiglu16s;
    r.casts_down_in_backward[i] = read(opt.casts_down) - casts_down;
  }
  run.embed_backward();
  r.grads = testing::grads_of(**grads);
  return r;
}

std::vector<bool> keep_set(int L, std::initializer_list<int> layers) {
  std::vector<bool> k(static_cast<std::size_t>(L), false);
  for (int l : layers) k[static_cast<std::size_t>(l)] = true;
  return k;
}

TEST(ModelComputeKeep, PlannedBytesGrowByKeptLayerBytesAndEqualAllocated) {
  for (const char* arch : {"qwen3", "qwen3_moe", "olmoe"}) {
    auto m = load_model_f32(testing::model_fixture_dir(arch));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const DecoderGeometry& geo = (*m)->geometry;
    const int L = geo.layers;
    Backend& be = kernels::cpu_backend();
    for (int work : {1, 2}) {
      if (work > L) continue;
      for (std::int64_t T : {1, 37, 200}) {
        auto none = ModelCompute::planned_bytes(geo, T, be, work);
        ASSERT_TRUE(none.ok()) << none.status().to_string();
        for (const std::vector<bool>& keep :
             {keep_set(L, {0}), keep_set(L, {L - 1}), keep_set(L, {0, L - 1}),
              std::vector<bool>(static_cast<std::size_t>(L), true)}) {
          const std::string what = std::string(arch) + " work " + std::to_string(work) + " T " +
                                   std::to_string(T) + " kept " +
                                   std::to_string(std::count(keep.begin(), keep.end(), true));
          std::size_t extra = 0;
          for (int l = 0; l < L; ++l) {
            if (!keep[static_cast<std::size_t>(l)]) continue;
            auto k = ModelCompute::kept_layer_bytes(geo, l, T, be, GemmPrecision::kF32);
            ASSERT_TRUE(k.ok()) << k.status().to_string();
            EXPECT_GT(*k, 0u);
            EXPECT_EQ(*k % 256, 0u);
            extra += *k;
          }
          for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
            auto planned = ModelCompute::planned_bytes(geo, T, be, work, prec,
                                                       AttnBwdWorkspace::kDefault, keep);
            auto base = ModelCompute::planned_bytes(geo, T, be, work, prec);
            ASSERT_TRUE(planned.ok() && base.ok()) << what;
            EXPECT_EQ(*planned, *base + extra) << what;
            auto mc = ModelCompute::create(geo, T, be, work, nullptr, prec,
                                           AttnBwdWorkspace::kDefault, keep);
            ASSERT_TRUE(mc.ok()) << mc.status().to_string();
            EXPECT_EQ((*mc)->total_bytes(), *planned) << what;
            EXPECT_EQ((*mc)->kept_bytes(), extra) << what;
            int kept = 0;
            for (int l = 0; l < L; ++l) {
              if (keep[static_cast<std::size_t>(l)]) {
                EXPECT_EQ((*mc)->workspace_of(l), work + kept++) << what << " layer " << l;
                EXPECT_TRUE((*mc)->layer_kept(l));
              } else {
                EXPECT_EQ((*mc)->workspace_of(l), l % work) << what << " layer " << l;
                EXPECT_FALSE((*mc)->layer_kept(l));
              }
            }
            EXPECT_EQ((*mc)->kept_layer_count(), kept);
          }
        }
      }
    }
    // A kept MoE layer costs its experts' rows, a dense one its MLP's: each is sized by its kind.
    for (int l = 0; l < L; ++l) {
      for (int l2 = 0; l2 < L; ++l2) {
        if (geo.layer_is_moe[l] != geo.layer_is_moe[l2]) continue;
        EXPECT_EQ(*ModelCompute::kept_layer_bytes(geo, l, 37, be),
                  *ModelCompute::kept_layer_bytes(geo, l2, 37, be));
      }
    }
    // Refused: a list of the wrong length, a layer out of range.
    EXPECT_EQ(
        ModelCompute::planned_bytes(geo, 8, be, 1, GemmPrecision::kF32, AttnBwdWorkspace::kDefault,
                                    std::vector<bool>(static_cast<std::size_t>(L + 1), true))
            .status()
            .code(),
        StatusCode::kInvalidArgument);
    EXPECT_EQ(ModelCompute::create(geo, 8, be, 1, nullptr, GemmPrecision::kF32,
                                   AttnBwdWorkspace::kDefault, std::vector<bool>(1, true))
                  .status()
                  .code(),
              L == 1 ? StatusCode::kOk : StatusCode::kInvalidArgument);
    EXPECT_FALSE(ModelCompute::kept_layer_bytes(geo, L, 8, be).ok());
    EXPECT_FALSE(ModelCompute::kept_layer_bytes(geo, -1, 8, be).ok());
  }
}

// The qwen3_moe fixture has MoE layers 0 and 2 around dense layer 1.
TEST(ModelComputeKeep, KeptLayersSkipTheReForwardWithTheWholeModelsBits) {
  Bf16AttentionBackend bf16_attention;
  for (Backend* be : {&kernels::cpu_backend(), static_cast<Backend*>(&bf16_attention)}) {
    for (const char* arch : {"qwen3", "qwen3_moe"}) {
      Case c = load_case(arch);
      ASSERT_TRUE(c.m != nullptr);
      const int L = c.m->geometry.layers;
      ASSERT_GE(L, 2);
      for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
        const std::string what = std::string(arch) + " on " + std::string(be->name()) + ", " +
                                 std::string(to_string(prec)) + " GEMMs";
        SCOPED_TRACE(what);
        const Pass whole = whole_model(c, *be, prec);
        const Pass none = per_layer(c, *be, prec, {});
        testing::expect_same(none, whole, what + ", no keeps");
        EXPECT_EQ(none.layer_forwards, 2 * L);
        for (const std::vector<bool>& keep :
             {keep_set(L, {L - 1}), keep_set(L, {0}), keep_set(L, {0, L - 1}),
              std::vector<bool>(static_cast<std::size_t>(L), true)}) {
          const int kept = static_cast<int>(std::count(keep.begin(), keep.end(), true));
          const Pass k = per_layer(c, *be, prec, keep);
          testing::expect_same(k, whole, what + ", " + std::to_string(kept) + " kept");
          EXPECT_EQ(k.layer_forwards, 2 * L - kept);
        }
      }
    }
  }
}

// A kept layer's bf16 attention copies: recast (4 casts down) when other layers ran since its
// forward, reused when its own forward wrote them last (the top layer: only the loss between).
TEST(ModelComputeKeep, KeptLayerRecastsTheSharedBf16AttentionCopiesOnlyWhenOverwritten) {
  Case c = load_case("qwen3");
  ASSERT_TRUE(c.m != nullptr);
  const int L = c.m->geometry.layers;
  Bf16AttentionBackend be;
  const Pass k =
      per_layer(c, be, GemmPrecision::kF32, std::vector<bool>(static_cast<std::size_t>(L), true),
                {.casts_down = &be.casts_down});
  ASSERT_EQ(k.casts_down_in_backward.size(), static_cast<std::size_t>(L));
  for (int l = L - 1; l >= 0; --l) {
    // dO always; q, k, v, out unless the copies are this layer's (the top layer only).
    EXPECT_EQ(k.casts_down_in_backward[static_cast<std::size_t>(l)], l == L - 1 ? 1 : 5)
        << "layer " << l;
  }
}

// ArenaPlan's bytes for n 4-byte elements: each buffer starts 256-byte aligned.
std::size_t slot_bytes(std::int64_t n) {
  return n <= 0 ? 0 : static_cast<std::size_t>((n * 4 + 255) / 256 * 256);
}

// kept_layer_bytes from the geometry, buffer by buffer (model_compute_buffers.h's LayerActs
// without x_in): a dense layer keeps gate and up but not act = swiglu(gate, up), which its
// backward recomputes; an MoE layer keeps everything, its experts' eact included.
TEST(ModelComputeKeep, KeptDenseLayerKeepsGateAndUpButNotTheSwigluOutput) {
  Backend& be = kernels::cpu_backend();
  for (const char* arch : {"qwen3", "qwen3_moe", "qwen2", "olmoe"}) {
    auto m = load_model_f32(testing::model_fixture_dir(arch));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const DecoderGeometry& geo = (*m)->geometry;
    const std::int64_t C = geo.hidden, H = geo.heads, G = geo.kv_heads, HD = H * geo.head_dim,
                       GD = G * geo.head_dim, F = geo.mlp_width, E = geo.experts, K = geo.top_k,
                       Fe = geo.expert_width;
    const bool per_head = geo.qk_norm == QkNorm::kPerHead;
    for (std::int64_t T : {1, 37, 200, 256}) {
      for (int l = 0; l < geo.layers; ++l) {
        const std::string what =
            std::string(arch) + " layer " + std::to_string(l) + " T " + std::to_string(T);
        // h1, x_mid, h2; rstd1, rstd2; q, attn; k, v; lse
        std::size_t want = 3 * slot_bytes(T * C) + 2 * slot_bytes(T) + 2 * slot_bytes(T * HD) +
                           2 * slot_bytes(T * GD) + slot_bytes(H * T);
        if (geo.qk_norm != QkNorm::kNone) {  // q_pre, k_pre, q_rstd, k_rstd
          want += slot_bytes(T * HD) + slot_bytes(T * GD) + slot_bytes(per_head ? T * H : T) +
                  slot_bytes(per_head ? T * G : T);
        }
        const bool moe = geo.layer_is_moe[static_cast<std::size_t>(l)];
        if (moe) {
          // router_logits, probs; weights, ids, slot_of; offsets; gathered, eout; egate, eup, eact
          want += 2 * slot_bytes(T * E) + 3 * slot_bytes(T * K) + slot_bytes(E + 1) +
                  2 * slot_bytes(T * K * C) + 3 * slot_bytes(T * K * Fe);
        } else {
          want += 2 * slot_bytes(T * F);  // gate, up
        }
        auto kept = ModelCompute::kept_layer_bytes(geo, l, T, be);
        ASSERT_TRUE(kept.ok()) << kept.status().to_string();
        EXPECT_EQ(*kept, want) << what;
        // What a kept layer adds to the plan and the allocation.
        std::vector<bool> keep(static_cast<std::size_t>(geo.layers), false);
        keep[static_cast<std::size_t>(l)] = true;
        auto none = ModelCompute::planned_bytes(geo, T, be, 1);
        auto with = ModelCompute::planned_bytes(geo, T, be, 1, GemmPrecision::kF32,
                                                AttnBwdWorkspace::kDefault, keep);
        ASSERT_TRUE(none.ok() && with.ok()) << what;
        EXPECT_EQ(*with - *none, want) << what;
        // At T = 256 every buffer is a whole number of 256-byte blocks: a kept dense layer is
        // 4 T (3C + 2HD + 2GD + H + 2F + 2) bytes (+ the q/k norm's), exactly 4 T F less than
        // the 4 T (... + 3F + 2) of a workspace that keeps act.
        if (T == 256 && !moe) {
          std::int64_t floats = 3 * C + 2 * HD + 2 * GD + H + 2;
          if (geo.qk_norm != QkNorm::kNone) floats += HD + GD + (per_head ? H + G : 2);
          const std::int64_t with_act = 4 * T * (floats + 3 * F);
          EXPECT_EQ(static_cast<std::int64_t>(*kept), 4 * T * (floats + 2 * F)) << what;
          EXPECT_EQ(with_act - static_cast<std::int64_t>(*kept), 4 * T * F) << what;
        }
      }
    }
  }
}

// A kept dense layer's act lives in the shared workspace l % work_layers' buffer: its backward
// recomputes it (one swiglu_into_gemm_input, the forward's call) exactly when another dense layer
// wrote that buffer after its forward, i.e. a dense layer above it on the same shared workspace;
// never for the top layer right after its own forward (nor for a layer whose act nothing
// overwrote: qwen3_moe's dense layer 1 under MoE layer 2). The bits stay the whole model's.
TEST(ModelComputeKeep, KeptDenseLayerRecomputesItsSwigluOutputOnlyWhenOverwritten) {
  SwigluCounting be;
  for (const char* arch : {"qwen3", "qwen3_moe"}) {
    Case c = load_case(arch);
    ASSERT_TRUE(c.m != nullptr);
    const DecoderGeometry& geo = c.m->geometry;
    const int L = geo.layers;
    const auto dense = [&](int l) { return !geo.layer_is_moe[static_cast<std::size_t>(l)]; };
    for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
      const Pass whole = whole_model(c, kernels::cpu_backend(), prec);
      for (bool reuse : {true, false}) {
        for (int work : {1, 2}) {
          for (const std::vector<bool>& keep :
               {keep_set(L, {L - 1}), keep_set(L, {0}), keep_set(L, {1}), keep_set(L, {0, L - 1}),
                std::vector<bool>(static_cast<std::size_t>(L), true)}) {
            const std::string what = std::string(arch) + ", " + std::string(to_string(prec)) +
                                     " GEMMs, reuse " + (reuse ? "on" : "off") + ", work " +
                                     std::to_string(work) + ", kept " +
                                     std::to_string(std::count(keep.begin(), keep.end(), true));
            SCOPED_TRACE(what);
            const Pass k = per_layer(c, be, prec, keep,
                                     {.work_layers = work,
                                      .gemm_input_reuse = reuse,
                                      .swiglu_calls = &be.calls,
                                      .swiglu16_calls = &be.calls16});
            testing::expect_same(k, whole, what);
            int total = 0;
            for (int l = 0; l < L; ++l) {
              bool overwritten = false;
              for (int above = l + 1; above < L; ++above) {
                overwritten |= dense(above) && above % work == l % work;
              }
              const int want = keep[static_cast<std::size_t>(l)] && dense(l) && overwritten;
              total += want;
              const auto i = static_cast<std::size_t>(l);
              EXPECT_EQ(k.recomputes_in_backward[i], static_cast<std::uint64_t>(want))
                  << "layer " << l;
              // The forward's own call: the swiglu kernel, writing the bf16 operand of the down
              // projection itself where the forward's did (reuse on, bf16 GEMMs).
              EXPECT_EQ(k.swiglus_in_backward[i], want) << "layer " << l;
              EXPECT_EQ(k.swiglu16s_in_backward[i],
                        reuse && prec == GemmPrecision::kBf16 ? want : 0)
                  << "layer " << l;
            }
            if (std::string(arch) == "qwen3" && work == 1 && keep[0]) {
              EXPECT_EQ(total, 1);
            }
            if (std::string(arch) == "qwen3_moe") {
              EXPECT_EQ(total, 0);
            }
            // qwen3, both layers kept on one shared workspace: the recomputing layer 0 converts
            // no more GEMM inputs in its backward than the top layer, which finds its act and
            // the bf16 copy in place (with two, layer 0's act is in place but gemm.x16 is not:
            // one convert more, as before).
            if (std::string(arch) == "qwen3" && work == 1 && keep[0] && keep[1]) {
              EXPECT_EQ(k.converts_in_backward[0], k.converts_in_backward[1]);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::model
