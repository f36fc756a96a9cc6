// SPDX-License-Identifier: Apache-2.0
// Depthwise 3x3 convolution kernels (see depthwise_conv.h).
#include "route/depthwise_conv.h"

#include <algorithm>
#include <cstring>

#include <immintrin.h>

#include "core/check.h"

namespace ferry::route {
namespace {

constexpr int kVec = 8;  // floats per AVX2 register

// Row pitch of the padded plane: W + 2 columns of data and border, plus slack that the stride-2
// vector loads touch (and discard) past the right border.
int padded_pitch(int width) { return (width + 2 + kVec + kVec - 1) / kVec * kVec; }

void check_args(const DepthwiseConv3x3Args& a) {
  FERRY_CHECK(a.in != nullptr && a.weight != nullptr && a.out != nullptr && a.scratch != nullptr,
              "route: depthwise conv: null pointer");
  FERRY_CHECK(a.channels >= 1 && a.height >= 1 && a.width >= 1,
              "route: depthwise conv: bad shape C={} H={} W={}", a.channels, a.height, a.width);
  FERRY_CHECK(a.stride == 1 || a.stride == 2, "route: depthwise conv: stride {} not 1 or 2",
              a.stride);
}

// Copies plane [H, W] into the scratch plane's interior; the border stays zero (set once per call
// by zero_scratch, never written by copy_plane).
void zero_scratch(const DepthwiseConv3x3Args& a) {
  std::memset(a.scratch, 0, depthwise_conv3x3_scratch_floats(a.height, a.width) * sizeof(float));
}
void copy_plane(const float* plane, int height, int width, int pitch, float* padded) {
  for (int y = 0; y < height; ++y) {
    std::memcpy(padded + static_cast<std::size_t>(y + 1) * pitch + 1,
                plane + static_cast<std::size_t>(y) * width, sizeof(float) * width);
  }
}

// Outputs [x_begin, x_end) of one row from three padded rows p0, p1, p2 (the scalar body).
void row_scalar(const float* p0, const float* p1, const float* p2, const float* w, float b,
                int stride, int x_begin, int x_end, float lo, float hi, float* out) {
  for (int x = x_begin; x < x_end; ++x) {
    const int c = stride * x;
    float acc = b;
    acc += w[0] * p0[c] + w[1] * p0[c + 1] + w[2] * p0[c + 2];
    acc += w[3] * p1[c] + w[4] * p1[c + 1] + w[5] * p1[c + 2];
    acc += w[6] * p2[c] + w[7] * p2[c + 1] + w[8] * p2[c + 2];
    out[x] = std::min(std::max(acc, lo), hi);
  }
}

template <typename RowFn>
void for_each_row(const DepthwiseConv3x3Args& a, RowFn row_fn) {
  check_args(a);
  const int ho = depthwise_conv3x3_out_size(a.height, a.stride);
  const int wo = depthwise_conv3x3_out_size(a.width, a.stride);
  const int pitch = padded_pitch(a.width);
  const std::size_t in_plane = static_cast<std::size_t>(a.height) * a.width;
  const std::size_t out_plane = static_cast<std::size_t>(ho) * wo;
  zero_scratch(a);
  for (int c = 0; c < a.channels; ++c) {
    copy_plane(a.in + c * in_plane, a.height, a.width, pitch, a.scratch);
    const float* w = a.weight + static_cast<std::size_t>(c) * 9;
    const float b = a.bias != nullptr ? a.bias[c] : 0.0f;
    float* out = a.out + c * out_plane;
    for (int y = 0; y < ho; ++y) {
      const float* p0 = a.scratch + static_cast<std::size_t>(a.stride * y) * pitch;
      row_fn(p0, p0 + pitch, p0 + 2 * pitch, w, b, wo, out + static_cast<std::size_t>(y) * wo);
    }
  }
}

// 8 even-indexed floats p[0], p[2], .., p[14] (even = true) or the odd ones p[1], .., p[15].
__attribute__((target("avx2,fma"))) inline __m256 load_stride2(const float* p, bool even) {
  const __m256 lo = _mm256_loadu_ps(p);      // p0..p7
  const __m256 hi = _mm256_loadu_ps(p + 8);  // p8..p15
  // Per 128-bit lane: [lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6]; then 64-bit chunks reordered 0,2,1,3.
  const __m256 s = even ? _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))
                        : _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

// One channel: copies plane [H, W] into the padded scratch (8-float chunks; the border stays
// zero), then computes all output rows with the taps broadcast once.
template <int kStride>
__attribute__((target("avx2,fma"))) void channel_avx2(const DepthwiseConv3x3Args& a, int c,
                                                      int pitch, int ho, int wo) {
  const float* plane = a.in + static_cast<std::size_t>(c) * a.height * a.width;
  const int w_vec = a.width / kVec * kVec;
  for (int y = 0; y < a.height; ++y) {
    const float* src = plane + static_cast<std::size_t>(y) * a.width;
    float* dst = a.scratch + static_cast<std::size_t>(y + 1) * pitch + 1;
    for (int x = 0; x < w_vec; x += kVec) _mm256_storeu_ps(dst + x, _mm256_loadu_ps(src + x));
    for (int x = w_vec; x < a.width; ++x) dst[x] = src[x];
  }
  const float* w = a.weight + static_cast<std::size_t>(c) * 9;
  const float b = a.bias != nullptr ? a.bias[c] : 0.0f;
  float* out = a.out + static_cast<std::size_t>(c) * ho * wo;
  __m256 wv[9];
  for (int k = 0; k < 9; ++k) wv[k] = _mm256_set1_ps(w[k]);
  const __m256 bv = _mm256_set1_ps(b);
  const __m256 lov = _mm256_set1_ps(a.clamp_min), hiv = _mm256_set1_ps(a.clamp_max);
  const int x_vec = wo / kVec * kVec;
  for (int y = 0; y < ho; ++y) {
    const float* p0 = a.scratch + static_cast<std::size_t>(kStride * y) * pitch;
    const float* rows[3] = {p0, p0 + pitch, p0 + 2 * pitch};
    float* o = out + static_cast<std::size_t>(y) * wo;
    for (int x = 0; x < x_vec; x += kVec) {
      __m256 acc = bv;
      for (int i = 0; i < 3; ++i) {
        const float* r = rows[i] + kStride * x;
        if constexpr (kStride == 1) {
          acc = _mm256_fmadd_ps(wv[3 * i + 0], _mm256_loadu_ps(r), acc);
          acc = _mm256_fmadd_ps(wv[3 * i + 1], _mm256_loadu_ps(r + 1), acc);
          acc = _mm256_fmadd_ps(wv[3 * i + 2], _mm256_loadu_ps(r + 2), acc);
        } else {
          acc = _mm256_fmadd_ps(wv[3 * i + 0], load_stride2(r, true), acc);
          acc = _mm256_fmadd_ps(wv[3 * i + 1], load_stride2(r, false), acc);
          acc = _mm256_fmadd_ps(wv[3 * i + 2], load_stride2(r + 2, true), acc);
        }
      }
      _mm256_storeu_ps(o + x, _mm256_min_ps(_mm256_max_ps(acc, lov), hiv));
    }
    row_scalar(rows[0], rows[1], rows[2], w, b, kStride, x_vec, wo, a.clamp_min, a.clamp_max, o);
  }
}

}  // namespace

