// SPDX-License-Identifier: Apache-2.0
// The small-m GEMM's pipelined loop (gemm_small_m.cu, SmallMLoop::kPipelined) gives
// the bits of its one-step loop (kOneStep, the loop before it) — the single-output kernel with
// f32 and bf16 weights and the multi-output kernel, m = 1..4, over shapes where no lane, some
// lanes or every lane runs whole groups of loads (k / 4 below, around and above 32 x 8 vector
// steps), the scalar loop (k or a leading dimension not a multiple of 4), bias, alpha and beta.
// Accuracy against f64 is the default path's test in kernels_dense_test.cpp and
// serve_dense_bf16_gpu_test.cpp (the pipelined loop by default; FERRY_SMALL_M_PIPELINE=0: the
// other); this one pins the two loops to each other. Skips, saying so, without a CUDA device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/launchers.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry {
namespace {

using kernels::cuda::SmallMGemmOutput;
using kernels::cuda::SmallMLoop;
using testing::CudaTest;
using testing::DeviceBuf;

class KernelsSmallMLoop : public CudaTest {};

struct Shape {
  std::int64_t n, k, pad;  // pad: extra elements per row of a, b and out (0: contiguous)
};
// A lane (0..31) runs a whole group of 8 steps of its stride when lane + 224 < k / 4. k / 4 =
// 224 (no lane does), 255 (lanes 0..30), 256 (every lane, one group exactly), 300 (one group, then
// a one-step tail), 512 / 1024 (Qwen3's q/k/v and o: several groups), 777 (groups, then a tail for
// lanes 0..8 only); the scalar loop (k not a multiple of 4, or a pad of 1): k = 4099, 1001, 2048.
const Shape kShapes[] = {{48, 896, 0},   {96, 1020, 0}, {64, 1024, 0}, {40, 1200, 0},
                         {520, 2048, 0}, {33, 4096, 0}, {24, 3108, 4}, {17, 4099, 0},
                         {9, 1001, 0},   {12, 2048, 1}, {5, 16, 0}};

TEST_F(KernelsSmallMLoop, PipelinedLoopGivesTheOneStepLoopsBits) {
  std::mt19937 rng(2039);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int compared = 0;
  for (const Shape& sh : kShapes) {
    for (std::int64_t m = 1; m <= 4; ++m) {
      const std::int64_t n = sh.n, k = sh.k, lda = k + sh.pad, ldb = k + sh.pad, ldo = n + sh.pad;
      std::vector<float> a(static_cast<std::size_t>(m * lda)),
          wf(static_cast<std::size_t>(n * ldb));
      std::vector<float> bias(static_cast<std::size_t>(n)), out0(static_cast<std::size_t>(m * ldo));
      for (auto* v : {&a, &wf, &bias, &out0}) {
        for (float& x : *v) x = nd(rng);
      }
      std::vector<std::uint16_t> wb(wf.size());
      for (std::size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
      DeviceBuf da(a.size() * 4), dwf(wf.size() * 4), dwb(wb.size() * 2), dbias(bias.size() * 4);
      DeviceBuf dout(out0.size() * 4);
      testing::up(da.p, a);
      testing::up(dwf.p, wf);
      testing::up(dwb.p, wb);
      testing::up(dbias.p, bias);
      for (int variant = 0; variant < 2; ++variant) {
        // 0: plain; 1: bias, alpha 0.5, beta 0.75 on a prefilled out.
        const float* bp = variant == 1 ? dbias.as<float>() : nullptr;
        const float alpha = variant == 1 ? 0.5f : 1.0f, beta = variant == 1 ? 0.75f : 0.0f;
        for (int wt = 0; wt < 2; ++wt) {
          std::vector<float> got[2];
          for (int loop = 0; loop < 2; ++loop) {
            const SmallMLoop l = loop == 0 ? SmallMLoop::kOneStep : SmallMLoop::kPipelined;
            testing::up(dout.p, out0);
            const cudaError_t e =
                wt == 0 ? kernels::cuda::launch_small_m_gemm_f32(
                              dout.as<float>(), da.as<float>(), dwf.as<float>(), bp, m, n, k, lda,
                              ldb, ldo, alpha, beta, raw_stream(), l)
                        : kernels::cuda::launch_small_m_gemm_bf16w(
                              dout.as<float>(), da.as<float>(), dwb.as<std::uint16_t>(), bp, m, n,
                              k, lda, ldb, ldo, alpha, beta, raw_stream(), l);
            ASSERT_EQ(e, cudaSuccess);
            sync();
            got[loop] = testing::down<float>(dout.p, out0.size());
          }
          ASSERT_TRUE(testing::same_bits(got[0], got[1]))
              << "m=" << m << " n=" << n << " k=" << k << " pad=" << sh.pad
              << (wt == 0 ? " f32" : " bf16") << " variant " << variant;
          EXPECT_FALSE(testing::same_bits(got[0], out0)) << "the launch wrote nothing";
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int>(std::size(kShapes)) * 4 * 2 * 2);
}

// q/k/v in one launch (the decode fusion), Qwen3-30B-A3B's widths and a scalar-loop case.
TEST_F(KernelsSmallMLoop, MultiOutputPipelinedLoopGivesTheOneStepLoopsBits) {
  std::mt19937 rng(2040);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    std::int64_t k;
    std::int64_t n[3];
  };
  const Case cases[] = {{2048, {4096, 512, 512}}, {1200, {64, 40, 8}}, {1001, {33, 7, 9}}};
  for (const Case& c : cases) {
    for (std::int64_t m = 1; m <= 4; ++m) {
      for (int wt = 0; wt < 2; ++wt) {
        const std::size_t esz = wt == 0 ? 4 : 2;
        std::vector<float> a(static_cast<std::size_t>(m * c.k));
        for (float& x : a) x = nd(rng);
        DeviceBuf da(a.size() * 4);
        testing::up(da.p, a);
        std::vector<std::unique_ptr<DeviceBuf>> w, out;
        SmallMGemmOutput outs[3];
        for (int o = 0; o < 3; ++o) {
          const std::size_t numel = static_cast<std::size_t>(c.n[o] * c.k);
          w.push_back(std::make_unique<DeviceBuf>(numel * esz));
          out.push_back(std::make_unique<DeviceBuf>(static_cast<std::size_t>(m * c.n[o]) * 4));
          std::vector<float> wf(numel);
          for (float& x : wf) x = nd(rng);
          if (wt == 0) {
            testing::up(w.back()->p, wf);
          } else {
            std::vector<std::uint16_t> wb(numel);
            for (std::size_t i = 0; i < numel; ++i) wb[i] = f32_to_bf16(wf[i]);
            testing::up(w.back()->p, wb);
          }
          outs[o] = {.out = out.back()->as<float>(),
                     .b = w.back()->p,
                     .bias = nullptr,
                     .n = c.n[o],
                     .ldb = c.k,
                     .ldo = c.n[o]};
        }
        std::vector<float> got[2][3];
        for (int loop = 0; loop < 2; ++loop) {
          const SmallMLoop l = loop == 0 ? SmallMLoop::kOneStep : SmallMLoop::kPipelined;
          for (int o = 0; o < 3; ++o) {
            ASSERT_EQ(cudaMemsetAsync(out[o]->p, 0xff, static_cast<std::size_t>(m * c.n[o]) * 4,
                                      raw_stream()),
                      cudaSuccess);
          }
          const cudaError_t e =
              wt == 0 ? kernels::cuda::launch_small_m_gemm_multi_f32(
                            outs, 3, da.as<float>(), m, c.k, c.k, 1.0f, 0.0f, raw_stream(), l)
                      : kernels::cuda::launch_small_m_gemm_multi_bf16w(
                            outs, 3, da.as<float>(), m, c.k, c.k, 1.0f, 0.0f, raw_stream(), l);
          ASSERT_EQ(e, cudaSuccess);
          sync();
          for (int o = 0; o < 3; ++o) {
            got[loop][o] = testing::down<float>(out[o]->p, static_cast<std::size_t>(m * c.n[o]));
          }
        }
        for (int o = 0; o < 3; ++o) {
          ASSERT_TRUE(testing::same_bits(got[0][o], got[1][o]))
              << "k=" << c.k << " output " << o << " m=" << m << (wt == 0 ? " f32" : " bf16");
          // 0xff bytes are a NaN; every element must have been written.
          for (float x : got[1][o]) ASSERT_FALSE(std::isnan(x)) << "an element was not written";
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry
