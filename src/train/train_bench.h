// SPDX-License-Identifier: Apache-2.0
// `ferry bench train`: the stream executor's step throughput on a random-weight model of a given
// geometry, for several activation policies in one process (so the policies are compared on the
// same machine state), on the CPU backend or the GPU. Reports per policy: step time (median and
// mean of the timed steps), tokens/s, TFLOPS in the 6·N·tokens convention and hardware TFLOPS
// (recompute included; step_flops.h), MFU against the device's data-sheet bf16 peak (GPU) or
// --peak-tflops, exposed transfer time per step (GPU: from events), device-tier peak and plan,
// bytes moved per step, and the per-window breakdown (window_report.h).
// The PyTorch baseline on the same geometry is tools/bench/train_torch_baseline.py; the
// scripts/gpu_train_check.sh script runs both in one call and prints the ratios.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "mem/budget.h"
#include "train/builtin_model.h"
#include "train/optim/optim_modes.h"
#include "train/stream/device_optimizer_tail.h"

namespace ferry::train {

// TrainBenchConfig::resident_layers when --resident-layers was not given.
inline constexpr int kResidentNotGiven = -3;

struct TrainBenchConfig {
  std::string device = "cpu";  // cpu | cuda
  BuiltinModelSpec model;      // geometry of the random-weight model (builtin tokenizer's vocab)
  int batch = 4;               // sequences per micro-batch, each seq tokens long
  // Per policy, the largest batch (<= max_batch) whose device plan fits device_budget_bytes
  // (stream::largest_batch), instead of `batch`: what fits each policy at a GPU-memory cap.
  bool batch_auto = false;
  int max_batch = 64;
  std::int64_t seq = 256;
  int accum = 1;   // micro-batches per optimizer step (gradient accumulation)
  int steps = 5;   // timed steps per policy
  int warmup = 1;  // untimed steps first
  // Activation policies (stream::parse_policy), or plan=FILE: the boundary homes of a `ferry
  // plan` JSON (stream::read_plan_policy; its predicted step is reported next to the measured).
  std::vector<std::string> policies{"device", "every:4", "host"};
  int prefetch = 2;
  int optimizer_threads = 0;  // StreamOptions::optimizer_threads
  // StreamOptions::device_update_layers (-1: all) for every policy, or stream::kDeviceUpdateAuto:
  // a plan=FILE policy runs its plan's tail (the problem's device_update_layers), the named
  // policies none.
  int device_update_layers = stream::kDeviceUpdateAuto;
  int device_update_slots = 2;  // StreamOptions::device_update_slots
  // StreamOptions::resident_layers (-1: all, -2: auto); kResidentNotGiven: 0 for the fixed
  // policies and a plan's own K for plan=FILE (an explicit value, 0 included, overrides a plan's
  // K; auto leaves a plan its K: the plan chose it).
  int resident_layers = kResidentNotGiven;
  std::string head_update = "early";    // StreamOptions::head_update (early | late)
  bool device_update_prestage = true;   // StreamOptions::device_update_prestage
  std::string gemm_precision = "auto";  // stream: auto | bf16 | f32 (model::parse_gemm_precision)
  std::string weights_dtype = "auto";   // fp32 master: auto | bf16 | f32 (bf16_compute_weights)
  std::string grad_dtype = "f32";       // f32 | bf16 (bf16_gradients)
  OptimMode optim;                      // master weights x optimizer states
  std::size_t device_budget_bytes = mem::MemoryBudget::kUnlimited;
  double peak_tflops = 0;  // MFU denominator; 0: the GPU's known peak
  std::uint64_t seed = 1;
};

Result<Json> run_train_bench(const TrainBenchConfig& c);
// The human-readable table of a run_train_bench report.
std::string format_train_bench(const Json& report);

}  // namespace ferry::train
