// SPDX-License-Identifier: Apache-2.0
// Subcommand registry. Each cmd_<name>.cpp defines a registration function that adds its
// subcommand (options bound to a config struct) to the CLI11 app and sets `run` to its body when
// chosen; FERRY_REGISTER_COMMAND adds it to the list main() walks. Exit codes: 0 ok, 1 a runtime
// Status, 2 usage.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/result.h"
#include "core/status.h"
#include "model/config.h"

namespace ferry::app {

using CommandFn = std::function<int()>;
using RegisterFn = void (*)(CLI::App& app, CommandFn& run);

// Prints "ferry: <status>" to stderr and returns exit code 1.
int fail(const Status& s);

std::vector<RegisterFn>& command_registry();

// The `ferry route` parent subcommand, created by whichever route command registers first.
CLI::App* route_cmd(CLI::App& app);
// The `ferry bench` parent subcommand (bench serve, later bench train), created the same way.
CLI::App* bench_cmd(CLI::App& app);

// Long-running commands (servers, the WAN emulator): install SIGINT/SIGTERM handlers before
// announcing readiness, then block until a signal arrives or `duration_s` (> 0) has passed.
void install_stop_signals();
void wait_for_stop(double duration_s);

// `ferry train --plan auto` (cmd_plan.cpp): solves the plan of a training run the way `ferry plan`
// does (the machine's cached profiles apply), prints its table and writes it as JSON to out_path.
struct TrainingPlanRequest {
  model::ModelConfig config;
  int batch_size = 1;
  int seq_len = 1;
  double gpu_gb = 0;
  double host_gb = 0;
  std::string nvme_dir;  // empty: no NVMe tier
  double nvme_gb = 0;
  std::string master, optimizer_states;  // train's flags: the host bytes/param
  std::string grad_dtype = "f32";        // train's --grad-dtype
  std::string machine = "h200";
  double time_limit_s = 30;
  std::string device = "auto";  // the executor's device (ferry train --device): its GPU memory
  // The run's device optimizer tail (ferry train --device-update-layers / --device-update-slots):
  // 0 off, K, train::stream::kDeviceUpdateAllLayers (-1, all), or kDeviceUpdateAuto (-2,
  // device_update_flags.h: the solve picks K, written to the plan as its device_update_layers); in
  // the optimizer gate and, as staging bytes, in the executor fit. Its ms per layer: 0 derives it
  // as ferry plan does.
  int device_update_layers = 0;
  int device_update_slots = 2;
  double device_update_ms_per_layer = 0;
  // false: no layer keeps its internals (ferry plan / ferry train --no-keep-internals).
  bool keep_internals = true;
  // GPU-resident layers (ferry train --resident-layers, when given): K forced; -1 (auto, the
  // default): the solve picks K (docs/plan.md, resident layers).
  int resident_layers = -1;
};
Status write_training_plan(const TrainingPlanRequest& r, const std::string& out_path);

struct CommandRegistrar {
  explicit CommandRegistrar(RegisterFn fn) { command_registry().push_back(fn); }
};

}  // namespace ferry::app

#define FERRY_REGISTER_COMMAND(fn) \
  static const ::ferry::app::CommandRegistrar FERRY_CONCAT_(ferry_cmd_, __LINE__) { fn }
