// SPDX-License-Identifier: Apache-2.0
// ExpertFfnGrouped (expert_ffn_fast.h). Layout of this file: the three dot-product variants
// (NR weight rows x NT tokens at once, each (row, token) pair with its own accumulators, so the
// pair's bits do not depend on NR, NT or which pair shares the pass), then the two phases' row
// spans, then the grouping and the threading.
// Built with -ffp-contract=off (src/serve/CMakeLists.txt): the scalar tails are plain
// multiply-adds in source order on every target.
#include "serve/expert_ffn_fast.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

// GCC 12 -O3 false positive inside avx512fintrin.h; see kernels/cpu/simd_adamw.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "core/check.h"
#include "core/thread_pool.h"

namespace ferry::serve {
namespace {

using kernels::cpu::Isa;

// Software prefetch, kPrefetchBytes ahead of each weight stream into L2 (one per 64-byte line):
// rows are back to back in a matrix, so it runs on into the stream's next rows. A bf16 row of
// C = 2048 is one 4 KiB page, where the hardware prefetchers stop; without this one core
// streamed its experts at ~15 GB per CPU-second against ~24 for a plain read of the same bytes
// (AMD EPYC sandbox, cpu_expert_ffn_bench); with it ~21. Distances of 4-16 KiB measured alike.
constexpr std::int64_t kPrefetchBytes = 8192;

template <typename W>
inline const char* ahead(const W* p) {
  return reinterpret_cast<const char*>(p) + kPrefetchBytes;
}

inline float widen(float w) { return w; }
inline float widen(std::uint16_t w) { return bf16_to_f32(w); }

// The elements [i, n) past a variant's vector body, in order, added to the lanes' sum.
template <typename W>
inline float dot_tail(float s, const W* w, const float* x, std::int64_t i, std::int64_t n) {
  for (; i < n; ++i) s += widen(w[i]) * x[i];
  return s;
}

// ---- AVX-512: 32-element blocks in two 16-lane accumulators, one 16-block more into the first,
// the lanes' sum (a fixed pairwise tree), then the tail.

__attribute__((target("avx512f"))) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"))) inline __m512 load16(const std::uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// Lanes summed pairwise: (l0 + l8) + ... over halves, then quarters, ... (not
// _mm512_reduce_add_ps: GCC 12 warns inside it at -O2).
__attribute__((target("avx512f"))) inline float sum16(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  for (int half = 8; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) l[j] += l[j + half];
  }
  return l[0];
}

// out[r * NT + t] = w[r] · x[t] over n elements.
template <int NR, int NT, typename W>
__attribute__((target("avx512f"))) void dots_avx512(const W* const* w, const float* const* x,
                                                    std::int64_t n, float* out) {
  __m512 a0[NR][NT], a1[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) a0[r][t] = a1[r][t] = _mm512_setzero_ps();
  }
  const std::int64_t body = n / 32 * 32;
  for (std::int64_t i = 0; i < body; i += 32) {
    __m512 w0[NR], w1[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(ahead(w[r] + i), _MM_HINT_T1);
      if constexpr (sizeof(W) == 4) _mm_prefetch(ahead(w[r] + i + 16), _MM_HINT_T1);
      w0[r] = load16(w[r] + i);
      w1[r] = load16(w[r] + i + 16);
    }
    for (int t = 0; t < NT; ++t) {
      const __m512 x0 = _mm512_loadu_ps(x[t] + i), x1 = _mm512_loadu_ps(x[t] + i + 16);
      for (int r = 0; r < NR; ++r) {
        a0[r][t] = _mm512_fmadd_ps(w0[r], x0, a0[r][t]);
        a1[r][t] = _mm512_fmadd_ps(w1[r], x1, a1[r][t]);
      }
    }
  }
  std::int64_t i = body;
  if (n - i >= 16) {
    for (int r = 0; r < NR; ++r) {
      const __m512 w0 = load16(w[r] + i);
      for (int t = 0; t < NT; ++t)
        a0[r][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + i), a0[r][t]);
    }
    i += 16;
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      out[r * NT + t] = dot_tail(sum16(_mm512_add_ps(a0[r][t], a1[r][t])), w[r], x[t], i, n);
    }
  }
}

// ---- AVX2 + FMA: the same shape with 8 lanes (16-element blocks).

