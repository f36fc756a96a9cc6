// SPDX-License-Identifier: Apache-2.0
// bf16 weight views (bf16_widen.h, docs/train_gpu_executor.md), the parts a CPU can check: which
// parameters a slot reads as bf16 views and where the others go in its f32 part, the landing
// (one H2D into the twin, the f32-read runs widened) run on the CPU backend and host engine, the
// plan's bytes with views (slot16 twins, smaller f32 slots, no stage16), and that the CPU backend
// and the emulated tier keep the converting path whatever is asked. The GPU path itself:
// tests/gpu/train_stream_gpu_test.cpp (TrainStreamGpu.Bf16WeightViews*).
#include <gtest/gtest.h>

#include <cstring>

#include "core/dtype.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

TEST(Bf16WeightViews, OnlyAlignedGemmWeightsAreViews) {
  EXPECT_TRUE(bf16_view_param(true, 0));
  EXPECT_TRUE(bf16_view_param(true, 64));
  EXPECT_FALSE(bf16_view_param(true, 4));  // 8 bytes into the twin: under 16-byte alignment
  EXPECT_FALSE(bf16_view_param(false, 64));
  // norm [8], matrix [8x8] at 8 (view), bias [4], matrix at 76 (under-aligned: widened), norm [8]
  EXPECT_EQ(bf16_view_f32_elements({false, true, false, true, false}, {8, 64, 4, 64, 8}),
            8 + 4 + 64 + 8);
}

// The f32 part of every layer: the non-view parameters packed in order, the runs covering exactly
// them, the router (MoE) among them; the largest is what model_sizes() plans.
void check_layout(const model::LoadedModel& m, const RunSpec& spec) {
  auto state = make_state(m, spec);
  auto arena = HostArena::create(*state, cpu_pinned_tier());
  ASSERT_TRUE(arena.ok()) << arena.status().to_string();
  const HostArena& a = **arena;
  const std::vector<model::ParamSpec> specs = model::param_specs(m.config);
  const Bf16ViewLanding views(kernels::cpu_backend(), a);
  EXPECT_EQ(views.max_f32_elements(), model_sizes(a).max_layer_f32_elements);
  bool saw_view = false;
  for (int l = 0; l < a.globals_unit(); ++l) {
    std::int64_t next = 0;
    for (int idx : a.unit_params(l)) {
      const ParamLoc& p = a.params()[static_cast<std::size_t>(idx)];
      const model::ParamRole role = specs[static_cast<std::size_t>(p.index)].role;
      const std::int64_t at = views.f32_offset(idx);
      if (model::is_gemm_weight_role(role) && p.offset % 8 == 0) {
        EXPECT_EQ(at, -1) << specs[static_cast<std::size_t>(p.index)].hf_name;
        saw_view = true;
      } else {
        EXPECT_EQ(at, next) << specs[static_cast<std::size_t>(p.index)].hf_name;
        next += p.n;
      }
      if (role == model::ParamRole::kRouter || model::is_norm_role(role)) {
        EXPECT_GE(at, 0) << specs[static_cast<std::size_t>(p.index)].hf_name;
      }
    }
    EXPECT_EQ(views.widened_elements(l), next) << "layer " << l;
  }
  EXPECT_TRUE(saw_view);
  for (int idx : a.unit_params(a.globals_unit())) EXPECT_EQ(views.f32_offset(idx), -1);
}

TEST(Bf16WeightViews, SlotLayoutDenseAndMoe) {
  const std::string dir = testing::temp_dir("bf16_views_dense");
  auto dense = dense_model(dir + "/model");
  check_layout(*dense, {.mode = {.master = MasterWeights::kBf16Kahan}});
  auto moe = moe_model();
  check_layout(*moe, {.mode = {.master = MasterWeights::kBf16Sr}});
}

