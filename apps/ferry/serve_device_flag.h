// SPDX-License-Identifier: Apache-2.0
// `--device cpu|cuda` of `ferry generate` and `ferry serve`: which backend the serving engine
// computes on. cpu (the default) is the CPU engine; cuda is the CUDA engine on device 0
// (docs/serve.md "CUDA path"); in a build without CUDA, or without a GPU, it fails with the
// backend's unavailable status (exit 1), never silently falls back to the CPU.
// `--no-cuda-graphs` / `--no-device-resolve`: the decode-step switches of the engine (both on by
// default; docs/serve.md): steps op by op instead of CUDA graphs, and paged slots resolved by the
// host pager's per-layer round trip instead of on the device (the CPU engine then skips the CPU
// twin). For comparisons, and the way out when pinned memory cannot be mapped for the device
// path (the engine's error names this flag).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/result.h"
#include "kernels/backend.h"
#include "serve/serve_config.h"

namespace ferry::app {

inline void add_serve_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "where the engine computes: cpu (default) or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->envname("FERRY_SERVE_DEVICE");
}

struct ServeStepSwitches {
  bool no_cuda_graphs = false;
  bool no_device_resolve = false;
};

inline void add_serve_step_switches(CLI::App* cmd, ServeStepSwitches& s) {
  cmd->add_flag("--no-cuda-graphs", s.no_cuda_graphs,
                "run decode steps op by op instead of as CUDA graphs (--device cuda)");
  cmd->add_flag("--no-device-resolve", s.no_device_resolve,
                "paged: resolve expert slots on the host each MoE layer instead of on the device");
}

inline void apply_serve_step_switches(const ServeStepSwitches& s, serve::EngineConfig& ec) {
  ec.cuda_graphs = !s.no_cuda_graphs;
  ec.pager.device_resolve = !s.no_device_resolve;
}

inline Result<kernels::Backend*> serve_backend(const std::string& device) {
  if (device == "cuda") return kernels::cuda_backend(0);
  return &kernels::cpu_backend();
}

}  // namespace ferry::app
