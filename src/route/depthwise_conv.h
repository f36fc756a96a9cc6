// SPDX-License-Identifier: Apache-2.0
// Depthwise 3x3 convolution (pad 1, stride 1 or 2, optional bias and clamp) over NCHW float planes:
// the layer OpenCV DNN 4.6 runs at ~2.4 GMAC/s in the skip estimator (docs/route_estimators.md).
//
// Each channel plane is copied into a zero-bordered scratch plane, so the row loop has no edge
// cases: out[y][x] = b + sum_{i,j<3} w[i][j] * p[s*y + i][s*x + j] with p the padded plane. The
// AVX2+FMA body computes 8 outputs of a row at once (stride 2 deinterleaves even/odd columns in
// registers); one scalar function does the tail and is the fallback when the CPU lacks AVX2
// (chosen at run time by CPUID). Per output both add the bias, then the taps row by row (the
// scalar path sums each row's three products before adding them; AVX2 is one FMA chain).
// Covered by tests/unit/route/depthwise_conv_test.cpp (both paths against a double-precision
// naive loop, odd shapes, both strides).
#pragma once

#include <cstddef>

namespace ferry::route {

struct DepthwiseConv3x3Args {
  const float* in = nullptr;      // [C, H, W], contiguous
  const float* weight = nullptr;  // [C, 3, 3], contiguous
  const float* bias = nullptr;    // [C], or nullptr for none
  float* out = nullptr;           // [C, Ho, Wo], Ho = (H - 1) / stride + 1, Wo likewise
  float* scratch = nullptr;       // depthwise_conv3x3_scratch_floats(H, W) floats, caller-owned
  int channels = 0;               // C >= 1
  int height = 0;                 // H >= 1
  int width = 0;                  // W >= 1
  int stride = 1;                 // 1 or 2
  float clamp_min = -1e30f;       // out = min(max(conv, clamp_min), clamp_max): fused ReLU/ReLU6
  float clamp_max = 1e30f;
};

constexpr int depthwise_conv3x3_out_size(int in, int stride) { return (in - 1) / stride + 1; }

// Floats of scratch the kernel needs for an H x W plane (padded plane plus vector slack).
std::size_t depthwise_conv3x3_scratch_floats(int height, int width);

// Portable scalar path: the fallback and the twin of the vector path.
void depthwise_conv3x3_scalar(const DepthwiseConv3x3Args& a);
// AVX2+FMA path. Precondition: depthwise_conv3x3_have_avx2().
void depthwise_conv3x3_avx2(const DepthwiseConv3x3Args& a);
bool depthwise_conv3x3_have_avx2();
// AVX2 when the CPU has it, else scalar. Never allocates; single-threaded.
void depthwise_conv3x3(const DepthwiseConv3x3Args& a);

}  // namespace ferry::route
