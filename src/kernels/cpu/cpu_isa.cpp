// SPDX-License-Identifier: Apache-2.0
// CPUID-based choice of the SIMD variant (see cpu_isa.h).
#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <string>

namespace ferry::kernels::cpu {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

Isa best_isa() {
  static const Isa chosen = [] {
    Isa best = isa_supported(Isa::kAvx512) ? Isa::kAvx512
               : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                           : Isa::kScalar;
    if (const char* env = std::getenv("FERRY_CPU_ISA")) {
      const std::string want(env);
      Isa cap = best;
      if (want == "scalar") cap = Isa::kScalar;
      if (want == "avx2") cap = Isa::kAvx2;
      if (static_cast<int>(cap) < static_cast<int>(best)) best = cap;
    }
    return best;
  }();
  return chosen;
}

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace ferry::kernels::cpu
