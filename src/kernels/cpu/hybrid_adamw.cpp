// SPDX-License-Identifier: Apache-2.0
// Dispatch of the hybrid AdamW span kernel (hybrid_adamw.h) and its scalar body. The f32-master
// + f32-state combination is simd_adamw.cpp's adamw_span, unchanged.
#include "kernels/cpu/hybrid_adamw.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/cpu/hybrid_adamw_scalar.h"
#include "kernels/cpu/hybrid_adamw_simd.h"

namespace ferry::kernels::cpu {
namespace hybrid {
namespace {

template <MasterKind MK>
void run_scalar_t(StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s) {
  if (sk == StateKind::kF32) return f32_states_range<MK>(k, s, 0, s.n);
  float scratch_m[q8::kBlock];
  float scratch_s[q8::kBlock];
  std::int64_t blk = 0;
  for (std::int64_t b0 = 0; b0 < s.n; b0 += q8::kBlock, ++blk) {
    const std::int64_t b1 = std::min(s.n, b0 + q8::kBlock);
    float amax_m = 0.0f, amax_s = 0.0f;
    q8_pass_a_range<MK>(k, s, b0, b0, b1, q8::decode_multiplier<q8::kMBits>(s.m_absmax[blk]),
                        q8::decode_multiplier<q8::kVBits>(s.v_absmax[blk]), scratch_m, scratch_s,
                        amax_m, amax_s);
    s.m_absmax[blk] = amax_m;
    s.v_absmax[blk] = amax_s;
    q8_pass_b_range(s, b0, b0, b1, q8::encode_multiplier<q8::kMBits>(amax_m),
                    q8::encode_multiplier<q8::kVBits>(amax_s), scratch_m, scratch_s);
  }
}

}  // namespace

void run_scalar(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s) {
  switch (mk) {
    case MasterKind::kF32:
      return run_scalar_t<MasterKind::kF32>(sk, k, s);
    case MasterKind::kBf16Kahan:
      return run_scalar_t<MasterKind::kBf16Kahan>(sk, k, s);
    case MasterKind::kBf16Sr:
      return run_scalar_t<MasterKind::kBf16Sr>(sk, k, s);
  }
}

}  // namespace hybrid

std::uint32_t sr_random_bits(std::uint64_t key, std::uint64_t index) {
  return hybrid::random_bits(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(key),
                             static_cast<std::uint32_t>(key >> 32));
}

std::uint64_t sr_key(std::uint64_t seed, std::int64_t step, std::uint64_t param) {
  // SplitMix64 finalizer over a combination of the three (odd multipliers keep it injective in
  // each argument alone).
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(step) + 1) +
                    0xd6e8feb86659fd93ull * (param + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void hybrid_adamw_span(Isa isa, MasterKind master, StateKind states, const AdamWConstants& k,
                       const HybridAdamWSpan& s) {
  FERRY_CHECK(s.n >= 0 && (s.n == 0 || s.grad != nullptr), "hybrid adamw: bad span (n={})", s.n);
  if (master == MasterKind::kF32) {
    FERRY_CHECK(s.p32 != nullptr && s.comp16 == nullptr, "hybrid adamw: f32 master needs p32 only");
  } else {
    FERRY_CHECK(s.p16 != nullptr, "hybrid adamw: bf16 master needs p16");
    FERRY_CHECK((master == MasterKind::kBf16Kahan) == (s.comp16 != nullptr),
                "hybrid adamw: comp16 is given exactly for the Kahan master");
  }
  if (states == StateKind::kF32) {
    FERRY_CHECK(s.m32 != nullptr && s.v32 != nullptr, "hybrid adamw: f32 states need m32, v32");
  } else {
    FERRY_CHECK(
        s.m8 != nullptr && s.v8 != nullptr && s.m_absmax != nullptr && s.v_absmax != nullptr,
        "hybrid adamw: 8-bit states need m8, v8, m_absmax, v_absmax");
  }
  if (s.n == 0) return;
  if (master == MasterKind::kF32 && states == StateKind::kF32) {
    return adamw_span(isa, k, s.p32, s.m32, s.v32, s.p16, s.grad, s.n);
  }
  switch (isa) {
    case Isa::kAvx512:
      return hybrid::run_avx512(master, states, k, s);
    case Isa::kAvx2:
      return hybrid::run_avx2(master, states, k, s);
    case Isa::kScalar:
      return hybrid::run_scalar(master, states, k, s);
  }
}

}  // namespace ferry::kernels::cpu
