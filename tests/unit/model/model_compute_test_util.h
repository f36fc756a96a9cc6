// SPDX-License-Identifier: Apache-2.0
// Shared by the ModelCompute tests that run a fixture model on the host
// (tests/unit/model/model_compute_{keep,attn_workspace,gemm_input}_test.cpp): a fixture with its
// packed batch (Case, load_case), the gradients as plain vectors and their bitwise comparison,
// the whole-model forward + backward, and PerLayerRun, train/stream's per-layer steps (embed,
// layer forwards, head, then from the top re-forwards and layer backwards) for a test to order.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"

namespace ferry::testing {

// A fixture model in f32 and the batch of its expected.safetensors (which `expected` maps).
struct Case {
  std::unique_ptr<model::LoadedModel> m;
  std::optional<model::SafetensorsFile> expected;
  model::PackedBatch batch;
  std::int64_t T = 0;
};

// The fixture tests/data/models/<arch>; m stays null (with a failure reported) if it won't load.
inline Case load_case(const std::string& arch) {
  Case c;
  auto m = model::load_model_f32(model_fixture_dir(arch));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return c;
  c.m = std::move(*m);
  auto e = model::SafetensorsFile::open(model_fixture_dir(arch) + "/expected.safetensors");
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return c;
  c.expected.emplace(std::move(*e));
  auto view = [&](const char* name) {
    auto v = c.expected->view(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : ConstTensorView{};
  };
  c.batch = {.ids = view("input_ids"),
             .positions = view("positions"),
             .cu_seqlens = view("cu_seqlens"),
             .targets = view("targets")};
  c.T = c.batch.ids.numel();
  return c;
}

using Grads = std::vector<std::vector<float>>;

// Every gradient buffer of g (GradStorage::named's order), copied.
inline Grads grads_of(const model::GradStorage& g) {
  Grads out;
  for (const auto& [name, v] : g.named) {
    const float* p = v.as<float>();
    out.emplace_back(p, p + v.numel());
  }
  return out;
}

// The same bits, gradient by gradient.
inline void expect_same_grads(const Grads& a, const Grads& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << what << ": gradient " << i;
  }
}

// Two passes (anything with a double loss and Grads grads): the same loss and gradient bits.
template <class Pass>
void expect_same(const Pass& a, const Pass& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << what;
  expect_same_grads(a.grads, b.grads, what);
}

// The whole-model path: forward then backward (gradients added into g); the loss (0 on failure).
inline double forward_backward(model::ModelCompute& mc, const Case& c, const model::ModelGrads& g) {
  auto fwd = mc.forward(c.m->params, c.batch);
  EXPECT_TRUE(fwd.ok()) << fwd.status().to_string();
  const Status s = mc.backward(c.m->params, c.batch, g);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return fwd.ok() ? fwd->loss_sum : 0.0;
}

// The whole-model path on a fresh ModelCompute (all layers' workspaces) and fresh gradients.
struct LossAndGrads {
  double loss = 0.0;
  Grads grads;
};
inline LossAndGrads whole_model_pass(Case& c, kernels::Backend& be,
                                     model::GemmPrecision precision) {
  LossAndGrads r;
  auto mc = model::ModelCompute::create(c.m->geometry, c.T, be, -1, nullptr, precision);
  auto grads = model::GradStorage::create(*c.m);
  EXPECT_TRUE(mc.ok() && grads.ok());
  if (!mc.ok() || !grads.ok()) return r;
  r.loss = forward_backward(**mc, c, (*grads)->grads);
  r.grads = grads_of(**grads);
  return r;
}

// train/stream's per-layer steps on one ModelCompute, with the residual stream between layers
// held here: x(0) the embedding's output, x(l + 1) layer l's, x(L) the head's input, and x(L + 1)
// the scratch a re-forward writes (a backward reads only its layer's input x(l)). Each step
// reports a failure (non-fatal) and returns whether it succeeded, so a caller can ASSERT on it.
class PerLayerRun {
 public:
  PerLayerRun(model::ModelCompute& m, const Case& c, const model::ModelGrads& g)
      : m_(m),
        c_(c),
        g_(g),
        L_(c.m->geometry.layers),
        C_(c.m->geometry.hidden),
        x_(static_cast<std::size_t>(L_ + 2),
           std::vector<float>(static_cast<std::size_t>(c.T * C_))) {}

  TensorView x(int i) {
    return TensorView::contiguous(x_[static_cast<std::size_t>(i)].data(), DType::kF32, Device::kCpu,
                                  {c_.T, C_});
  }
  // embed, layer_forward for every layer (x(l) -> x(l + 1)), head_forward (loss()), head_backward.
  bool forward() {
    const model::ModelParams& p = c_.m->params;
    bool ok = check(m_.embed(p.embed, c_.batch, x(0)));
    for (int l = 0; l < L_; ++l)
      ok &= check(m_.layer_forward(l, p.layers[l], c_.batch, x(l), x(l + 1)));
    auto head = m_.head_forward(p.final_norm, p.lm_head, c_.batch, x(L_));
    ok &= check(head.status());
    loss_ = head.ok() ? head->loss_sum : 0.0;
    ok &= check(
        m_.head_backward(p.final_norm, p.lm_head, g_.final_norm, g_.lm_head, c_.batch, x(L_)));
    return ok;
  }
  // Layer l's internals again from x(l) (what train/stream runs before the backward of a layer
  // not kept: layer_forward_internals, no output).
  bool reforward(int l) {
    return check(m_.layer_forward_internals(l, c_.m->params.layers[l], c_.batch, x(l)));
  }
  // The same by the whole layer_forward, its output into a scratch (what the executor ran before
  // layer_forward_internals existed; the twin the internals-only path is compared with).
  bool reforward_full(int l) {
    return check(m_.layer_forward(l, c_.m->params.layers[l], c_.batch, x(l), x(L_ + 1)));
  }
  bool backward(int l) {
    return check(m_.layer_backward(l, c_.m->params.layers[l], g_.layers[l], c_.batch, x(l)));
  }
  bool embed_backward() { return check(m_.embed_backward(g_.embed, c_.batch)); }
  double loss() const { return loss_; }

 private:
  static bool check(const Status& s) {
    EXPECT_TRUE(s.ok()) << s.to_string();
    return s.ok();
  }

  model::ModelCompute& m_;
  const Case& c_;
  const model::ModelGrads& g_;
  const int L_;
  const std::int64_t C_;
  std::vector<std::vector<float>> x_;
  double loss_ = 0.0;
};

}  // namespace ferry::testing
