// SPDX-License-Identifier: Apache-2.0
// `--device cpu|cuda` of `ferry generate` and `ferry serve`: which backend the serving engine
// computes on. cpu (the default) is the CPU engine; cuda is the CUDA engine on device 0
// (docs/serve.md "CUDA path"); in a build without CUDA, or without a GPU, it fails with the
// backend's unavailable status (exit 1), never silently falls back to the CPU.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/result.h"
#include "kernels/backend.h"

namespace ferry::app {

inline void add_serve_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "where the engine computes: cpu (default) or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->envname("FERRY_SERVE_DEVICE");
}

inline Result<kernels::Backend*> serve_backend(const std::string& device) {
  if (device == "cuda") return kernels::cuda_backend(0);
  return &kernels::cpu_backend();
}

}  // namespace ferry::app
