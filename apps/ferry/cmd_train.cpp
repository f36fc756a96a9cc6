// SPDX-License-Identifier: Apache-2.0
// `ferry train`: fine-tunes a model on the CPU with the in-memory reference executor or the
// layer-streaming executor (--executor stream; src/train/trainer.h, src/train/stream/). Without
// --model/--data it trains the embedded default: a tiny Qwen3-architecture model with a byte-level
// tokenizer on synthetic arithmetic word problems, reporting exact-match accuracy on a held-out
// split (no downloads).
//   ferry train --output-dir runs/demo
//   ferry train --model DIR --data sft.jsonl --output-dir out --max-steps 200 --lr 1e-5
//   ferry train --output-dir runs/q8 --optimizer-states 8bit --master bf16-kahan
//   ferry train --output-dir runs/s --executor stream --policy every:2 --device-budget-mib 64
//   ferry train --output-dir runs/p --plan auto --device-budget-mib 64
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "apps/ferry/commands.h"
#include "apps/ferry/device_update_flags.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "model/config.h"
#include "train/builtin_model.h"
#include "train/stream/plan_policy.h"
#include "train/trainer.h"

namespace ferry::app {
namespace {

// --plan auto: the plan of this run (model, batch, seq len, optimizer mode, device optimizer tail:
// its layers in the optimizer gate, its staging in GPU memory) for a GPU budget of
// --device-budget-mib and this host's physical memory (NVMe: the free space of --nvme-dir),
// solved as `ferry plan` would and written to OUT/plan.json, which the run then follows.
Status solve_auto_plan(train::TrainConfig& cfg, const std::string& master,
                       const std::string& states, bool keep_internals, bool resident_given,
                       double device_update_ms_per_layer) {
  if (cfg.device_budget_mib <= 0) {
    return invalid_argument(
        "train: --plan auto needs --device-budget-mib (the GPU memory the plan may use)");
  }
  TrainingPlanRequest r;
  if (cfg.model_dir.empty()) {
    FERRY_ASSIGN_OR_RETURN(r.config, model::parse_model_config_text(
                                         train::builtin_config_json(cfg.builtin), "built-in"));
  } else {
    FERRY_ASSIGN_OR_RETURN(r.config, model::load_model_config(cfg.model_dir));
  }
  r.batch_size = cfg.batch_size;
  r.seq_len = static_cast<int>(cfg.seq_len);
  r.gpu_gb = static_cast<double>(cfg.device_budget_mib) * 1048576.0 / 1e9;
  r.host_gb = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
              static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e9;
  if (!cfg.nvme_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.nvme_dir, ec);
    const auto space = std::filesystem::space(cfg.nvme_dir, ec);
    if (ec) return io_error("train: --nvme-dir {}: {}", cfg.nvme_dir, ec.message());
    r.nvme_dir = cfg.nvme_dir;
    r.nvme_gb = static_cast<double>(space.available) / 1e9;
  }
  r.master = master;
  r.optimizer_states = states;
  r.grad_dtype = cfg.grad_dtype;
  r.device = cfg.device;
  r.device_update_layers = cfg.device_update_layers;  // the tail this run will use
  r.device_update_slots = cfg.device_update_slots;
  // --device-update-ms-per-layer: the tail's measured time per layer (0: the profile's, else
  // derived, as ferry plan).
  r.device_update_ms_per_layer = device_update_ms_per_layer;
  r.keep_internals = keep_internals;
  // --resident-layers K given: the plan is solved with K (all: every layer); else it picks K.
  if (resident_given && cfg.resident_layers >= 0) r.resident_layers = cfg.resident_layers;
  if (resident_given && cfg.resident_layers == train::stream::kResidentAllLayers) {
    r.resident_layers = 1 << 20;  // clamped to the model's depth
  }
  std::error_code ec;
  std::filesystem::create_directories(cfg.output_dir, ec);
  if (ec) return io_error("train: cannot create {}: {}", cfg.output_dir, ec.message());
  const std::string path = cfg.output_dir + "/plan.json";
  FERRY_TRY(write_training_plan(r, path));
  log::get("train")->info("--plan auto: solved for gpu {:.3f} GB, host {:.1f} GB; written to {}",
                          r.gpu_gb, r.host_gb, path);
  cfg.plan_file = path;
  return ok_status();
}

// The device optimizer tail a `ferry plan` document was solved with: its "device_update_layers"
// (the layers the tail may update above the resident ones: the planner's choice with
// --device-update-layers auto), in documents before that key its problem's (clamped), else 0.
struct PlanTail {
  int layers = 0;       // the plan's tail
  int free_layers = 0;  // the plan's non-resident layers (what `all` means for it)
};
Result<PlanTail> read_plan_tail(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, path));
  try {
    PlanTail t;
    t.free_layers = j.at("num_layers").get<int>() - j.value("resident_layers", 0);
    if (j.contains("device_update_layers")) {
      t.layers = j.at("device_update_layers").get<int>();
    } else if (j.contains("problem") && j.at("problem").is_object()) {
      t.layers = std::clamp(j.at("problem").value("device_update_layers", 0), 0, t.free_layers);
    }
    if (t.layers < 0 || t.layers > t.free_layers) {
      return corrupt("train: plan {}: device_update_layers {} of {} non-resident layers", path,
                     t.layers, t.free_layers);
    }
    return t;
  } catch (const std::exception& e) {
    return corrupt("train: plan {}: {}", path, e.what());
  }
}

