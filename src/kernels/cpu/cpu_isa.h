// SPDX-License-Identifier: Apache-2.0
// Run-time instruction-set choice for the CPU backend's SIMD bodies (DeepSpeed cpu_adam shape):
// each hot op has an AVX-512, an AVX2 and a scalar variant; best_isa() picks the widest one the
// CPU reports through CPUID (__builtin_cpu_supports). FERRY_CPU_ISA=scalar|avx2|avx512 lowers the
// choice (never raises it above what the CPU has), for benchmarking and debugging.
// Thread-safe: the choice is computed once.
#pragma once

#include <string_view>

namespace ferry::kernels::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// True when this CPU can run the variant (kScalar always).
bool isa_supported(Isa isa);
// The widest supported variant, lowered by FERRY_CPU_ISA when set.
Isa best_isa();
std::string_view to_string(Isa isa);

}  // namespace ferry::kernels::cpu