__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 load8(const std::uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

__attribute__((target("avx2,fma"))) inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int NR, int NT, typename W>
__attribute__((target("avx2,fma"))) void dots_avx2(const W* const* w, const float* const* x,
                                                   std::int64_t n, float* out) {
  __m256 a0[NR][NT], a1[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) a0[r][t] = a1[r][t] = _mm256_setzero_ps();
  }
  const std::int64_t body = n / 16 * 16;
  for (std::int64_t i = 0; i < body; i += 16) {
    __m256 w0[NR], w1[NR];
    for (int r = 0; r < NR; ++r) {
      // A 16-element block is 32 or 64 bytes: one prefetch per line, every other block for bf16.
      if (sizeof(W) == 4 || (i & 16) == 0) _mm_prefetch(ahead(w[r] + i), _MM_HINT_T1);
      w0[r] = load8(w[r] + i);
      w1[r] = load8(w[r] + i + 8);
    }
    for (int t = 0; t < NT; ++t) {
      const __m256 x0 = _mm256_loadu_ps(x[t] + i), x1 = _mm256_loadu_ps(x[t] + i + 8);
      for (int r = 0; r < NR; ++r) {
        a0[r][t] = _mm256_fmadd_ps(w0[r], x0, a0[r][t]);
        a1[r][t] = _mm256_fmadd_ps(w1[r], x1, a1[r][t]);
      }
    }
  }
  std::int64_t i = body;
  if (n - i >= 8) {
    for (int r = 0; r < NR; ++r) {
      const __m256 w0 = load8(w[r] + i);
      for (int t = 0; t < NT; ++t)
        a0[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[r][t]);
    }
    i += 8;
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      out[r * NT + t] = dot_tail(sum8(_mm256_add_ps(a0[r][t], a1[r][t])), w[r], x[t], i, n);
    }
  }
}

// ---- The variants as types: how many tokens share a pass, and the NR x NT body.

struct Avx512 {
  static constexpr int kMaxTokens = 4;
  template <int NR, int NT, typename W>
  static void dots(const W* const* w, const float* const* x, std::int64_t n, float* out) {
    dots_avx512<NR, NT>(w, x, n, out);
  }
};

struct Avx2 {
  static constexpr int kMaxTokens = 2;  // 16 ymm registers: 2 rows x 2 tokens x 2 accumulators
  template <int NR, int NT, typename W>
  static void dots(const W* const* w, const float* const* x, std::int64_t n, float* out) {
    dots_avx2<NR, NT>(w, x, n, out);
  }
};

struct Scalar {  // expert_ffn_row's dot_fixed: the scalar variant is the exact path's arithmetic
  static constexpr int kMaxTokens = 1;
  template <int NR, int NT, typename W>
  static void dots(const W* const* w, const float* const* x, std::int64_t n, float* out) {
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) out[r * NT + t] = dot_fixed(w[r], x[t], n);
    }
  }
};

// V::dots<NR, nt> for a run-time nt in [1, V::kMaxTokens].
template <class V, int NR, typename W>
void dots_n(int nt, const W* const* w, const float* const* x, std::int64_t n, float* out) {
  switch (nt) {
    case 1:
      return V::template dots<NR, 1>(w, x, n, out);
    case 2:
      if constexpr (V::kMaxTokens >= 2) return V::template dots<NR, 2>(w, x, n, out);
      break;
    case 3:
      if constexpr (V::kMaxTokens >= 3) return V::template dots<NR, 3>(w, x, n, out);
      break;
    case 4:
      if constexpr (V::kMaxTokens >= 4) return V::template dots<NR, 4>(w, x, n, out);
      break;
    default:
      break;
  }
  FERRY_CHECK(false, "serve: {} tokens in one pass (at most {})", nt, V::kMaxTokens);
}

// ---- The phases over one expert's rows: m tokens (xs [m] inputs, hs [m] h rows, outs [m]
// output rows) and a span of its weight rows.

// h[j][f] = silu(gate_f · x_j) * (up_f · x_j) for f in [f0, f1).
template <class V, typename W>
void gate_up_span(const ExpertRef& ref, const float* const* xs, float* const* hs, std::int64_t m,
                  std::int64_t C, std::int64_t f0, std::int64_t f1) {
  const W* gate = static_cast<const W*>(ref.gate);
  const W* up = static_cast<const W*>(ref.up);
  float o[2 * V::kMaxTokens];
  for (std::int64_t f = f0; f < f1; ++f) {
    const W* w[2] = {gate + f * C, up + f * C};
    for (std::int64_t j0 = 0; j0 < m; j0 += V::kMaxTokens) {
      const int nt = static_cast<int>(std::min<std::int64_t>(V::kMaxTokens, m - j0));
      dots_n<V, 2>(nt, w, xs + j0, C, o);
      for (int j = 0; j < nt; ++j) {
        const float g = o[j], u = o[nt + j];
        hs[j0 + j][f] = g / (1.0f + std::exp(-g)) * u;  // expert_ffn_row's silu, same order
      }
    }
  }
}

