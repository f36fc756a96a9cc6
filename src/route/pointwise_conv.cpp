// SPDX-License-Identifier: Apache-2.0
// Pointwise (1x1) convolution kernels (see pointwise_conv.h).
#include "route/pointwise_conv.h"

#include <algorithm>

#include <immintrin.h>

#include "core/check.h"

namespace ferry::route {
namespace {

void check_args(const PointwiseConvArgs& a) {
  FERRY_CHECK(a.in != nullptr && a.weight_t != nullptr && a.out != nullptr,
              "route: pointwise conv: null pointer");
  FERRY_CHECK(a.in_channels >= 1 && a.out_channels >= 1 && a.pixels >= 1,
              "route: pointwise conv: bad shape C_in={} C_out={} P={}", a.in_channels,
              a.out_channels, a.pixels);
}

// Output channels [co_begin, co_end) x pixels [p_begin, p_end): the scalar body. Each output row
// segment starts at the bias and gets one input channel added per pass, so the inner loop runs
// over contiguous pixels (and the compiler may vectorise it with the baseline SSE2; the sum order
// per output stays bias, then channel 0, 1, ...).
void block_scalar(const PointwiseConvArgs& a, int co_begin, int co_end, int p_begin, int p_end) {
  const std::size_t pixels = static_cast<std::size_t>(a.pixels);
  for (int co = co_begin; co < co_end; ++co) {
    float* o = a.out + static_cast<std::size_t>(co) * pixels;
    const float b = a.bias != nullptr ? a.bias[co] : 0.0f;
    for (int p = p_begin; p < p_end; ++p) o[p] = b;
    for (int ci = 0; ci < a.in_channels; ++ci) {
      const float w = a.weight_t[static_cast<std::size_t>(ci) * a.out_channels + co];
      const float* x = a.in + static_cast<std::size_t>(ci) * pixels;
      for (int p = p_begin; p < p_end; ++p) o[p] += w * x[p];
    }
    for (int p = p_begin; p < p_end; ++p) o[p] = std::min(std::max(o[p], a.clamp_min), a.clamp_max);
  }
}

// ---- AVX2 + FMA: tiles of kRows output channels x kVecs vectors of 8 pixels ----

// 4 x 3 accumulators + 3 inputs + 1 broadcast = 16 ymm registers. 4 divides every C_out of the
// skip estimator (16..576), so the narrower row tiles only run for other nets.
constexpr int kAvx2Rows = 4;
constexpr int kAvx2Vecs = 3;

template <int kRows, int kVecs>
__attribute__((target("avx2,fma"))) void tile_avx2(const PointwiseConvArgs& a, int co, int p) {
  const std::size_t pixels = static_cast<std::size_t>(a.pixels);
  __m256 acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m256 b = _mm256_set1_ps(a.bias != nullptr ? a.bias[co + r] : 0.0f);
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) acc[r][v] = b;
  }
  const float* x = a.in + p;
  const float* w = a.weight_t + co;
  for (int ci = 0; ci < a.in_channels; ++ci, x += pixels, w += a.out_channels) {
    __m256 xv[kVecs];
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) xv[v] = _mm256_loadu_ps(x + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m256 wr = _mm256_broadcast_ss(w + r);
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_fmadd_ps(wr, xv[v], acc[r][v]);
    }
  }
  const __m256 lo = _mm256_set1_ps(a.clamp_min), hi = _mm256_set1_ps(a.clamp_max);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    float* o = a.out + static_cast<std::size_t>(co + r) * pixels + p;
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      _mm256_storeu_ps(o + 8 * v, _mm256_min_ps(_mm256_max_ps(acc[r][v], lo), hi));
    }
  }
}

