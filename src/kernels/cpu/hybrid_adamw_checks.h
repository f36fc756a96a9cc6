// SPDX-License-Identifier: Apache-2.0
// Argument checks of Backend::hybrid_adamw (ops.h HybridAdamWArgs), shared by the CPU and CUDA
// backends (inline: ferry_kernels_cuda does not link the CPU library's objects). The pointer
// set must match (master, states) exactly as hybrid_adamw.h lists it; a mismatch from a caller
// is a Status here, not the CPU kernel's FERRY_CHECK abort. Tested in
// tests/unit/train/device_optimizer_tail_test.cpp.
#pragma once

#include <cmath>
#include <string_view>

#include "core/status.h"
#include "kernels/cpu/q8_code.h"
#include "kernels/ops.h"

namespace ferry::kernels::detail {

inline Status check_hybrid_adamw(std::string_view who, const HybridAdamWArgs& a, Device device) {
  const cpu::HybridAdamWSpan& s = a.span;
  if (a.device != device) {
    return invalid_argument("kernels: {}: the span lives on {}, the backend runs on {}", who,
                            to_string(a.device), to_string(device));
  }
  if (s.n < 0) return invalid_argument("kernels: {}: span of {} elements", who, s.n);
  if (s.n == 0) return {};
  if (s.grad == nullptr) return invalid_argument("kernels: {}: grad is required", who);
  switch (a.master) {
    case cpu::MasterKind::kF32:
      if (s.p32 == nullptr || s.comp16 != nullptr) {
        return invalid_argument("kernels: {}: an f32 master needs p32 and no comp16", who);
      }
      break;
    case cpu::MasterKind::kBf16Kahan:
      if (s.p16 == nullptr || s.comp16 == nullptr) {
        return invalid_argument("kernels: {}: a bf16-kahan master needs p16 and comp16", who);
      }
      break;
    case cpu::MasterKind::kBf16Sr:
      if (s.p16 == nullptr || s.comp16 != nullptr) {
        return invalid_argument("kernels: {}: a bf16-sr master needs p16 and no comp16", who);
      }
      break;
    default:
      return invalid_argument("kernels: {}: unknown master kind {}", who,
                              static_cast<int>(a.master));
  }
  switch (a.states) {
    case cpu::StateKind::kF32:
      if (s.m32 == nullptr || s.v32 == nullptr || s.m8 != nullptr || s.v8 != nullptr ||
          s.m_absmax != nullptr || s.v_absmax != nullptr) {
        return invalid_argument("kernels: {}: f32 states need m32, v32 and no 8-bit arrays", who);
      }
      break;
    case cpu::StateKind::kQ8:
      if (s.m8 == nullptr || s.v8 == nullptr || s.m_absmax == nullptr || s.v_absmax == nullptr ||
          s.m32 != nullptr || s.v32 != nullptr) {
        return invalid_argument(
            "kernels: {}: 8-bit states need m8, v8, m_absmax, v_absmax and no f32 states", who);
      }
      if (s.index0 % static_cast<std::uint64_t>(cpu::q8::kBlock) != 0) {
        return invalid_argument(
            "kernels: {}: an 8-bit span starts at element {}, not on a block of {}", who, s.index0,
            cpu::q8::kBlock);
      }
      break;
    default:
      return invalid_argument("kernels: {}: unknown state kind {}", who,
                              static_cast<int>(a.states));
  }
  if (!std::isfinite(a.k.lr) || !(a.k.beta1 >= 0.0f && a.k.beta1 < 1.0f) ||
      !(a.k.beta2 >= 0.0f && a.k.beta2 < 1.0f)) {
    return invalid_argument("kernels: {}: lr {} and betas ({}, {}) must be finite and in [0, 1)",
                            who, a.k.lr, a.k.beta1, a.k.beta2);
  }
  return {};
}

}  // namespace ferry::kernels::detail
