// SPDX-License-Identifier: Apache-2.0
// Pointwise (1x1, stride 1, groups 1) convolution over NCHW float planes with a per-channel bias
// and a clamp (fused ReLU/ReLU6): the layers that OpenCV DNN 4.6 runs at 18-52 GMAC/s in the skip
// estimator and that take ~74 % of its layers' time once the depthwise layers run on ferry's
// kernel (docs/route_estimators.md "Pointwise").
//
// It is a GEMM: out[co][p] = clamp(b[co] + sum_ci w[co][ci] * in[ci][p]) with p over the H*W
// pixels. The weights come transposed, wt = [C_in, C_out], so the rows of one output tile are
// adjacent floats (pointwise_conv_transpose_weights makes them; the layer does it once at load).
// The vector bodies hold a tile of 6 output channels x 4 vectors of 16 pixels (AVX-512) or 4 x 3
// vectors of 8 (AVX2) in registers and run the whole C_in sum there (FMA per input channel,
// broadcast weight), pixel tiles outermost so the tile's input panel [C_in, tile] stays in L1
// while all output channels pass over it. One scalar function does the pixels that do not fill a
// vector and is the fallback without AVX2 (CPUID at run time; the build has no -march flags). Every
// path sums in the same order (bias, then input channels in order); the vector ones round once per
// FMA. Covered by tests/unit/route/pointwise_conv_test.cpp (all paths against a double-precision
// naive loop over swept shapes) and the estimator tests (ferry vs OpenCV per layer and end to end).
#pragma once

#include <cstddef>

namespace ferry::route {

struct PointwiseConvArgs {
  const float* in = nullptr;        // [C_in, P], contiguous (P = H * W)
  const float* weight_t = nullptr;  // [C_in, C_out], contiguous: the weights transposed
  const float* bias = nullptr;      // [C_out], or nullptr for none
  float* out = nullptr;             // [C_out, P], contiguous; must not overlap `in`
  int in_channels = 0;              // C_in >= 1
  int out_channels = 0;             // C_out >= 1
  int pixels = 0;                   // P >= 1
  float clamp_min = -1e30f;         // out = min(max(conv, clamp_min), clamp_max)
  float clamp_max = 1e30f;
};

// weight [C_out, C_in] (OpenCV's [C_out, C_in, 1, 1] blob) -> weight_t [C_in, C_out].
void pointwise_conv_transpose_weights(const float* weight, int out_channels, int in_channels,
                                      float* weight_t);

// Portable scalar path: the fallback and the twin of the vector paths.
void pointwise_conv_scalar(const PointwiseConvArgs& a);
// AVX2+FMA path. Precondition: pointwise_conv_have_avx2().
void pointwise_conv_avx2(const PointwiseConvArgs& a);
// AVX-512F path. Precondition: pointwise_conv_have_avx512().
void pointwise_conv_avx512(const PointwiseConvArgs& a);
bool pointwise_conv_have_avx2();
bool pointwise_conv_have_avx512();
// The widest path the CPU has. Never allocates; single-threaded.
void pointwise_conv(const PointwiseConvArgs& a);
// "avx512", "avx2" or "scalar": what pointwise_conv() runs on this CPU.
const char* pointwise_conv_isa();

}  // namespace ferry::route
