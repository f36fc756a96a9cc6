// SPDX-License-Identifier: Apache-2.0
// ModelCompute's memory plan and stream contract on host backends: planned_bytes() equals what
// create() allocates (one arena, every work_layers value, dense and MoE fixtures); CPU backends
// keep buffers in host memory and never cast attention to bf16; a CUDA stream handed to a CPU
// backend, or a per-layer view on the wrong device, is refused with invalid_argument. The CUDA
// path is tested in tests/gpu/model_gpu_test.cpp; the arithmetic in tests/golden/.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"

namespace ferry::model {
namespace {

std::string fixture_dir(const std::string& arch) { return testing::model_fixture_dir(arch); }

TEST(ModelCompute, PlannedBytesEqualsAllocatedOnHostBackends) {
  for (const char* arch : {"qwen3", "qwen3_moe", "olmoe"}) {
    auto m = load_model_f32(fixture_dir(arch));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const DecoderGeometry& geo = (*m)->geometry;
    for (kernels::Backend* be : {&kernels::cpu_backend(), &kernels::reference_backend()}) {
      for (int work = 1; work <= geo.layers; ++work) {
        for (std::int64_t T : {1, 37, 200}) {
          auto planned = ModelCompute::planned_bytes(geo, T, *be, work);
          ASSERT_TRUE(planned.ok()) << planned.status().to_string();
          auto mc = ModelCompute::create(geo, T, *be, work);
          ASSERT_TRUE(mc.ok()) << mc.status().to_string();
          EXPECT_EQ(*planned, (*mc)->total_bytes()) << arch << " work " << work << " T " << T;
          EXPECT_GT((*mc)->total_bytes(), (*mc)->activation_bytes());
          EXPECT_EQ((*mc)->buffer_device(), Device::kCpu);
          EXPECT_FALSE((*mc)->attention_in_bf16()) << be->name();
        }
      }
    }
  }
}

TEST(ModelCompute, RefusesStreamsAndViewsOfAnotherDevice) {
  auto m = load_model_f32(fixture_dir("qwen2"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const DecoderGeometry& geo = (*m)->geometry;
  // A (fake, never used) CUDA stream for a CPU backend.
  mem::Stream cuda_stream(Device::kCuda, 0, nullptr);
  EXPECT_EQ(ModelCompute::create(geo, 8, kernels::cpu_backend(), -1, &cuda_stream).status().code(),
            StatusCode::kInvalidArgument);
  auto mc = ModelCompute::create(geo, 8, kernels::cpu_backend(), 1, &mem::Stream::host());
  ASSERT_TRUE(mc.ok()) << mc.status().to_string();
  // A per-layer boundary that claims to be GPU memory is refused before any kernel runs.
  std::vector<std::int32_t> ids(8, 1), pos(8, 0), cu = {0, 8};
  std::vector<float> x(static_cast<std::size_t>(8 * geo.hidden), 0.0f);
  const PackedBatch batch{
      .ids = ConstTensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {8}),
      .positions = ConstTensorView::contiguous(pos.data(), DType::kI32, Device::kCpu, {8}),
      .cu_seqlens = ConstTensorView::contiguous(cu.data(), DType::kI32, Device::kCpu, {2})};
  const TensorView on_gpu =
      TensorView::contiguous(x.data(), DType::kF32, Device::kCuda, {8, geo.hidden});
  EXPECT_EQ((*mc)->embed((*m)->params.embed, batch, on_gpu).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::model
