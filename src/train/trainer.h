// SPDX-License-Identifier: Apache-2.0
// The training job. Two executors run the same step (and give the same bits on the CPU backend):
//   memory  everything resident on the host, one whole-model ModelCompute, optimizer.h after
//           backward — the reference;
//   stream  the layer-streaming executor (stream/stream_executor.h): host arena, weight slots in
//           a budgeted device tier fed by a transfer thread, an activation policy, the optimizer
//           on a CPU worker overlapping the next step's forward.
//
// One step, top to bottom (run_training):
//   zero grads; for each of grad_accum micro-batches: forward + backward (grads accumulate)
//   -> ||G|| from per-parameter sum_squares -> clip factor folded into AdamW's grad_scale
//   -> AdamW per parameter (non-finite ||G||: skip; 3 in a row: stop with an error)
//   -> per-step line (stdout), metrics JSONL, eval every N steps, checkpoint every M steps.
// Without --model/--data the job trains the embedded default (builtin_model.h + arith_data.h).
// Determinism: the same config, data and seed give bit-identical losses and weights, and a
// resumed run continues exactly (the data cursor, AdamW step and moments are in the checkpoint).
// Tests: tests/unit/train/trainer_test.cpp, tests/cli/train_*.sh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "train/arith_data.h"
#include "train/builtin_model.h"
#include "train/lr_schedule.h"
#include "train/optim/optim_modes.h"
#include "train/optimizer.h"
#include "train/sft_data.h"

namespace ferry::train {

enum class Executor : std::uint8_t { kMemory, kStream };

struct TrainConfig {
  std::string model_dir;       // empty: the embedded default model
  std::string data_path;       // empty: the embedded arithmetic data
  std::string eval_data_path;  // optional held-out JSONL (embedded data: its eval split)
  std::string output_dir;      // required
  std::string resume;          // checkpoint folder or output folder; empty: fresh start
  std::string metrics_out;     // JSONL metrics; empty: none

  std::int64_t max_steps = 600;
  int batch_size = 16;         // B sequences per micro-batch
  std::int64_t seq_len = 128;  // S, max tokens per sequence
  int grad_accum = 1;
  bool padding = false;
  bool strict = false;
  OverlongPolicy overlong = OverlongPolicy::kTruncate;

  LrSchedule schedule = LrSchedule::kCosine;
  double lr = 5e-3;  // the embedded demo's; the CLI uses 1e-5 with --model
  double min_lr_ratio = 0.1;
  std::int64_t warmup_steps = 20;
  AdamWConfig adamw;
  OptimMode optim;  // master weights x optimizer states (docs/optimizer.md)
  // 8bit states: ECMAScript regex over HF parameter names selecting the 8-bit ones (others keep
  // fp32 states); empty = all (optim/param_selection.h).
  std::string q8_params;

  Executor executor = Executor::kMemory;
  // Where the stream executor computes: "cpu" (the CPU backend over the emulated device tier) or
  // "cuda" (GPU 0; stream executor only). Eval and export stay on the CPU.
  std::string device = "cpu";
  int optimizer_threads = 0;           // stream: AdamW threads (0: StreamOptions' default)
  int device_update_layers = 0;        // stream: StreamOptions::device_update_layers (-1: all)
  int device_update_slots = 2;         // stream: StreamOptions::device_update_slots
  int resident_layers = 0;             // stream: StreamOptions::resident_layers (-1: all, -2: auto)
  std::string head_update = "early";   // stream: StreamOptions::head_update (early | late)
  bool device_update_prestage = true;  // stream: StreamOptions::device_update_prestage
  std::string gemm_precision = "auto";  // stream: auto | bf16 | f32 (model::parse_gemm_precision)
  // The weights forward/backward read (and that stream to the device) with an fp32 master: bf16
  // (the master rounded to bf16, TrainState::use_bf16_compute), f32, or auto (bf16 with
  // --device cuda, f32 on the CPU). bf16 masters always compute with their bf16 weights.
  std::string weights_dtype = "auto";
  // Gradients kept and moved as bf16 (TrainState::bf16_grads): f32 (default) or bf16 — half the
  // host bytes, the D2H and the optimizer's gradient reads; rounded after every micro-batch.
  std::string grad_dtype = "f32";
  std::string policy = "device";       // stream: activation policy (stream/activation_policy.h)
  int prefetch = 2;                    // stream: weight slots beyond the one in use
  std::int64_t device_budget_mib = 0;  // stream: device-tier budget, 0 = unlimited
  std::string plan_file;               // stream: take the policy from a `ferry plan` JSON
  std::string nvme_dir;                // stream: directory of NVMe-homed boundaries of a plan

  std::int64_t save_every = 0;  // 0: only at the end (when > 0 checkpoints are also kept)
  int keep_checkpoints = 2;
  std::int64_t eval_every = 100;  // 0: only at the end
  int eval_max_new_tokens = 8;
  std::int64_t log_every = 1;
  // MFU denominator, TFLOP/s of the compute device (dense bf16 on a GPU); 0: the device's known
  // peak (step_flops.h), none on the CPU backend (MFU then not shown).
  double peak_tflops = 0;
  std::uint64_t seed = 1234;
  bool quiet = false;  // no per-step lines / progress bar (tests)

  BuiltinModelSpec builtin;
  ArithSpec arith;
};

Status validate(const TrainConfig& c);

// --weights-dtype: whether an fp32 master's run computes with bf16-rounded weights.
Result<bool> bf16_compute_weights(std::string_view weights_dtype, std::string_view device);
// --grad-dtype: f32 or bf16 gradients (TrainState::bf16_grads).
Result<bool> bf16_gradients(std::string_view grad_dtype);

struct EvalPoint {
  std::int64_t step = 0;
  double loss = 0.0;
  double accuracy = 0.0;
  std::int64_t correct = 0, total = 0;
};

struct TrainSummary {
  std::vector<double> losses;  // per step run in this process (index 0 = first step run)
  std::vector<EvalPoint> evals;
  double baseline_accuracy = 0.0;  // majority-answer baseline on the eval split
  std::int64_t first_step = 0;     // step the run started from (0 or the resumed step)
  std::int64_t final_step = 0;
  double wall_s = 0.0;
  std::int64_t params = 0;
  // stream executor only
  double exposed_transfer_s = 0.0;    // compute blocked on copies / weight slots, whole run
  std::size_t device_peak_bytes = 0;  // peak of the device tier
  double host_bytes_per_param = 0.0;  // host arena bytes / parameters
  int resident_layers = 0;            // GPU-resident layers (--resident-layers, resolved)
  // Per compute window ([2L+1], plan numbering), ms per step: wall and exposed transfer time
  // (stream/window_report.h; also printed and in the metrics JSONL).
  std::vector<double> window_ms, window_exposed_ms;
  // Throughput of the steps run in this process (step_flops.h): FLOPs over the summed step time.
  double model_tflops = 0.0;        // 6 N tokens convention
  double hardware_tflops = 0.0;     // what ran, recompute included
  double mfu = 0.0;                 // model FLOPs / peak; 0 when the peak is unknown
  std::size_t host_peak_bytes = 0;  // peak resident set of the process
};

Result<TrainSummary> run_training(const TrainConfig& c);

}  // namespace ferry::train
