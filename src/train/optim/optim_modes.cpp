// SPDX-License-Identifier: Apache-2.0
#include "train/optim/optim_modes.h"

#include <fmt/format.h>

#include "kernels/cpu/q8_code.h"

namespace ferry::train {

std::string_view to_string(MasterWeights m) {
  switch (m) {
    case MasterWeights::kF32:
      return "fp32";
    case MasterWeights::kBf16Kahan:
      return "bf16-kahan";
    case MasterWeights::kBf16Sr:
      return "bf16-sr";
  }
  return "?";
}

std::string_view to_string(OptimizerStates s) {
  switch (s) {
    case OptimizerStates::kF32:
      return "fp32";
    case OptimizerStates::k8Bit:
      return "8bit";
  }
  return "?";
}

Result<MasterWeights> parse_master_weights(std::string_view name) {
  for (MasterWeights m : {MasterWeights::kF32, MasterWeights::kBf16Kahan, MasterWeights::kBf16Sr}) {
    if (name == to_string(m)) return m;
  }
  return invalid_argument("train: unknown master weights \"{}\" (fp32, bf16-kahan, bf16-sr)", name);
}

Result<OptimizerStates> parse_optimizer_states(std::string_view name) {
  for (OptimizerStates s : {OptimizerStates::kF32, OptimizerStates::k8Bit}) {
    if (name == to_string(s)) return s;
  }
  return invalid_argument("train: unknown optimizer states \"{}\" (fp32, 8bit)", name);
}

std::string describe(const OptimMode& m) {
  return fmt::format("master={} states={}", to_string(m.master), to_string(m.states));
}

HostBytesPerParam host_bytes_per_param(const OptimMode& m, DType grad_dtype) {
  HostBytesPerParam b;
  b.weights = 2.0;  // bf16, streamed to the GPU
  switch (m.master) {
    case MasterWeights::kF32:
      b.master = 4.0;
      break;
    case MasterWeights::kBf16Kahan:
      b.master = 2.0;
      break;
    case MasterWeights::kBf16Sr:
      b.master = 0.0;
      break;
  }
  if (m.states == OptimizerStates::kF32) {
    b.states = 8.0;
  } else {
    // One code byte each for m and sqrt(v), plus two f32 absmax per block.
    b.states = 2.0 + 2.0 * 4.0 / static_cast<double>(kernels::cpu::q8::kBlock);
  }
  b.grads = static_cast<double>(dtype_size(grad_dtype));
  return b;
}

HostBytesPerParam mixed_host_bytes_per_param(const OptimMode& m, double q8_fraction,
                                             DType grad_dtype) {
  HostBytesPerParam b = host_bytes_per_param(m, grad_dtype);
  if (m.states != OptimizerStates::k8Bit) return b;
  const double f32 = host_bytes_per_param({m.master, OptimizerStates::kF32}, grad_dtype).states;
  b.states = q8_fraction * b.states + (1.0 - q8_fraction) * f32;
  return b;
}

double optimizer_state_bytes_per_param(const OptimMode& m) {
  const HostBytesPerParam b = host_bytes_per_param(m);
  return b.master + b.states;
}

std::string bytes_per_param_table(DType grad_dtype) {
  std::string out = fmt::format("{:<12} {:<7} {:>7} {:>7} {:>7} {:>7} {:>7}\n", "master", "states",
                                "weights", "master", "states", "grads", "total");
  for (MasterWeights mw :
       {MasterWeights::kF32, MasterWeights::kBf16Kahan, MasterWeights::kBf16Sr}) {
    for (OptimizerStates st : {OptimizerStates::kF32, OptimizerStates::k8Bit}) {
      const HostBytesPerParam b = host_bytes_per_param({mw, st}, grad_dtype);
      out +=
          fmt::format("{:<12} {:<7} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f}\n", to_string(mw),
                      to_string(st), b.weights, b.master, b.states, b.grads, b.total());
    }
  }
  return out;
}

}  // namespace ferry::train
