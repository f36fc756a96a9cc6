// SPDX-License-Identifier: Apache-2.0
// The device twin of the hybrid AdamW span kernel (kernels/cpu/hybrid_adamw.h): the same span
// (every pointer in device memory), the same constants, the same bits as the CPU kernels for
// every (master, states) combination except f32 master + f32 states (that one is the CPU's
// adamw_span, whose GPU counterpart is launch_adamw). It runs hybrid_adamw_scalar.h's
// step_element and q8_code.h's codes from their own source (FERRY_HOST_DEVICE), compiled without
// FMA contraction; the 8-bit block maxima are order-free (max over finite values), so a block
// split over threads gives the scalar loop's absmax. Why: a GPU that is idle while the CPU
// updates the layers the next forward needs first can take some of them (docs/train.md,
// session 10) only if it produces exactly what the CPU would.
// Tested bit for bit against the CPU in tests/gpu/kernels_optim_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cpu/hybrid_adamw.h"

namespace ferry::kernels::cuda {

// cudaErrorInvalidValue for f32 master + f32 states or a pointer set that does not match
// (master, states) (the CPU kernel's checks, as a return value).
cudaError_t launch_hybrid_adamw(cpu::MasterKind master, cpu::StateKind states,
                                const cpu::AdamWConstants& k, const cpu::HybridAdamWSpan& s,
                                cudaStream_t stream);

}  // namespace ferry::kernels::cuda
