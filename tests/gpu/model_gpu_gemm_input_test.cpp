// SPDX-License-Identifier: Apache-2.0
// ModelCompute's GEMM input reuse (model::gemm_input_reuse_default(), FERRY_GEMM_INPUT_REUSE) on
// the CUDA backend with bf16 GEMMs: each activation several GEMMs read is rounded once per pass,
// the forward's norms write the q/k/v and gate/up operands (RmsNormArgs::out16) and the SwiGLU
// kernel the down projection's (SwiGluArgs::out16), and a layer's
// backward right after its own forward reuses it. Rounding is deterministic and the GEMMs read the
// same buffer (gemm.x16, same alignment), so the loss, the nll and every gradient must be the same
// bits with the reuse on and off — on the whole-model path and on train/stream's per-layer path
// (forward, recompute, backward), plus an order where a stale copy would be read if its key were
// wrong (two layer workspaces, layer 0's backward after layer 1's forward, then a second backward
// of layer 1). The converts counted drop (exactly, for the dense fixtures). The CPU twin of this
// test: tests/unit/model/model_compute_gemm_input_test.cpp. Skips without a CUDA device.
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {
namespace {

using model::ModelCompute;
using model::PackedBatch;

class ModelGpuGemmInputReuse : public CudaTest {};

// Device copies of a fixture's parameters, batch and a gradient set per run.
struct DeviceModel {
  std::unique_ptr<model::LoadedModel> m;
  std::optional<model::SafetensorsFile> expected;
  std::map<const void*, DeviceTensor> params;  // host param data -> device copy
  model::ModelParams dp;
  std::vector<DeviceTensor> batch_bufs;
  PackedBatch batch;
  std::int64_t T = 0;
};

void load(const std::string& arch, DeviceModel* d) {
  auto loaded = model::load_model_f32(model_fixture_dir(arch));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  d->m = std::move(*loaded);
  auto e = model::SafetensorsFile::open(model_fixture_dir(arch) + "/expected.safetensors");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  d->expected.emplace(std::move(*e));
  for (const auto& [name, v] : d->m->named) {
    if (d->params.count(v.data) != 0) continue;
    HostTensor h(std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + v.ndim), DType::kF32);
    ASSERT_TRUE(convert_elements(v.data, v.dtype, h.data(), DType::kF32,
                                 static_cast<std::size_t>(v.numel())));
    d->params.emplace(v.data, DeviceTensor(h));
  }
  auto on_device = [&](ConstTensorView& v) {
    if (v.data == nullptr) return;
    auto it = d->params.find(v.data);
    ASSERT_NE(it, d->params.end());
    v.data = it->second.data();
    v.device = Device::kCuda;
  };
  d->dp = d->m->params;
  on_device(d->dp.embed);
  on_device(d->dp.final_norm);
  on_device(d->dp.lm_head);
  for (auto& l : d->dp.layers) {
    for (ConstTensorView* v :
         {&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias,
          &l.q_norm, &l.k_norm, &l.mlp_norm, &l.gate, &l.up, &l.down, &l.router})
      on_device(*v);
    for (auto* list : {&l.expert_gate, &l.expert_up, &l.expert_down})
      for (ConstTensorView& v : *list) on_device(v);
  }
  ConstTensorView* fields[] = {&d->batch.ids, &d->batch.positions, &d->batch.cu_seqlens,
                               &d->batch.targets};
  const char* names[] = {"input_ids", "positions", "cu_seqlens", "targets"};
  d->batch_bufs.reserve(4);
  for (int i = 0; i < 4; ++i) {
    auto v = d->expected->view(names[i]);
    ASSERT_TRUE(v.ok()) << names[i];
    HostTensor h(std::vector<std::int64_t>(v->shape.begin(), v->shape.begin() + v->ndim), v->dtype);
    std::memcpy(h.data(), v->data, v->bytes());
    d->batch_bufs.emplace_back(h);
    *fields[i] = d->batch_bufs.back().cview();
  }
  d->T = d->batch.ids.numel();
}

// Zeroed device gradients (tied views share one buffer), downloadable by name.
struct DeviceGrads {
  std::map<const void*, DeviceTensor> bufs;
  std::vector<std::pair<std::string, const DeviceTensor*>> named;
  model::ModelGrads grads;
  std::map<std::string, std::vector<std::uint32_t>> bits() const {
    std::map<std::string, std::vector<std::uint32_t>> out;
    for (const auto& [name, d] : named) {
      const HostTensor g = d->download();
      out[name].resize(static_cast<std::size_t>(g.numel()));
      std::memcpy(out[name].data(), g.data(), out[name].size() * 4);
    }
    return out;
  }
};

void make_grads(const model::LoadedModel& m, DeviceGrads* dg) {
  auto host = model::GradStorage::create(m);
  ASSERT_TRUE(host.ok());
  for (const auto& [name, g] : (*host)->named) {
    auto it = dg->bufs.find(g.data);
    if (it == dg->bufs.end()) {
      it = dg->bufs
               .emplace(g.data,
                        DeviceTensor(HostTensor(
                            std::vector<std::int64_t>(g.shape.begin(), g.shape.begin() + g.ndim),
                            DType::kF32)))
               .first;
    }
    dg->named.emplace_back(name, &it->second);
  }
  auto on_device = [&](TensorView& v) {
    if (v.data == nullptr) return;
    auto it = dg->bufs.find(v.data);
    ASSERT_NE(it, dg->bufs.end());
    v.data = it->second.data();
    v.device = Device::kCuda;
  };
  dg->grads = (*host)->grads;
  on_device(dg->grads.embed);
  on_device(dg->grads.final_norm);
  on_device(dg->grads.lm_head);
  for (auto& l : dg->grads.layers) {
    for (TensorView* v :
         {&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias,
          &l.q_norm, &l.k_norm, &l.mlp_norm, &l.gate, &l.up, &l.down, &l.router})
      on_device(*v);
    for (auto* list : {&l.expert_gate, &l.expert_up, &l.expert_down})
      for (TensorView& v : *list) on_device(v);
  }
}

struct Outcome {
  std::vector<double> losses;
  std::map<std::string, std::vector<std::uint32_t>> grads;
  std::uint64_t converts = 0;
};

void expect_same(const Outcome& on, const Outcome& off, const std::string& what) {
  ASSERT_EQ(on.losses.size(), off.losses.size()) << what;
  for (std::size_t i = 0; i < on.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&on.losses[i], &off.losses[i], sizeof(double)), 0) << what << " " << i;
  for (const auto& [name, bits] : off.grads)
    EXPECT_EQ(on.grads.at(name), bits) << what << ": gradient " << name;
}

