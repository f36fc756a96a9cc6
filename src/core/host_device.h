// SPDX-License-Identifier: Apache-2.0
// FERRY_HOST_DEVICE marks inline functions that host code and CUDA kernels share verbatim (the
// byte pattern of mem/pattern_byte.h, the optimizer's element step and 8-bit codes in
// kernels/cpu/hybrid_adamw_scalar.h and q8_code.h): under nvcc they compile for both sides, under
// g++ the macro is empty. One source for both sides is what makes a device twin bit-identical.
#pragma once

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif
