// SPDX-License-Identifier: Apache-2.0
// The per-ISA bodies of hybrid_adamw_span (hybrid_adamw.h), internal to kernels/cpu. Each runs
// the whole span (vector body + scalar tail) and equals run_scalar bit for bit.
#pragma once

#include "kernels/cpu/hybrid_adamw.h"

namespace ferry::kernels::cpu::hybrid {

void run_scalar(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s);
void run_avx2(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s);
void run_avx512(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s);

}  // namespace ferry::kernels::cpu::hybrid