// The landing on the CPU backend and the host engine (the GPU runs the same calls on its h2d
// stream): the twin holds the layer's bf16 bytes, the f32 part the widened f32-read parameters.
TEST(Bf16WeightViews, LandingFillsTheTwinAndWidensTheF32Part) {
  const std::string dir = testing::temp_dir("bf16_views_land");
  auto m = dense_model(dir + "/model");
  auto state = make_state(*m, {.mode = {.master = MasterWeights::kBf16Kahan}});
  auto arena = HostArena::create(*state, cpu_pinned_tier());
  ASSERT_TRUE(arena.ok());
  const HostArena& a = **arena;
  const Bf16ViewLanding views(kernels::cpu_backend(), a);
  mem::Stream& stream = mem::Stream::host();
  for (int l = 0; l < a.globals_unit(); ++l) {
    const std::int64_t n = a.unit_elements(l);
    std::vector<std::uint16_t> twin(static_cast<std::size_t>(n), 0xFFFF);
    std::vector<float> f32(static_cast<std::size_t>(views.max_f32_elements()), -1.0f);
    ASSERT_TRUE(
        views.land(f32.data(), twin.data(), l, a.w16(l), n, mem::host_transfer_engine(), stream)
            .ok());
    ASSERT_TRUE(stream.synchronize().ok());
    EXPECT_EQ(std::memcmp(twin.data(), a.w16(l), static_cast<std::size_t>(n) * 2), 0);
    for (int idx : a.unit_params(l)) {
      const ParamLoc& p = a.params()[static_cast<std::size_t>(idx)];
      const std::int64_t at = views.f32_offset(idx);
      if (at < 0) continue;
      for (std::int64_t k = 0; k < p.n; ++k) {
        ASSERT_EQ(f32[static_cast<std::size_t>(at + k)], bf16_to_f32(a.w16(l)[p.offset + k]))
            << "layer " << l << " param " << idx << " element " << k;
      }
    }
  }
}

// The plan: views change nothing on the CPU backend (no native bf16 GEMM), nor without bf16
// weights or with f32 GEMMs; the executor on the emulated tier reports the converting path.
TEST(Bf16WeightViews, CpuKeepsTheConvertingPath) {
  const std::string dir = testing::temp_dir("bf16_views_cpu");
  auto m = dense_model(dir + "/model");
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  kernels::Backend& be = kernels::cpu_backend();
  auto state = make_state(*m, {.mode = {.master = MasterWeights::kBf16Kahan}});
  auto arena = HostArena::create(*state, cpu_pinned_tier());
  ASSERT_TRUE(arena.ok());
  ModelSizes on = model_sizes(**arena), off = on;
  on.bf16_weight_views = true;
  off.bf16_weight_views = false;
  EXPECT_FALSE(bf16_weight_views(on, be, model::GemmPrecision::kBf16));
  auto p_on = plan_device(m->geometry, on, *pol, 3, kBatch * kSeq, be, model::GemmPrecision::kBf16);
  auto p_off =
      plan_device(m->geometry, off, *pol, 3, kBatch * kSeq, be, model::GemmPrecision::kBf16);
  ASSERT_TRUE(p_on.ok() && p_off.ok());
  EXPECT_FALSE(p_on->bf16_weight_views);
  EXPECT_EQ(p_on->total_bytes(), p_off->total_bytes());
  for (mem::SlotId id : p_on->slots16) EXPECT_EQ(p_on->plan.slot(id).size_bytes, 0u);
  const RunSpec spec{.steps = 1,
                     .mode = {.master = MasterWeights::kBf16Kahan},
                     .gemm_precision = model::GemmPrecision::kBf16,
                     .bf16_weight_views = true};
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult r = run_stream(*m, spec, data, "every:2");
  EXPECT_FALSE(r.bf16_weight_views);
  // The converting path ran: the CPU twin rounds every layer GEMM's weight.
  EXPECT_GT(r.gemm_weight_converts, 0u);
}

}  // namespace
}  // namespace ferry::train::stream