// tile_avx2<rows, vecs> for run-time rows in [1, kAvx2Rows] and vecs in [1, kAvx2Vecs].
template <int kRows>
void tile_avx2_vecs(const PointwiseConvArgs& a, int co, int p, int vecs) {
  switch (vecs) {
    case 1:
      return tile_avx2<kRows, 1>(a, co, p);
    case 2:
      return tile_avx2<kRows, 2>(a, co, p);
    case 3:
      return tile_avx2<kRows, 3>(a, co, p);
    default:
      FERRY_CHECK(false, "route: pointwise conv: avx2 tile of {} vectors", vecs);
  }
}
void tile_avx2_dispatch(const PointwiseConvArgs& a, int co, int p, int rows, int vecs) {
  switch (rows) {
    case 1:
      return tile_avx2_vecs<1>(a, co, p, vecs);
    case 2:
      return tile_avx2_vecs<2>(a, co, p, vecs);
    case 3:
      return tile_avx2_vecs<3>(a, co, p, vecs);
    case 4:
      return tile_avx2_vecs<4>(a, co, p, vecs);
    default:
      FERRY_CHECK(false, "route: pointwise conv: avx2 tile of {} rows", rows);
  }
}

// ---- AVX-512F: tiles of kRows output channels x kVecs vectors of 16 pixels, last one masked ----

// 6 x 4 accumulators (64 pixels: a whole 8x8 plane) + 4 inputs + 1 broadcast = 29 of 32 zmm.
// Measured against 4x4, 8x2, 8x3 and 6x3 tiles on the net's shapes (scratch program, 2026-11-30,
// docs/route_estimators.md): 6x4 was fastest, ~15 % under 4x4 in sum, all of it on the layers
// with 1024-4096 pixels. C_out % 6 != 0 (16, 32, 64 here) ends with a narrower row tile.
constexpr int kAvx512Rows = 6;
constexpr int kAvx512Vecs = 4;

// min(max(v, lo), hi). NOTE: the maskz forms with a full mask instead of _mm512_max_ps /
// _mm512_min_ps: GCC 12's headers build those on _mm512_undefined_ps, which -Wuninitialized flags
// (a false positive that -Werror turns into a failed build).
__attribute__((target("avx512f"))) inline __m512 clamp_avx512(__m512 v, __m512 lo, __m512 hi) {
  constexpr __mmask16 kAll = 0xFFFF;
  return _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, v, lo), hi);
}

template <int kRows, int kVecs>
__attribute__((target("avx512f"))) void tile_avx512(const PointwiseConvArgs& a, int co, int p,
                                                    __mmask16 last) {
  const std::size_t pixels = static_cast<std::size_t>(a.pixels);
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 b = _mm512_set1_ps(a.bias != nullptr ? a.bias[co + r] : 0.0f);
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) acc[r][v] = b;
  }
  const float* x = a.in + p;
  const float* w = a.weight_t + co;
  for (int ci = 0; ci < a.in_channels; ++ci, x += pixels, w += a.out_channels) {
    __m512 xv[kVecs];
#pragma GCC unroll 8
    for (int v = 0; v + 1 < kVecs; ++v) xv[v] = _mm512_loadu_ps(x + 16 * v);
    xv[kVecs - 1] = _mm512_maskz_loadu_ps(last, x + 16 * (kVecs - 1));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 wr = _mm512_set1_ps(w[r]);
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_fmadd_ps(wr, xv[v], acc[r][v]);
    }
  }
  const __m512 lo = _mm512_set1_ps(a.clamp_min), hi = _mm512_set1_ps(a.clamp_max);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    float* o = a.out + static_cast<std::size_t>(co + r) * pixels + p;
#pragma GCC unroll 8
    for (int v = 0; v + 1 < kVecs; ++v) {
      _mm512_storeu_ps(o + 16 * v, clamp_avx512(acc[r][v], lo, hi));
    }
    _mm512_mask_storeu_ps(o + 16 * (kVecs - 1), last, clamp_avx512(acc[r][kVecs - 1], lo, hi));
  }
}

