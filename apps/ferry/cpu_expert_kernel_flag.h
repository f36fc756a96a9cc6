// SPDX-License-Identifier: Apache-2.0
// `--cpu-expert-kernel fast|exact` of `ferry serve`, `ferry generate` and `ferry bench serve`
// (PagerConfig::cpu_expert_kernel): how cpu-experts computes its experts on the CPU. Unset: the
// engine's default (fast on --device cuda, exact on the CPU engine, whose modes stay
// bit-identical). Any other value is a usage error (exit 2).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/result.h"
#include "serve/serve_config.h"

namespace ferry::app {

inline void add_cpu_expert_kernel_flag(CLI::App* cmd, std::string& kernel) {
  cmd->add_option("--cpu-expert-kernel", kernel,
                  "cpu-experts: fast (all cores on distinct weight rows, SIMD; default with "
                  "--device cuda) or exact (expert_ffn_row per row; the CPU engine's default, "
                  "bit-identical to the other modes)")
      ->check(CLI::IsMember({"fast", "exact"}));
}

// kernel: the flag's value ("" = not given: kDefault).
inline Result<serve::CpuExpertKernel> cpu_expert_kernel_of(const std::string& kernel) {
  if (kernel.empty()) return serve::CpuExpertKernel::kDefault;
  return serve::parse_cpu_expert_kernel(kernel);
}

}  // namespace ferry::app
