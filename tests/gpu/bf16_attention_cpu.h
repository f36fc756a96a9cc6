// SPDX-License-Identifier: Apache-2.0
// Bf16AttentionCpu: the "naive same-precision" twin of the CUDA path for style.md's tolerance rule
// on whole models (tests/gpu/model_gpu_test.cpp, tests/gpu/train_stream_gpu_test.cpp).
#pragma once

#include "tests/gpu/gpu_test_util.h"
#include "unit/model/bf16_attention_backend.h"

namespace ferry::testing {

// The naive same-precision twin of the CUDA path: the CPU backend, but attention sees and
// produces bf16 (supports(kAttention, kF32) is false, so ModelCompute casts around it exactly as
// it does for CUDA). Inside, the values are widened to f32 and the CPU's f32 attention runs
// (tests/unit/model/bf16_attention_backend.h, shared with the host tests).
using Bf16AttentionCpu = Bf16AttentionBackend;

}  // namespace ferry::testing
