// SPDX-License-Identifier: Apache-2.0
// The CUDA engine's entry points, as far as a machine without a GPU can check them (the engine
// itself is tested on the device: tests/gpu/serve_gpu_test.cpp): the CUDA runner refuses a CPU
// backend or a host stream, a device executor refuses an incomplete ExpertDevice (miss placement
// included), the KV pool
// reports the tier it was asked for and refuses to resize in GPU memory, and a CPU build's
// cuda_backend() is unavailable (so `--device cuda` fails loudly there).
#include <gtest/gtest.h>

#include "serve/device_ops.h"
#include "serve/model_runner.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

TEST(CudaPath, RunnerRefusesCpuBackendsAndHostStreams) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  auto kv = KvCache::create(m->geometry, {.block_tokens = 4, .budget_bytes = 1 << 20});
  ASSERT_TRUE(kv.ok());
  auto ex = ExpertExecutor::create(m->geometry, m->params, {});
  ASSERT_TRUE(ex.ok());
  EXPECT_FALSE((*ex)->on_device());
  auto r =
      ModelRunner::create_cuda(m->geometry, m->params, **kv, **ex, 8, kernels::cpu_backend(),
                               nullptr, mem::Stream::host(), mem::host_transfer_engine(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  // And the CPU runner still refuses nothing it used to accept.
  EXPECT_TRUE(
      ModelRunner::create(m->geometry, m->params, **kv, **ex, 8, kernels::cpu_backend()).ok());
}

TEST(CudaPath, DeviceExecutorNeedsStreamsAndAnEngine) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  const ExpertDevice incomplete{.max_tokens = 8};
  auto ex = ExpertExecutor::create(m->geometry, m->params, {}, nullptr, &incomplete);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kInvalidArgument) << ex.status().to_string();
  // Miss placement runs on the device path too (expert_executor_cuda.cpp): an incomplete
  // ExpertDevice is refused for it as for any mode, not as unimplemented.
  PagerConfig pc{.mode = ExpertMode::kPaged, .slots_per_layer = 4, .miss_cost_model = true};
  auto px = ExpertExecutor::create(m->geometry, m->params, pc, nullptr, &incomplete);
  ASSERT_FALSE(px.ok());
  EXPECT_EQ(px.status().code(), StatusCode::kInvalidArgument) << px.status().to_string();
}

TEST(CudaPath, KvPoolTierAndLayout) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  const auto& g = m->geometry;
  auto kv = KvCache::create(g, {.block_tokens = 4, .budget_bytes = 1 << 20}, nullptr,
                            mem::MemTier::kPageableHost);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ((*kv)->tier(), mem::MemTier::kPageableHost);
  // The kernels' layout formula names the same rows as k_row / v_row.
  BlockTable t;
  ASSERT_TRUE((*kv)->reserve(t, 9).ok());
  const std::int64_t row = std::int64_t(g.kv_heads) * g.head_dim;
  for (int l = 0; l < g.layers; ++l) {
    for (std::int64_t p : {0, 3, 4, 8}) {
      const std::int64_t blk = t.blocks[std::size_t(p / 4)];
      const float* k =
          (*kv)->base() + l * (*kv)->layer_stride_elems() + (blk * 2) * 4 * row + (p % 4) * row;
      EXPECT_EQ(k, (*kv)->k_row(l, t, p));
      EXPECT_EQ(k + 4 * row, (*kv)->v_row(l, t, p));
    }
  }
}

TEST(CudaPath, CudaBackendUnavailableWithoutCuda) {
#if !FERRY_HAVE_CUDA
  auto be = kernels::cuda_backend(0);
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(device::expert_ffn({}, mem::Stream::host()).code(), StatusCode::kUnavailable);
#else
  GTEST_SKIP() << "CUDA build: the device path is tested in tests/gpu/serve_gpu_test.cpp";
#endif
}

}  // namespace
}  // namespace ferry::serve
