// SPDX-License-Identifier: Apache-2.0
// CPU SwiGLU forward and backward, f32: the flat element range is split across threads and each
// piece runs the SIMD span kernel of simd_swiglu.cpp (all variants give identical bits, so the
// split does not change results); the forward's optional bf16 copy (out16) rounds each span with
// convert()'s f32_to_bf16, so it equals convert(out) bit for bit. Covered by
// dense_cpu_vs_ref_test.cpp.
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {
namespace {
constexpr std::size_t kMinChunk = 16384;
}  // namespace

Status CpuBackend::swiglu(const SwiGluArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu swiglu";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "gate", a.gate, 2, kF32Only));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  FERRY_TRY(check_view(kWho, "up", a.up, {n, f}, kF32Only));
  FERRY_TRY(check_view(kWho, "out", a.out, {n, f}, kF32Only));
  FERRY_TRY(check_optional_view(kWho, "out16", a.out16, {n, f}, kBf16Only));
  const cpu::Isa isa = cpu::best_isa();
  const auto* g = a.gate.as<float>();
  const auto* u = a.up.as<float>();
  auto* out = a.out.as<float>();
  auto* out16 = is_absent(a.out16) ? nullptr : a.out16.as<std::uint16_t>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(n * f),
      [&](std::size_t b, std::size_t e) {
        cpu::swiglu_span(isa, out + b, g + b, u + b, static_cast<std::int64_t>(e - b));
        // The bf16 copy from the f32 values just written (still in cache): convert()'s rounding.
        if (out16 != nullptr) {
          for (std::size_t i = b; i < e; ++i) out16[i] = f32_to_bf16(out[i]);
        }
      },
      kMinChunk);
  return ok_status();
}

Status CpuBackend::swiglu_backward(const SwiGluBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu swiglu_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "gate", a.gate, 2, kF32Only));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  FERRY_TRY(check_view(kWho, "up", a.up, {n, f}, kF32Only));
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {n, f}, kF32Only));
  FERRY_TRY(check_view(kWho, "d_gate", a.d_gate, {n, f}, kF32Only));
  FERRY_TRY(check_view(kWho, "d_up", a.d_up, {n, f}, kF32Only));
  const cpu::Isa isa = cpu::best_isa();
  const auto* g = a.gate.as<float>();
  const auto* u = a.up.as<float>();
  const auto* dy = a.d_out.as<float>();
  auto* dg = a.d_gate.as<float>();
  auto* du = a.d_up.as<float>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(n * f),
      [&](std::size_t b, std::size_t e) {
        cpu::swiglu_backward_span(isa, dg + b, du + b, dy + b, g + b, u + b,
                                  static_cast<std::int64_t>(e - b));
      },
      kMinChunk);
  return ok_status();
}

}  // namespace ferry::kernels