// tile_avx512<rows, vecs> for run-time rows in [1, kAvx512Rows] and vecs in [1, kAvx512Vecs].
template <int kRows>
void tile_avx512_vecs(const PointwiseConvArgs& a, int co, int p, int vecs, __mmask16 last) {
  switch (vecs) {
    case 1:
      return tile_avx512<kRows, 1>(a, co, p, last);
    case 2:
      return tile_avx512<kRows, 2>(a, co, p, last);
    case 3:
      return tile_avx512<kRows, 3>(a, co, p, last);
    case 4:
      return tile_avx512<kRows, 4>(a, co, p, last);
    default:
      FERRY_CHECK(false, "route: pointwise conv: avx512 tile of {} vectors", vecs);
  }
}
void tile_avx512_dispatch(const PointwiseConvArgs& a, int co, int p, int rows, int vecs,
                          __mmask16 last) {
  switch (rows) {
    case 1:
      return tile_avx512_vecs<1>(a, co, p, vecs, last);
    case 2:
      return tile_avx512_vecs<2>(a, co, p, vecs, last);
    case 3:
      return tile_avx512_vecs<3>(a, co, p, vecs, last);
    case 4:
      return tile_avx512_vecs<4>(a, co, p, vecs, last);
    case 5:
      return tile_avx512_vecs<5>(a, co, p, vecs, last);
    case 6:
      return tile_avx512_vecs<6>(a, co, p, vecs, last);
    default:
      FERRY_CHECK(false, "route: pointwise conv: avx512 tile of {} rows", rows);
  }
}

}  // namespace

void pointwise_conv_transpose_weights(const float* weight, int out_channels, int in_channels,
                                      float* weight_t) {
  for (int co = 0; co < out_channels; ++co) {
    for (int ci = 0; ci < in_channels; ++ci) {
      weight_t[static_cast<std::size_t>(ci) * out_channels + co] =
          weight[static_cast<std::size_t>(co) * in_channels + ci];
    }
  }
}

void pointwise_conv_scalar(const PointwiseConvArgs& a) {
  check_args(a);
  block_scalar(a, 0, a.out_channels, 0, a.pixels);
}

void pointwise_conv_avx2(const PointwiseConvArgs& a) {
  FERRY_CHECK(pointwise_conv_have_avx2(), "route: pointwise conv: cpu lacks avx2/fma");
  check_args(a);
  constexpr int kTilePixels = 8 * kAvx2Vecs;
  for (int p = 0; p < a.pixels; p += kTilePixels) {
    const int n = std::min(kTilePixels, a.pixels - p);
    const int vecs = n / 8;  // full vectors; the n % 8 pixels after them go to the scalar body
    for (int co = 0; co < a.out_channels; co += kAvx2Rows) {
      const int rows = std::min(kAvx2Rows, a.out_channels - co);
      if (vecs > 0) tile_avx2_dispatch(a, co, p, rows, vecs);
      if (n % 8 != 0) block_scalar(a, co, co + rows, p + 8 * vecs, p + n);
    }
  }
}

void pointwise_conv_avx512(const PointwiseConvArgs& a) {
  FERRY_CHECK(pointwise_conv_have_avx512(), "route: pointwise conv: cpu lacks avx512f");
  check_args(a);
  constexpr int kTilePixels = 16 * kAvx512Vecs;
  for (int p = 0; p < a.pixels; p += kTilePixels) {
    const int n = std::min(kTilePixels, a.pixels - p);
    const int vecs = (n + 15) / 16;
    const __mmask16 last =
        n % 16 == 0 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n % 16)) - 1);
    for (int co = 0; co < a.out_channels; co += kAvx512Rows) {
      const int rows = std::min(kAvx512Rows, a.out_channels - co);
      tile_avx512_dispatch(a, co, p, rows, vecs, last);
    }
  }
}

bool pointwise_conv_have_avx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have;
}

bool pointwise_conv_have_avx512() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}

void pointwise_conv(const PointwiseConvArgs& a) {
  if (pointwise_conv_have_avx512()) {
    pointwise_conv_avx512(a);
  } else if (pointwise_conv_have_avx2()) {
    pointwise_conv_avx2(a);
  } else {
    pointwise_conv_scalar(a);
  }
}

const char* pointwise_conv_isa() {
  if (pointwise_conv_have_avx512()) return "avx512";
  if (pointwise_conv_have_avx2()) return "avx2";
  return "scalar";
}

}  // namespace ferry::route