TEST_F(ModelGpuGemmInputReuse, SameBitsOnAndOffWithFewerConverts) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    DeviceModel d;
    load(arch, &d);
    ASSERT_FALSE(HasFailure());
    const int L = d.m->geometry.layers;
    const std::int64_t C = d.m->geometry.hidden;
    bool dense = true;
    for (bool moe : d.m->geometry.layer_is_moe) dense = dense && !moe;
    std::vector<DeviceTensor> x;
    for (int l = 0; l <= L + 1; ++l) x.emplace_back(std::vector<std::int64_t>{d.T, C}, DType::kF32);

    // Whole model.
    auto whole = [&](bool reuse) {
      Outcome o;
      auto mc = ModelCompute::create(d.m->geometry, d.T, cuda(), -1, &stream(),
                                     model::GemmPrecision::kBf16);
      EXPECT_TRUE(mc.ok()) << mc.status().to_string();
      if (!mc.ok()) return o;
      (*mc)->set_gemm_input_reuse(reuse);
      DeviceGrads g;
      make_grads(*d.m, &g);
      auto fwd = (*mc)->forward(d.dp, d.batch);
      EXPECT_TRUE(fwd.ok()) << fwd.status().to_string();
      if (!fwd.ok()) return o;
      o.losses.push_back(fwd->loss_sum);
      EXPECT_TRUE((*mc)->backward(d.dp, d.batch, g.grads).ok());
      sync();
      o.grads = g.bits();
      o.converts = (*mc)->gemm_input_converts();
      return o;
    };
    const Outcome w_off = whole(false), w_on = whole(true);
    expect_same(w_on, w_off, "whole model");
    EXPECT_LT(w_on.converts, w_off.converts);
    if (dense) {
      EXPECT_EQ(w_off.converts, 14u * L);
      // Forward 1 per layer (attn; the norms and SwiGLU write the rest), backward 4, 3 last.
      EXPECT_EQ(w_on.converts, 5u * L - 1);
    }

    // train/stream's order (one workspace: forward, head, then recompute + backward per layer).
    auto per_layer = [&](bool reuse) {
      Outcome o;
      auto mc = ModelCompute::create(d.m->geometry, d.T, cuda(), 1, &stream(),
                                     model::GemmPrecision::kBf16);
      EXPECT_TRUE(mc.ok()) << mc.status().to_string();
      if (!mc.ok()) return o;
      ModelCompute& pl = **mc;
      pl.set_gemm_input_reuse(reuse);
      DeviceGrads g;
      make_grads(*d.m, &g);
      EXPECT_TRUE(pl.embed(d.dp.embed, d.batch, x[0].view()).ok());
      for (int l = 0; l < L; ++l)
        EXPECT_TRUE(
            pl.layer_forward(l, d.dp.layers[l], d.batch, x[l].cview(), x[l + 1].view()).ok());
      auto head = pl.head_forward(d.dp.final_norm, d.dp.lm_head, d.batch, x[L].cview());
      EXPECT_TRUE(head.ok());
      if (!head.ok()) return o;
      o.losses.push_back(head->loss_sum);
      EXPECT_TRUE(pl.head_backward(d.dp.final_norm, d.dp.lm_head, g.grads.final_norm,
                                   g.grads.lm_head, d.batch, x[L].cview())
                      .ok());
      for (int l = L - 1; l >= 0; --l) {
        EXPECT_TRUE(
            pl.layer_forward(l, d.dp.layers[l], d.batch, x[l].cview(), x[L + 1].view()).ok());
        EXPECT_TRUE(
            pl.layer_backward(l, d.dp.layers[l], g.grads.layers[l], d.batch, x[l].cview()).ok());
      }
      EXPECT_TRUE(pl.embed_backward(g.grads.embed, d.batch).ok());
      sync();
      o.grads = g.bits();
      o.converts = pl.gemm_input_converts();
      return o;
    };
    const Outcome p_off = per_layer(false), p_on = per_layer(true);
    expect_same(p_on, p_off, "per layer");
    if (dense) {
      EXPECT_EQ(p_off.converts, 21u * L);
      EXPECT_EQ(p_on.converts, 5u * L);  // 1 + 1 + 3 per layer
    } else {
      EXPECT_LT(p_on.converts, p_off.converts);
    }

    // Stale-copy order: two workspaces; layer 0's backward after layer 1's forward, then layer
    // 1's backward twice.
    if (L < 2) continue;
    auto stale = [&](bool reuse) {
      Outcome o;
      auto mc = ModelCompute::create(d.m->geometry, d.T, cuda(), 2, &stream(),
                                     model::GemmPrecision::kBf16);
      EXPECT_TRUE(mc.ok()) << mc.status().to_string();
      if (!mc.ok()) return o;
      ModelCompute& pl = **mc;
      pl.set_gemm_input_reuse(reuse);
      DeviceGrads g;
      make_grads(*d.m, &g);
      EXPECT_TRUE(pl.embed(d.dp.embed, d.batch, x[0].view()).ok());
      for (int l = 0; l < L; ++l)
        EXPECT_TRUE(
            pl.layer_forward(l, d.dp.layers[l], d.batch, x[l].cview(), x[l + 1].view()).ok());
      EXPECT_TRUE(pl.head_forward(d.dp.final_norm, d.dp.lm_head, d.batch, x[L].cview()).ok());
      EXPECT_TRUE(pl.head_backward(d.dp.final_norm, d.dp.lm_head, g.grads.final_norm,
                                   g.grads.lm_head, d.batch, x[L].cview())
                      .ok());
      EXPECT_TRUE(pl.layer_forward(0, d.dp.layers[0], d.batch, x[0].cview(), x[L + 1].view()).ok());
      EXPECT_TRUE(pl.layer_forward(1, d.dp.layers[1], d.batch, x[1].cview(), x[L + 1].view()).ok());
      EXPECT_TRUE(
          pl.layer_backward(0, d.dp.layers[0], g.grads.layers[0], d.batch, x[0].cview()).ok());
      EXPECT_TRUE(pl.layer_forward(1, d.dp.layers[1], d.batch, x[1].cview(), x[L + 1].view()).ok());
      EXPECT_TRUE(
          pl.layer_backward(1, d.dp.layers[1], g.grads.layers[1], d.batch, x[1].cview()).ok());
      EXPECT_TRUE(
          pl.layer_backward(1, d.dp.layers[1], g.grads.layers[1], d.batch, x[1].cview()).ok());
      sync();
      o.grads = g.bits();
      o.converts = pl.gemm_input_converts();
      return o;
    };
    const Outcome s_off = stale(false), s_on = stale(true);
    expect_same(s_on, s_off, "stale-copy order");
    if (dense) {
      EXPECT_EQ(s_off.converts - s_on.converts, 6u * (L + 3) + 3u + 4u + 3u);
    }
  }
}

}  // namespace
}  // namespace ferry::testing