// A plan's tail applies unless --device-update-layers K|all (or its variable) is given; `auto`
// (given or not) runs the plan's. A given K that differs from the plan's is warned about: the
// plan's predicted step and GPU memory assume its own tail.
Status apply_plan_tail(train::TrainConfig& cfg, bool tail_given, bool tail_auto) {
  FERRY_ASSIGN_OR_RETURN(const PlanTail t, read_plan_tail(cfg.plan_file));
  if (!tail_given || tail_auto) {
    cfg.device_update_layers = t.layers;
    if (t.layers > 0) {
      log::get("train")->info(
          "--plan {}: device optimizer tail of {} layers (the plan's; --device-update-layers K "
          "overrides)",
          cfg.plan_file, t.layers);
    }
    return ok_status();
  }
  const int run = cfg.device_update_layers == train::stream::kDeviceUpdateAllLayers
                      ? t.free_layers
                      : std::min(cfg.device_update_layers, t.free_layers);
  if (run != t.layers) {
    log::get("train")->warn(
        "train: --plan {} was solved for --device-update-layers {}, this run uses {} (given): the "
        "plan's predicted step and GPU memory assume its tail",
        cfg.plan_file, t.layers, run);
  }
  return ok_status();
}

void register_train(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<train::TrainConfig>();
  auto schedule = std::make_shared<std::string>("cosine");
  auto overlong = std::make_shared<std::string>("truncate");
  auto states = std::make_shared<std::string>("fp32");
  auto master = std::make_shared<std::string>("fp32");
  auto executor = std::make_shared<std::string>("memory");
  auto no_keep = std::make_shared<bool>(false);
  auto device_ms = std::make_shared<double>(0.0);
  auto* cmd = app.add_subcommand(
      "train", "fine-tune a model (CPU, in-memory); no --model/--data: the embedded demo");
  auto* model = cmd->add_option("--model", cfg->model_dir, "Hugging Face model folder")
                    ->check(CLI::ExistingDirectory)
                    ->envname("FERRY_MODEL");
  auto* data = cmd->add_option("--data", cfg->data_path,
                               "JSONL: {prompt, response} or {messages: [...]} per line")
                   ->check(CLI::ExistingFile);
  model->needs(data);
  data->needs(model);
  cmd->add_option("--eval-data", cfg->eval_data_path, "held-out JSONL for exact-match eval")
      ->check(CLI::ExistingFile)
      ->needs(data);
  cmd->add_option("--output-dir", cfg->output_dir, "where checkpoints and the model go")
      ->required();
  cmd->add_option("--resume", cfg->resume, "checkpoint folder, or an output folder (newest)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--metrics-out", cfg->metrics_out, "JSONL metrics file");
  cmd->add_option("--max-steps", cfg->max_steps, "optimizer steps")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--batch-size", cfg->batch_size, "sequences per micro-batch")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seq-len", cfg->seq_len, "max tokens per sequence")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 24));
  cmd->add_option("--grad-accum", cfg->grad_accum, "micro-batches per step")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--padding", cfg->padding, "pad every sequence to --seq-len (default: packed)");
  cmd->add_flag("--strict", cfg->strict, "refuse malformed data lines (default: skip them)");
  cmd->add_option("--overlong", *overlong, "sequences longer than --seq-len: truncate or skip")
      ->check(CLI::IsMember({"truncate", "skip"}));
  auto* lr =
      cmd->add_option("--lr", cfg->lr, "peak learning rate (default 5e-3 demo, 1e-5 --model)")
          ->check(CLI::Range(1e-12, 10.0));
  cmd->add_option("--min-lr-ratio", cfg->min_lr_ratio, "final lr / peak (cosine, linear)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--warmup-steps", cfg->warmup_steps, "linear warmup steps")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  cmd->add_option("--schedule", *schedule, "constant, cosine or linear (after warmup)")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}));
  cmd->add_option("--weight-decay", cfg->adamw.weight_decay, "AdamW decay (not norms/biases)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--max-grad-norm", cfg->adamw.max_grad_norm, "global-norm clip; 0 = off")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--optimizer-states", *states,
                  "AdamW m, v: fp32, or 8bit (block-wise 8-bit codes, 2.004 bytes/param)")
      ->check(CLI::IsMember({"fp32", "8bit"}))
      ->envname("FERRY_OPTIMIZER_STATES");
  cmd->add_option("--8bit-params", cfg->q8_params,
                  "with --optimizer-states 8bit: ECMAScript regex over HF parameter names "
                  "selecting the 8-bit ones (e.g. 'mlp|experts'); the others keep fp32 states "
                  "(default: all)");
  cmd->add_option("--master", *master,
                  "master weights: fp32, bf16-kahan (bf16 + bf16 compensation) or bf16-sr "
                  "(bf16, stochastic rounding keyed by --seed); see docs/optimizer.md")
      ->check(CLI::IsMember({"fp32", "bf16-kahan", "bf16-sr"}))
      ->envname("FERRY_MASTER");
  cmd->add_option("--beta1", cfg->adamw.beta1)->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--beta2", cfg->adamw.beta2)->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--save-every", cfg->save_every, "checkpoint every N steps; 0 = none")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  cmd->add_option("--keep-checkpoints", cfg->keep_checkpoints, "newest checkpoints kept")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--eval-every", cfg->eval_every, "eval every N steps; 0 = at the end only")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  cmd->add_option("--eval-max-new-tokens", cfg->eval_max_new_tokens, "greedy decoding cap")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--peak-tflops", cfg->peak_tflops,
                  "compute device's peak TFLOP/s for MFU (default: known GPU peak; none on CPU)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--log-every", cfg->log_every, "print a step line every N steps")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd->add_option("--seed", cfg->seed, "seed for init (embedded model) and data order");
  cmd->add_option("--demo-layers", cfg->builtin.layers, "embedded model: layers")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--demo-hidden", cfg->builtin.hidden, "embedded model: hidden size (32 * heads)")
      ->check(CLI::Range(8, 4096));
  cmd->add_option("--executor", *executor,
                  "memory (everything resident, the reference) or stream (layer streaming)")
      ->check(CLI::IsMember({"memory", "stream"}));
  cmd->add_option("--device", cfg->device,
                  "stream: compute on cpu (emulated device tier) or cuda (GPU 0; implies "
                  "--executor stream)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gemm-precision", cfg->gemm_precision,
                  "stream: linear layers' GEMMs: bf16 (operands rounded to bf16, f32 "
                  "accumulation; PyTorch autocast), f32, or auto (bf16 on cuda, f32 on cpu)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  cmd->add_option("--weights-dtype", cfg->weights_dtype,
                  "weights the model computes with (and that stream to the device) with an fp32 "
                  "master: bf16 (the master rounded to bf16; half the link and host bytes of the "
                  "streaming copy), f32, or auto (bf16 on cuda, f32 on cpu)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  cmd->add_option("--grad-dtype", cfg->grad_dtype,
                  "gradients kept in host memory and moved off the device: f32, or bf16 (half the "
                  "host bytes, the D2H and the optimizer's reads; the running sum is rounded to "
                  "bf16 after every micro-batch)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  add_device_update_flags(cmd, cfg->device_update_layers, cfg->device_update_slots,
                          "stream: ", TailAuto::kTrainPlan);
  add_resident_layers_flag(cmd, cfg->resident_layers, "stream: ");
  add_head_update_flag(cmd, cfg->head_update, "stream: ");
  add_device_prestage_flag(cmd, cfg->device_update_prestage, "stream: ");
  cmd->add_option("--optimizer-threads", cfg->optimizer_threads,
                  "stream: CPU threads of the AdamW update (0: 1 beside CPU compute, all cores "
                  "but two beside a GPU)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--policy", cfg->policy,
                  "stream: activation policy: device, host, nvme:DIR, every:K[:host|:nvme:DIR], "
                  "mix:LETTERS[:DIR] (d/h/n/r per layer boundary)");
  cmd->add_option("--plan", cfg->plan_file,
                  "stream: run the activation policy of a `ferry plan` JSON, or `auto`: solve one "
                  "now for --device-budget-mib and this host's memory, with this run's optimizer "
                  "mode and --device-update-layers / --device-update-slots / "
                  "--device-update-ms-per-layer (OUT/plan.json; implies --executor stream)");
  add_device_update_ms_flag(cmd, *device_ms, "stream: with --plan auto: ");
  cmd->add_flag("--no-keep-internals", *no_keep,
                "stream: --plan auto keeps no layer's internals (every backward re-runs its "
                "layer's forward, as the fixed policies do)");
  cmd->add_option("--nvme-dir", cfg->nvme_dir, "stream: directory for NVMe homes of a --plan");
  cmd->add_option("--prefetch", cfg->prefetch, "stream: weight slots prefetched ahead")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--device-budget-mib", cfg->device_budget_mib,
                  "stream: device-tier budget in MiB; a batch that does not fit is refused "
                  "(0 = unlimited)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  cmd->callback([cfg, schedule, overlong, states, master, executor, lr, no_keep, device_ms, cmd,
                 &run] {
    // A plan's GPU-resident layers apply unless --resident-layers (or its variable) is given.
    const bool resident_given =
        cmd->count("--resident-layers") > 0 || std::getenv("FERRY_RESIDENT_LAYERS") != nullptr;
    // Likewise a plan's device optimizer tail, unless K or all is given (auto: the plan's).
    const bool tail_given = cmd->count("--device-update-layers") > 0 ||
                            std::getenv("FERRY_DEVICE_UPDATE_LAYERS") != nullptr;
    const bool tail_auto = cfg->device_update_layers == kDeviceUpdateAuto;
    if (tail_auto && cfg->plan_file.empty()) {
      throw CLI::ValidationError("--device-update-layers",
                                 "auto needs --plan auto (the planner chooses the tail) or --plan "
                                 "FILE (the plan's tail)");
    }
    // The tail's measured time is for the planner: given on the command line, it needs --plan
    // auto (its variable alone is ignored without one, as ferry plan ignores it without a tail;
    // CLI11 counts a value from the variable too, hence the getenv).
    if (cmd->count("--device-update-ms-per-layer") > 0 &&
        std::getenv("FERRY_DEVICE_UPDATE_MS_PER_LAYER") == nullptr && cfg->plan_file != "auto") {
      throw CLI::ValidationError("--device-update-ms-per-layer",
                                 "is the planner's device time per layer: it needs --plan auto");
    }
    cfg->executor = *executor == "stream" || !cfg->plan_file.empty() || cfg->device == "cuda"
                        ? train::Executor::kStream
                        : train::Executor::kMemory;
    if (lr->count() == 0 && !cfg->model_dir.empty()) cfg->lr = 1e-5;
    auto sched = train::parse_lr_schedule(*schedule);
    if (!sched.ok()) throw CLI::ValidationError("--schedule", sched.status().message());
    cfg->schedule = *sched;
    auto states_kind = train::parse_optimizer_states(*states);
    if (!states_kind.ok()) {
      throw CLI::ValidationError("--optimizer-states", states_kind.status().message());
    }
    auto mw = train::parse_master_weights(*master);
    if (!mw.ok()) throw CLI::ValidationError("--master", mw.status().message());
    cfg->optim = {.master = *mw, .states = *states_kind};
    cfg->overlong =
        *overlong == "skip" ? train::OverlongPolicy::kSkip : train::OverlongPolicy::kTruncate;
    if (cfg->builtin.hidden % cfg->builtin.head_dim != 0) {
      throw CLI::ValidationError("--demo-hidden", "must be a multiple of 32");
    }
    cfg->builtin.heads = cfg->builtin.hidden / cfg->builtin.head_dim;
    cfg->builtin.kv_heads =
        cfg->builtin.heads % 2 == 0 ? cfg->builtin.heads / 2 : cfg->builtin.heads;
    cfg->builtin.intermediate = 3 * cfg->builtin.hidden;
    if (const Status st = train::validate(*cfg); !st.ok()) {
      throw CLI::ValidationError(st.message());
    }
    run = [cfg, master, states, no_keep, device_ms, resident_given, tail_given, tail_auto] {
      if (cfg->plan_file == "auto") {
        const Status st =
            solve_auto_plan(*cfg, *master, *states, !*no_keep, resident_given, *device_ms);
        if (!st.ok()) return fail(st);
      }
      if (!cfg->plan_file.empty()) {
        const Status st = apply_plan_tail(*cfg, tail_given, tail_auto);
        if (!st.ok()) return fail(st);
      }
      if (!cfg->plan_file.empty() && !resident_given) {
        auto k = train::stream::read_plan_resident_layers(cfg->plan_file);
        if (!k.ok()) return fail(k.status());
        cfg->resident_layers = *k;
        if (*k > 0) {
          log::get("train")->info(
              "--plan {}: layers 0..{} GPU-resident (the plan's; "
              "--resident-layers overrides)",
              cfg->plan_file, *k - 1);
        }
      }
      auto r = train::run_training(*cfg);
      if (!r.ok()) return fail(r.status());
      const train::TrainSummary& s = *r;
      if (!s.evals.empty()) {
        const train::EvalPoint& first = s.evals.front();
        const train::EvalPoint& last = s.evals.back();
        std::printf(
            "summary: steps %lld-%lld in %.1f s | params %lld | exact match %.1f%% (step "
            "%lld) -> %.1f%% (step %lld), baseline %.1f%%\n",
            static_cast<long long>(s.first_step), static_cast<long long>(s.final_step), s.wall_s,
            static_cast<long long>(s.params), 100.0 * first.accuracy,
            static_cast<long long>(first.step), 100.0 * last.accuracy,
            static_cast<long long>(last.step), 100.0 * s.baseline_accuracy);
      } else {
        std::printf("summary: steps %lld-%lld in %.1f s | params %lld\n",
                    static_cast<long long>(s.first_step), static_cast<long long>(s.final_step),
                    s.wall_s, static_cast<long long>(s.params));
      }
      return 0;
    };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_train);
}  // namespace ferry::app