// out[j][c] = down_c · h_j for c in [c0, c1), two down rows per pass.
template <class V, typename W>
void down_span(const ExpertRef& ref, const float* const* hs, float* const* outs, std::int64_t m,
               std::int64_t F, std::int64_t c0, std::int64_t c1) {
  const W* down = static_cast<const W*>(ref.down);
  float o[2 * V::kMaxTokens];
  std::int64_t c = c0;
  for (; c + 1 < c1; c += 2) {
    const W* w[2] = {down + c * F, down + (c + 1) * F};
    for (std::int64_t j0 = 0; j0 < m; j0 += V::kMaxTokens) {
      const int nt = static_cast<int>(std::min<std::int64_t>(V::kMaxTokens, m - j0));
      dots_n<V, 2>(nt, w, hs + j0, F, o);
      for (int j = 0; j < nt; ++j) {
        outs[j0 + j][c] = o[j];
        outs[j0 + j][c + 1] = o[nt + j];
      }
    }
  }
  if (c < c1) {
    const W* w[1] = {down + c * F};
    for (std::int64_t j0 = 0; j0 < m; j0 += V::kMaxTokens) {
      const int nt = static_cast<int>(std::min<std::int64_t>(V::kMaxTokens, m - j0));
      dots_n<V, 1>(nt, w, hs + j0, F, o);
      for (int j = 0; j < nt; ++j) outs[j0 + j][c] = o[j];
    }
  }
}

// The one switch from (isa, dtype) to a compiled span.
using GateUpFn = void (*)(const ExpertRef&, const float* const*, float* const*, std::int64_t,
                          std::int64_t, std::int64_t, std::int64_t);
using DownFn = GateUpFn;  // (ref, hs, outs, m, F, c0, c1): the same shape

template <class V>
GateUpFn gate_up_for(DType dt) {
  switch (dt) {
    case DType::kF32:
      return gate_up_span<V, float>;
    case DType::kBF16:
      return gate_up_span<V, std::uint16_t>;
    default:
      FERRY_CHECK(false, "serve: expert weights in {} (expected f32 or bf16)", to_string(dt));
  }
  return nullptr;
}

template <class V>
DownFn down_for(DType dt) {
  switch (dt) {
    case DType::kF32:
      return down_span<V, float>;
    case DType::kBF16:
      return down_span<V, std::uint16_t>;
    default:
      FERRY_CHECK(false, "serve: expert weights in {} (expected f32 or bf16)", to_string(dt));
  }
  return nullptr;
}

GateUpFn pick_gate_up(Isa isa, DType dt) {
  switch (isa) {
    case Isa::kAvx512:
      return gate_up_for<Avx512>(dt);
    case Isa::kAvx2:
      return gate_up_for<Avx2>(dt);
    case Isa::kScalar:
      return gate_up_for<Scalar>(dt);
  }
  FERRY_CHECK(false, "serve: unknown cpu isa");
  return nullptr;
}

DownFn pick_down(Isa isa, DType dt) {
  switch (isa) {
    case Isa::kAvx512:
      return down_for<Avx512>(dt);
    case Isa::kAvx2:
      return down_for<Avx2>(dt);
    case Isa::kScalar:
      return down_for<Scalar>(dt);
  }
  FERRY_CHECK(false, "serve: unknown cpu isa");
  return nullptr;
}

// Work units of at least ~64 KiB of weights per chunk, so a thread streams long runs of rows.
std::size_t min_units(std::int64_t unit_elems) {
  return static_cast<std::size_t>(
      std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, unit_elems)));
}

}  // namespace

ExpertFfnGrouped::ExpertFfnGrouped(Isa isa) : isa_(isa) {
  while (!kernels::cpu::isa_supported(isa_)) {
    isa_ = isa_ == Isa::kAvx512 ? Isa::kAvx2 : Isa::kScalar;
  }
}