std::size_t depthwise_conv3x3_scratch_floats(int height, int width) {
  return static_cast<std::size_t>(height + 2) * static_cast<std::size_t>(padded_pitch(width));
}

void depthwise_conv3x3_scalar(const DepthwiseConv3x3Args& a) {
  for_each_row(a, [&](const float* p0, const float* p1, const float* p2, const float* w, float b,
                      int wo, float* out) {
    row_scalar(p0, p1, p2, w, b, a.stride, 0, wo, a.clamp_min, a.clamp_max, out);
  });
}

void depthwise_conv3x3_avx2(const DepthwiseConv3x3Args& a) {
  FERRY_CHECK(depthwise_conv3x3_have_avx2(), "route: depthwise conv: cpu lacks avx2/fma");
  check_args(a);
  const int ho = depthwise_conv3x3_out_size(a.height, a.stride);
  const int wo = depthwise_conv3x3_out_size(a.width, a.stride);
  const int pitch = padded_pitch(a.width);
  zero_scratch(a);
  for (int c = 0; c < a.channels; ++c) {
    if (a.stride == 1) {
      channel_avx2<1>(a, c, pitch, ho, wo);
    } else {
      channel_avx2<2>(a, c, pitch, ho, wo);
    }
  }
}

bool depthwise_conv3x3_have_avx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have;
}

void depthwise_conv3x3(const DepthwiseConv3x3Args& a) {
  if (depthwise_conv3x3_have_avx2()) {
    depthwise_conv3x3_avx2(a);
  } else {
    depthwise_conv3x3_scalar(a);
  }
}

}  // namespace ferry::route
