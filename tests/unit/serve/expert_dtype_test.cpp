// SPDX-License-Identifier: Apache-2.0
// bf16 routed experts (PagerConfig::expert_dtype, docs/serve.md "CUDA path"), the CPU side:
//   - the ExpertStore's bf16 blocks are the model's weights rounded to nearest even, at half the
//     f32 store's bytes, and a pager over that store copies exactly those bytes into its slots;
//   - other dtypes are refused; the CPU engine refuses bf16 (its resident mode reads f32 views)
//     with a Status naming the CUDA engine, never an abort;
//   - the spellings the CLI accepts.
// The arithmetic on bf16 weights is checked in kernels_test (CPU twin) and on the GPU in
// tests/gpu/serve_gpu_test.cpp (kernel vs twin, mode identity, engine vs f32 on rounded weights).
#include <cstring>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "serve/engine.h"
#include "serve/expert_pager.h"
#include "serve/expert_store.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

TEST(ExpertDtype, Bf16StoreHoldsTheRoundedWeightsAtHalfTheBytes) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  auto f32 = ExpertStore::create(m->geometry, m->params);
  auto bf16 = ExpertStore::create(m->geometry, m->params, DType::kBF16);
  ASSERT_TRUE(f32.ok() && bf16.ok()) << bf16.status().to_string();
  EXPECT_EQ((*bf16)->dtype(), DType::kBF16);
  EXPECT_EQ(2 * (*bf16)->expert_bytes(), (*f32)->expert_bytes());
  const std::size_t mat = std::size_t(m->geometry.expert_width) * std::size_t(m->geometry.hidden);
  for (int l = 0; l < m->geometry.layers; ++l) {
    if (!m->geometry.layer_is_moe[l]) continue;
    for (int e = 0; e < m->geometry.experts; ++e) {
      const auto& p = m->params.layers[std::size_t(l)];
      const ExpertRef r = (*bf16)->ref(l, e);
      EXPECT_EQ(r.dtype, DType::kBF16);
      EXPECT_EQ(static_cast<const void*>((*bf16)->block(l, e)), r.gate);
      int part = 0;
      for (const ConstTensorView* v : {&p.expert_gate[e], &p.expert_up[e], &p.expert_down[e]}) {
        const auto* got = static_cast<const std::uint16_t*>(part == 0   ? r.gate
                                                            : part == 1 ? r.up
                                                                        : r.down);
        const auto* src = static_cast<const float*>(v->data);
        for (std::size_t i = 0; i < mat; ++i) {
          ASSERT_EQ(got[i], f32_to_bf16(src[i])) << "layer " << l << " expert " << e;
        }
        ++part;
      }
    }
  }
  // A pager over the bf16 store copies those blocks, expert_bytes() each.
  auto pager = ExpertPager::create(**bf16, {.caps = {3, 3}});
  ASSERT_TRUE(pager.ok()) << pager.status().to_string();
  std::vector<ExpertRef> refs(2);
  const std::vector<std::int32_t> ids = {4, 1};
  ASSERT_TRUE((*pager)->acquire(1, ids, refs).ok());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(refs[i].dtype, DType::kBF16);
    EXPECT_EQ(std::memcmp(refs[i].gate, (*bf16)->block(1, ids[i]), (*bf16)->expert_bytes()), 0);
  }
  EXPECT_EQ((*pager)->counters().bytes_copied, 2 * (*bf16)->expert_bytes());
  (*pager)->release(1);
}

TEST(ExpertDtype, OtherDtypesAndTheCpuEngineAreRefusedWithAStatus) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  auto f16 = ExpertStore::create(m->geometry, m->params, DType::kF16);
  ASSERT_FALSE(f16.ok());
  EXPECT_EQ(f16.status().code(), StatusCode::kInvalidArgument);
  for (ExpertMode mode :
       {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kPaged, ExpertMode::kCpuExperts}) {
    EngineConfig cfg;
    cfg.pager.mode = mode;
    cfg.pager.slots_per_layer = 4;
    cfg.pager.expert_dtype = DType::kBF16;
    auto eng = Engine::create(m->geometry, m->params, cfg, kernels::cpu_backend());
    ASSERT_FALSE(eng.ok()) << to_string(mode);
    EXPECT_EQ(eng.status().code(), StatusCode::kUnimplemented) << eng.status().to_string();
    EXPECT_NE(eng.status().message().find("CUDA engine"), std::string::npos)
        << eng.status().message();
  }
}

TEST(ExpertDtype, Spellings) {
  EXPECT_EQ(*parse_expert_dtype("f32"), DType::kF32);
  EXPECT_EQ(*parse_expert_dtype("bf16"), DType::kBF16);
  for (const char* bad : {"", "BF16", "f16", "fp32"}) {
    auto r = parse_expert_dtype(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ferry::serve