void ExpertFfnGrouped::reserve(std::int64_t max_rows, std::int64_t F, int E) {
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(max_rows, 0));
  if (h_.size() < n * static_cast<std::size_t>(F)) h_.resize(n * static_cast<std::size_t>(F));
  if (order_.size() < n) {
    order_.resize(n);
    x_of_.resize(n);
    h_of_.resize(n);
    out_of_.resize(n);
  }
  if (slot_of_.size() < static_cast<std::size_t>(E)) {
    slot_of_.resize(static_cast<std::size_t>(E), -1);
    experts_.reserve(static_cast<std::size_t>(E));
    begin_.reserve(static_cast<std::size_t>(E) + 1);
    fill_.reserve(static_cast<std::size_t>(E));
  }
}

void ExpertFfnGrouped::run(const ExpertFfnStep& s, ThreadPool& pool) {
  if (s.n <= 0) return;
  FERRY_CHECK(s.ref_of_expert != nullptr && s.ids != nullptr && s.rows != nullptr &&
                  s.x != nullptr && s.out != nullptr && s.K > 0 && s.C > 0 && s.F > 0,
              "serve: incomplete expert step ({} rows, K {}, C {}, F {})", s.n, s.K, s.C, s.F);
  reserve(s.n, s.F, s.E);
  // Group the rows by expert: counts, ranges, then a stable scatter (routing order inside).
  experts_.clear();
  fill_.clear();
  for (std::int64_t j = 0; j < s.n; ++j) {
    const std::int32_t e = s.ids[s.rows[j]];
    FERRY_CHECK(e >= 0 && e < s.E, "serve: expert id {} outside [0, {})", e, s.E);
    std::int32_t& slot = slot_of_[static_cast<std::size_t>(e)];
    if (slot < 0) {
      slot = static_cast<std::int32_t>(experts_.size());
      experts_.push_back(e);
      fill_.push_back(0);
    }
    ++fill_[static_cast<std::size_t>(slot)];
  }
  const std::int64_t D = static_cast<std::int64_t>(experts_.size());
  begin_.assign(1, 0);
  for (std::int64_t d = 0; d < D; ++d) begin_.push_back(begin_.back() + fill_[std::size_t(d)]);
  for (std::int64_t d = 0; d < D; ++d) fill_[std::size_t(d)] = begin_[std::size_t(d)];
  for (std::int64_t j = 0; j < s.n; ++j) {
    const std::int32_t i = s.rows[j];
    const std::int32_t slot = slot_of_[static_cast<std::size_t>(s.ids[i])];
    const std::int64_t p = fill_[static_cast<std::size_t>(slot)]++;
    order_[std::size_t(p)] = i;
    x_of_[std::size_t(p)] = s.x + std::int64_t(i / s.K) * s.C;
    h_of_[std::size_t(p)] = h_.data() + p * s.F;
    out_of_[std::size_t(p)] = s.out + std::int64_t(i) * s.C;
  }
  for (std::int32_t e : experts_) slot_of_[static_cast<std::size_t>(e)] = -1;

  // Phase 1: the (expert, f) pairs, contiguous chunks per thread; a chunk may span experts.
  const std::int64_t C = s.C, F = s.F;
  pool.parallel_for(
      static_cast<std::size_t>(D * F),
      [&](std::size_t b, std::size_t e) {
        for (std::int64_t u = std::int64_t(b); u < std::int64_t(e);) {
          const std::int64_t d = u / F, f0 = u % F;
          const std::int64_t f1 = std::min(F, f0 + (std::int64_t(e) - u));
          const ExpertRef& ref = s.ref_of_expert[experts_[std::size_t(d)]];
          const std::int64_t j0 = begin_[std::size_t(d)], m = begin_[std::size_t(d) + 1] - j0;
          pick_gate_up(isa_, ref.dtype)(ref, x_of_.data() + j0, h_of_.data() + j0, m, C, f0, f1);
          u += f1 - f0;
        }
      },
      min_units(2 * C));
  // Phase 2: the (expert, c) pairs; reads phase 1's h rows of the same expert.
  pool.parallel_for(
      static_cast<std::size_t>(D * C),
      [&](std::size_t b, std::size_t e) {
        for (std::int64_t u = std::int64_t(b); u < std::int64_t(e);) {
          const std::int64_t d = u / C, c0 = u % C;
          const std::int64_t c1 = std::min(C, c0 + (std::int64_t(e) - u));
          const ExpertRef& ref = s.ref_of_expert[experts_[std::size_t(d)]];
          const std::int64_t j0 = begin_[std::size_t(d)], m = begin_[std::size_t(d) + 1] - j0;
          pick_down(isa_, ref.dtype)(ref, h_of_.data() + j0, out_of_.data() + j0, m, F, c0, c1);
          u += c1 - c0;
        }
      },
      min_units(F));
}

}  // namespace ferry::serve
