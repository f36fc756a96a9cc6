// SPDX-License-Identifier: Apache-2.0
#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "core/progress.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "mem/device_info.h"
#include "model/model_binding.h"
#include "model/tokenizer/chat_template.h"
#include "train/batcher.h"
#include "train/greedy_eval.h"
#include "train/optim/param_selection.h"
#include "train/step_flops.h"
#include "train/stream/plan_policy.h"
#include "train/stream/plan_traffic.h"
#include "train/stream/stream_executor.h"
#include "train/stream/window_report.h"
#include "train/train_checkpoint.h"

namespace ferry::train {

namespace fs = std::filesystem;

Status validate(const TrainConfig& c) {
  if (c.output_dir.empty()) return invalid_argument("train: --output-dir is required");
  if (c.max_steps < 1) return invalid_argument("train: --max-steps must be >= 1");
  if (c.batch_size < 1) return invalid_argument("train: --batch-size must be >= 1");
  if (c.seq_len < 2) return invalid_argument("train: --seq-len must be >= 2");
  if (c.grad_accum < 1) return invalid_argument("train: --grad-accum must be >= 1");
  if (!(c.lr > 0.0) || !std::isfinite(c.lr)) return invalid_argument("train: --lr must be > 0");
  if (c.warmup_steps < 0) return invalid_argument("train: --warmup-steps must be >= 0");
  if (c.min_lr_ratio < 0.0 || c.min_lr_ratio > 1.0) {
    return invalid_argument("train: min lr ratio must be in [0, 1]");
  }
  if (c.save_every < 0 || c.eval_every < 0 || c.log_every < 1) {
    return invalid_argument("train: --save-every/--eval-every must be >= 0, --log-every >= 1");
  }
  if (c.prefetch < 1) return invalid_argument("train: --prefetch must be >= 1");
  if (!(c.peak_tflops >= 0.0) || !std::isfinite(c.peak_tflops)) {
    return invalid_argument("train: --peak-tflops must be a finite number >= 0");
  }
  if (c.device_budget_mib < 0) return invalid_argument("train: --device-budget-mib must be >= 0");
  if (c.device != "cpu" && c.device != "cuda") {
    return invalid_argument("train: --device {} (expected cpu or cuda)", c.device);
  }
  if (c.device == "cuda" && c.executor != Executor::kStream) {
    return invalid_argument("train: --device cuda runs the stream executor (--executor stream)");
  }
  if (!c.q8_params.empty() && c.optim.states != OptimizerStates::k8Bit) {
    return invalid_argument("train: --8bit-params needs --optimizer-states 8bit");
  }
  if (c.data_path.empty() != c.model_dir.empty()) {
    return invalid_argument(
        "train: give both --model and --data, or neither (the embedded default)");
  }
  return {};
}

namespace {

// What the job trains on: model folder contents, tokenizer and tokenized data.
struct Job {
  std::unique_ptr<TrainState> state;
  std::unique_ptr<model::Tokenizer> tok;
  std::string config_json;
  std::map<std::string, std::string> passthrough;  // tokenizer files copied to the export
  std::vector<TokenizedExample> train;
  std::vector<TokenizedExample> eval;
};

}  // namespace

Result<bool> bf16_gradients(std::string_view grad_dtype) {
  if (grad_dtype == "bf16") return true;
  if (grad_dtype == "f32") return false;
  return invalid_argument("train: --grad-dtype {} (expected f32 or bf16)", grad_dtype);
}

Result<bool> bf16_compute_weights(std::string_view weights_dtype, std::string_view device) {
  if (weights_dtype == "bf16") return true;
  if (weights_dtype == "f32") return false;
  if (weights_dtype == "auto") return device == "cuda";
  return invalid_argument("train: --weights-dtype {} (expected auto, bf16 or f32)", weights_dtype);
}

namespace {

Status load_model_into(Job& job, const std::string& dir, const TrainConfig& c) {
  FERRY_ASSIGN_OR_RETURN(auto loaded, model::load_model_f32(dir));
  std::vector<bool> q8;
  if (c.optim.states == OptimizerStates::k8Bit) {
    std::vector<std::string> names;
    for (const auto& [name, t] : loaded->named) names.push_back(name);
    FERRY_ASSIGN_OR_RETURN(q8, select_8bit_params(names, c.q8_params));
  }
  FERRY_ASSIGN_OR_RETURN(job.state, TrainState::from_loaded(*loaded, c.optim, c.seed, q8));
  FERRY_ASSIGN_OR_RETURN(const bool bf16_compute, bf16_compute_weights(c.weights_dtype, c.device));
  if (bf16_compute) FERRY_TRY(job.state->use_bf16_compute());
  FERRY_ASSIGN_OR_RETURN(job.state->bf16_grads, bf16_gradients(c.grad_dtype));
  FERRY_ASSIGN_OR_RETURN(job.config_json, read_file(dir + "/config.json"));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json"}) {
    const std::string p = dir + "/" + f;
    if (fs::exists(p)) {
      FERRY_ASSIGN_OR_RETURN(job.passthrough[f], read_file(p));
    }
  }
  if (!job.passthrough.count("tokenizer.json")) {
    return not_found("train: {} has no tokenizer.json", dir);
  }
  FERRY_ASSIGN_OR_RETURN(
      model::Tokenizer tok,
      model::Tokenizer::from_json_text(job.passthrough["tokenizer.json"], dir + "/tokenizer.json"));
  job.tok = std::make_unique<model::Tokenizer>(std::move(tok));
  if (static_cast<std::int64_t>(job.tok->vocab_size()) > job.state->geometry.vocab) {
    return invalid_argument("train: tokenizer of {} has {} ids, the model's vocabulary only {}",
                            dir, job.tok->vocab_size(), job.state->geometry.vocab);
  }
  if (auto it = job.passthrough.find("tokenizer_config.json"); it != job.passthrough.end()) {
    auto tmpl = model::read_chat_template(dir + "/tokenizer_config.json");
    if (tmpl.ok() && !model::detect_chat_template(*tmpl).ok()) {
      log::get("train")->warn(
          "the chat template of {} is not plain ChatML; training renders plain ChatML", dir);
    }
  }
  return {};
}

Result<Job> prepare_job(const TrainConfig& c, DataReport* report, DataReport* eval_report) {
  Job job;
  std::vector<SftExample> train_ex, eval_ex;
  if (c.model_dir.empty()) {
    const std::string init = fmt::format("{}/.builtin-init-{}", c.output_dir, ::getpid());
    FERRY_TRY(write_builtin_model(init, c.builtin, c.seed));
    Status st = load_model_into(job, init, c);
    std::error_code ec;
    if (st.ok()) {
      // load_model_f32 mapped the files; TrainState holds copies, so the folder can go.
      fs::remove_all(init, ec);
    }
    FERRY_TRY(st);
    ArithSplit split = make_arith_split(c.arith);
    train_ex = std::move(split.train);
    eval_ex = std::move(split.eval);
  } else {
    FERRY_TRY(load_model_into(job, c.model_dir, c));
    FERRY_ASSIGN_OR_RETURN(train_ex, read_sft_jsonl(c.data_path, c.strict, report));
    if (!c.eval_data_path.empty()) {
      FERRY_ASSIGN_OR_RETURN(eval_ex, read_sft_jsonl(c.eval_data_path, c.strict, eval_report));
    }
  }
  FERRY_ASSIGN_OR_RETURN(job.train,
                         tokenize_dataset(*job.tok, train_ex, c.seq_len, c.overlong, report));
  if (!eval_ex.empty()) {
    FERRY_ASSIGN_OR_RETURN(job.eval,
                           tokenize_dataset(*job.tok, eval_ex, c.seq_len, c.overlong, eval_report));
  }
  return job;
}

void log_report(const char* what, const DataReport& r, std::int64_t seq_len,
                OverlongPolicy overlong) {
  auto lg = log::get("train");
  lg->info("{}: examples={} malformed_lines={} truncated={} skipped={}", what, r.examples,
           r.malformed, r.truncated, r.skipped);
  if (r.truncated > 0) {
    lg->warn("{}: {} examples longer than --seq-len {} were truncated (--overlong skip drops them)",
             what, r.truncated, seq_len);
  }
  if (r.skipped > 0 && overlong == OverlongPolicy::kSkip) {
    lg->warn("{}: {} examples skipped (longer than --seq-len {} or nothing left to train)", what,
             r.skipped, seq_len);
  }
}

}  // namespace

Result<TrainSummary> run_training(const TrainConfig& c) {
  FERRY_TRY(validate(c));
  Timer wall;
  auto lg = log::get("train");
  std::error_code ec;
  fs::create_directories(c.output_dir, ec);
  if (ec) return io_error("train: cannot create {}: {}", c.output_dir, ec.message());

  DataReport report, eval_report;
  FERRY_ASSIGN_OR_RETURN(Job job, prepare_job(c, &report, &eval_report));
  log_report("train data", report, c.seq_len, c.overlong);
  if (!job.eval.empty()) log_report("eval data", eval_report, c.seq_len, c.overlong);
  TrainState& s = *job.state;

  TrainerState ts;
  ts.seed = c.seed;
  ts.data_fingerprint = data_fingerprint(job.train);
  if (!c.resume.empty()) {
    FERRY_ASSIGN_OR_RETURN(ts, load_checkpoint(c.resume, s));
    if (ts.data_fingerprint != data_fingerprint(job.train)) {
      return invalid_argument(
          "train: --resume {}: the checkpoint was trained on different data (fingerprint "
          "mismatch); resume needs the same data, --seq-len and tokenizer",
          c.resume);
    }
    if (ts.seed != c.seed) {
      return invalid_argument("train: --resume {}: checkpoint seed {} differs from --seed {}",
                              c.resume, ts.seed, c.seed);
    }
    if (ts.step >= c.max_steps) {
      lg->warn("checkpoint is at step {} >= --max-steps {}: nothing to train", ts.step,
               c.max_steps);
    }
  }

  kernels::Backend& be = kernels::cpu_backend();  // the reference executor, eval, export
  kernels::Backend* step_be = &be;                // where the stream executor computes
  std::string device_name;                        // GPU name for the known-peak MFU
  if (c.device == "cuda") {
    FERRY_ASSIGN_OR_RETURN(step_be, kernels::cuda_backend(0));
    const mem::CudaInfo info = mem::query_cuda_info();
    if (!info.devices.empty()) device_name = info.devices.front().name;
  }
  Batcher batcher(&job.train, c.seed, c.batch_size, c.seq_len, c.padding,
                  std::max<std::int32_t>(0, job.tok->token_to_id("<|endoftext|>")));
  FERRY_ASSIGN_OR_RETURN(auto compute,
                         model::ModelCompute::create(s.geometry, batcher.max_tokens(), be));
  const LrScheduleConfig sched{.kind = c.schedule,
                               .peak = c.lr,
                               .min_lr_ratio = c.min_lr_ratio,
                               .warmup_steps = c.warmup_steps,
                               .total_steps = c.max_steps};

  TrainSummary sum;
  sum.params = s.num_elements();
  sum.first_step = ts.step;
  sum.baseline_accuracy = majority_baseline(job.train, job.eval);
  lg->info(
      "model: {} layers={} hidden={} params={} | data: {} train / {} eval examples | B={} S={} "
      "accum={} {} | steps={} lr={:.1e} {} warmup={}",
      s.config.model_type, s.geometry.layers, s.geometry.hidden, sum.params, job.train.size(),
      job.eval.size(), c.batch_size, c.seq_len, c.grad_accum, c.padding ? "padded" : "packed",
      c.max_steps, c.lr, to_string(c.schedule), c.warmup_steps);
  {
    // What this mode costs per parameter in the streaming arena (bf16 gradients from the GPU),
    // and what the in-memory executor holds (f32 gradients, and an f32 compute copy of bf16
    // weights). With --8bit-params the states are the real mixture by element count.
    std::int64_t q8_elements = 0, q8_count = 0;
    for (std::size_t i = 0; i < s.num_params(); ++i) {
      if (!s.optim.params[i].q8()) continue;
      ++q8_count;
      q8_elements += s.master->named[i].second.numel();
    }
    const double q8_fraction = static_cast<double>(q8_elements) / static_cast<double>(sum.params);
    const HostBytesPerParam arena =
        mixed_host_bytes_per_param(c.optim, q8_fraction, s.bf16_grads ? DType::kBF16 : DType::kF32);
    const double bf16_truth =
        c.optim.master == MasterWeights::kF32 ? 0.0 : arena.weights + arena.master;
    const double q8_bytes = host_bytes_per_param({c.optim.master, OptimizerStates::k8Bit}).states;
    const double here_states = (s.m ? 8.0 : 0.0) + q8_fraction * q8_bytes;
    const double here =
        4.0 /* f32 master or compute view */ + bf16_truth + here_states + 4.0 /* f32 grads */;
    const std::string selection =
        c.q8_params.empty()
            ? std::string()
            : fmt::format(" (--8bit-params \"{}\": {} of {} parameters, {:.1f} % of elements)",
                          c.q8_params, q8_count, s.num_params(), 100.0 * q8_fraction);
    lg->info(
        "optimizer: {}{} | host bytes/param (streaming arena): weights {:.0f} + master {:.0f} + "
        "states {:.3f} + grads {:.0f} = {:.3f} ({:.2f} GB for these params); in-memory executor "
        "{:.3f}",
        describe(c.optim), selection, arena.weights, arena.master, arena.states, arena.grads,
        arena.total(), arena.total() * static_cast<double>(sum.params) / 1e9, here);
  }

  std::unique_ptr<stream::StreamExecutor> streamer;
  stream::PlanPolicy plan_policy;  // the --plan document's predictions, if any
  if (!c.plan_file.empty() && c.executor != Executor::kStream) {
    return invalid_argument("train: --plan runs on --executor stream");
  }
  if (c.device_update_layers != 0 && c.executor != Executor::kStream) {
    return invalid_argument("train: --device-update-layers runs on --executor stream");
  }
  if (c.resident_layers != 0 && c.executor != Executor::kStream) {
    return invalid_argument("train: --resident-layers runs on --executor stream");
  }
  if (c.executor == Executor::kStream) {
    stream::ActivationPolicy policy;
    if (!c.plan_file.empty()) {
      FERRY_ASSIGN_OR_RETURN(const stream::PlanPolicy pp,
                             stream::read_plan_policy(c.plan_file, s.geometry.layers, c.nvme_dir));
      policy = pp.policy;
      plan_policy = pp;
      if (pp.batch_size != c.batch_size || pp.seq_len != c.seq_len) {
        lg->warn("plan {} was solved for batch {} x seq {}; running batch {} x seq {}", c.plan_file,
                 pp.batch_size, pp.seq_len, c.batch_size, c.seq_len);
      }
      if (pp.keep_weight_spans > 0) {
        lg->warn("plan {}: {} spans keep their weights on the GPU; this executor re-streams them",
                 c.plan_file, pp.keep_weight_spans);
      }
    } else {
      FERRY_ASSIGN_OR_RETURN(policy, stream::parse_policy(c.policy, s.geometry.layers));
    }
    FERRY_ASSIGN_OR_RETURN(const model::GemmPrecision gemm_precision,
                           model::parse_gemm_precision(c.gemm_precision, step_be->device()));
    FERRY_ASSIGN_OR_RETURN(const stream::HeadUpdate head_update,
                           stream::parse_head_update(c.head_update));
    const stream::StreamOptions so{
        .policy = policy,
        .prefetch = c.prefetch,
        .device_budget_bytes = c.device_budget_mib > 0
                                   ? static_cast<std::size_t>(c.device_budget_mib) << 20
                                   : mem::MemoryBudget::kUnlimited,
        .optimizer_threads = c.optimizer_threads,
        .gemm_precision = gemm_precision,
        .device_update_layers = c.device_update_layers,
        .device_update_slots = c.device_update_slots,
        .resident_layers = c.resident_layers,
        .head_update = head_update,
        .device_update_prestage = c.device_update_prestage};
    FERRY_ASSIGN_OR_RETURN(
        streamer, stream::StreamExecutor::create(s, c.batch_size, c.seq_len, so, *step_be));
    sum.host_bytes_per_param = streamer->arena().bytes_per_param();
    sum.resident_layers = streamer->resident_layers();
    lg->info(
        "executor: stream on {} | {} GEMMs | {} weights | {} grads | policy {} | {} weight slots | "
        "device tier {} planned (budget {}) | host arena {} = {:.2f} bytes/param",
        device_name.empty() ? std::string("cpu") : device_name, model::to_string(gemm_precision),
        s.bf16_weights() ? "bf16" : "f32", s.bf16_grads ? "bf16" : "f32", policy.describe(),
        c.prefetch + 1, mem::format_bytes(streamer->device_planned_bytes()),
        c.device_budget_mib > 0 ? mem::format_bytes(so.device_budget_bytes) : "unlimited",
        mem::format_bytes(streamer->arena().total_bytes()), sum.host_bytes_per_param);
    if (streamer->resident_layers() > 0) {
      lg->info(
          "resident layers: 0..{} on the device ({} of the device tier; no weight streaming, "
          "gradient D2H or CPU update for them)",
          streamer->resident_layers() - 1, mem::format_bytes(streamer->device_resident_bytes()));
    }
  }
  // Eval, checkpoints and the export read TrainState: bring the streamed state back first.
  auto sync_state = [&]() -> Status { return streamer ? streamer->store_to(s) : Status{}; };

  std::ofstream metrics;
  if (!c.metrics_out.empty()) {
    metrics.open(c.metrics_out, c.resume.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics) return io_error("train: cannot open --metrics-out {}", c.metrics_out);
  }
  auto run_eval = [&](std::int64_t step) -> Status {
    if (job.eval.empty()) return {};
    FERRY_TRY(sync_state());
    Timer t;
    FERRY_ASSIGN_OR_RETURN(const EvalResult r,
                           evaluate(*compute, s.params, *job.tok, job.eval, batcher.max_tokens(),
                                    c.eval_max_new_tokens));
    sum.evals.push_back({step, r.loss, r.accuracy(), r.correct, r.total});
    if (!c.quiet) {
      std::printf(
          "eval step %lld | loss %.4f | exact match %lld/%lld = %.1f%% (baseline %.1f%%) "
          "| %.1f s\n",
          static_cast<long long>(step), r.loss, static_cast<long long>(r.correct),
          static_cast<long long>(r.total), 100.0 * r.accuracy(), 100.0 * sum.baseline_accuracy,
          t.elapsed_s());
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      metrics << Json{{"type", "eval"},
                      {"step", step},
                      {"eval_loss", r.loss},
                      {"exact_match", r.accuracy()},
                      {"correct", r.correct},
                      {"total", r.total},
                      {"baseline", sum.baseline_accuracy}}
                     .dump()
              << "\n";
      metrics.flush();
    }
    return {};
  };

  if (ts.step == 0 && c.eval_every > 0) FERRY_TRY(run_eval(0));

  // Throughput accounting (step_flops.h). MFU against --peak-tflops, else the GPU's data-sheet
  // dense bf16 peak when it is known; the CPU backend's peak is not known (no MFU).
  const TokenMatmulParams matmul_params = token_matmul_params(s.geometry);
  const double peak_flops =
      c.peak_tflops > 0 ? c.peak_tflops * 1e12 : known_peak_bf16_flops(device_name);
  StepFlops run_flops;
  double run_step_s = 0.0;

  // A run that follows a plan counts, per step, the plan's boundary traffic and layer passes next
  // to the executor's (plan_traffic.h), reported at the end of the run.
  std::optional<stream::PlanTrafficReport> traffic;
  if (streamer && !c.plan_file.empty()) {
    traffic = stream::make_plan_traffic_report(plan_policy.policy);
  }

  std::unique_ptr<ProgressBar> bar;
  if (!c.quiet) bar = std::make_unique<ProgressBar>("train", c.max_steps, "step");
  MicroBatch mb;
  while (ts.step < c.max_steps) {
    const std::int64_t step = ts.step + 1;
    Timer step_timer;
    const double exposed_before = streamer ? streamer->stats().exposed_s : 0.0;
    const stream::TrafficCounts traffic_before =
        traffic ? stream::traffic_counters(streamer->stats()) : stream::TrafficCounts{};
    stream::TrafficCounts traffic_expected;
    if (streamer) {
      streamer->begin_step(c.grad_accum);
    } else {
      s.grads->zero();
    }
    double loss = 0.0;
    std::int64_t useful = 0, padded = 0, computed = 0;
    StepFlops flops;
    for (int a = 0; a < c.grad_accum; ++a) {
      batcher.next(ts.cursor, mb);
      const model::PackedBatch batch = mb.view();
      model::ForwardResult r;
      std::uint64_t fwd = 0, bwd = 0, internals = 0;
      if (streamer) {
        // The two counters only: TransferStats also holds per-window vectors (no copy per step).
        const std::uint64_t fwd0 = streamer->stats().layer_forwards;
        const std::uint64_t bwd0 = streamer->stats().layer_backwards;
        const std::uint64_t int0 = streamer->stats().internals_forwards;
        FERRY_ASSIGN_OR_RETURN(r, streamer->micro_batch(batch));
        fwd = streamer->stats().layer_forwards - fwd0;
        bwd = streamer->stats().layer_backwards - bwd0;
        internals = streamer->stats().internals_forwards - int0;
      } else {
        FERRY_ASSIGN_OR_RETURN(r, compute->forward(s.params, batch));
        FERRY_TRY(compute->backward(s.params, batch, s.grads->grads));
        s.round_grads_to_bf16();  // bf16 gradients: what the stream executor's host arena keeps
        fwd = bwd = static_cast<std::uint64_t>(s.geometry.layers);
      }
      flops += micro_batch_flops(s.geometry, matmul_params, mb.cu_seqlens, fwd, bwd, internals);
      if (traffic) {
        traffic_expected += stream::expected_micro_batch(plan_policy.policy, s.geometry.hidden,
                                                         mb.tokens(), c.batch_size * c.seq_len);
      }
      loss += r.mean_loss() / c.grad_accum;
      useful += mb.useful_tokens;
      padded += mb.padded_tokens;
      computed += mb.tokens();
    }
    const double lr = lr_at(sched, ts.opt_step + 1);
    StepOutcome o;
    if (streamer) {
      FERRY_ASSIGN_OR_RETURN(o, streamer->finish_step(c.adamw, lr, ts.opt_step + 1));
    } else {
      FERRY_ASSIGN_OR_RETURN(o, optimizer_step(s, c.adamw, lr, ts.opt_step + 1, c.grad_accum, be));
    }
    const double exposed_ms = streamer ? (streamer->stats().exposed_s - exposed_before) * 1e3 : 0.0;
    if (traffic) {
      stream::add_step(
          *traffic, step, c.grad_accum, computed, traffic_expected,
          stream::measured_between(traffic_before, stream::traffic_counters(streamer->stats()),
                                   s.geometry.layers, c.grad_accum));
    }
    ts.step = step;
    if (o.applied) {
      ++ts.opt_step;
      ts.nonfinite_run = 0;
    } else {
      ++ts.nonfinite_run;
      lg->warn("step {}: non-finite gradient norm ({}), loss {}: update skipped ({} in a row)",
               step, o.grad_norm, loss, ts.nonfinite_run);
    }
    sum.losses.push_back(loss);
    const double step_s = step_timer.elapsed_s();
    run_flops += flops;
    run_step_s += step_s;
    const double model_tflops = flops.model / step_s / 1e12;
    const double hw_tflops = flops.hardware / step_s / 1e12;
    const double mfu = peak_flops > 0 ? flops.model / step_s / peak_flops : 0.0;
    const std::size_t host_peak = host_peak_rss_bytes();
    if (!c.quiet && (step % c.log_every == 0 || step == c.max_steps)) {
      const std::string stream_part =
          streamer ? fmt::format(" | exposed transfer {:.1f} ms | device peak {}", exposed_ms,
                                 mem::format_bytes(streamer->device_peak_bytes()))
                   : std::string();
      const std::string mfu_part = peak_flops > 0 ? fmt::format(", MFU {:.1f} %", 100 * mfu) : "";
      std::printf(
          "step %5lld/%lld | loss %.4f | lr %.2e | %7.1f ms | tok/s %.0f (padded %.0f, "
          "computed %lld tok) | TFLOPS %.3g (6N; hw %.3g%s) | norm %.3f | host peak %s%s%s\n",
          static_cast<long long>(step), static_cast<long long>(c.max_steps), loss, lr, step_s * 1e3,
          double(useful) / step_s, double(padded) / step_s, static_cast<long long>(computed),
          model_tflops, hw_tflops, mfu_part.c_str(), o.grad_norm,
          mem::format_bytes(host_peak).c_str(), stream_part.c_str(), o.applied ? "" : " | SKIPPED");
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      metrics << Json{{"type", "step"},
                      {"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"step_ms", step_s * 1e3},
                      {"tokens_per_s", double(useful) / step_s},
                      {"padded_tokens_per_s", double(padded) / step_s},
                      {"useful_tokens", useful},
                      {"padded_tokens", padded},
                      {"computed_tokens", computed},
                      {"grad_norm", o.grad_norm},
                      {"clip", o.clip},
                      {"skipped", !o.applied},
                      {"exposed_transfer_ms", exposed_ms},
                      {"tflops", model_tflops},
                      {"hardware_tflops", hw_tflops},
                      {"mfu", peak_flops > 0 ? Json(mfu) : Json(nullptr)},
                      {"host_peak_bytes", static_cast<std::int64_t>(host_peak)},
                      {"device_peak_bytes",
                       streamer ? static_cast<std::int64_t>(streamer->device_peak_bytes()) : 0}}
                     .dump()
              << "\n";
      metrics.flush();
    }
    if (bar) bar->update(step, fmt::format("loss {:.4f}", loss));
    if (ts.nonfinite_run >= 3) {
      if (bar) bar->finish();
      return internal_error(
          "train: stopping at step {}: 3 consecutive steps had non-finite gradients (lower --lr, "
          "check the data); the last checkpoint in {} holds the weights before them",
          step, c.output_dir);
    }
    if (c.eval_every > 0 && step % c.eval_every == 0 && step != c.max_steps) {
      FERRY_TRY(run_eval(step));
    }
    if (c.save_every > 0 && step % c.save_every == 0) {
      FERRY_TRY(sync_state());
      FERRY_TRY(save_checkpoint(c.output_dir, s, ts, c.keep_checkpoints));
    }
  }
  if (bar) bar->finish();
  if (streamer && ts.step > sum.first_step) {
    stream::WindowReport wr = stream::make_window_report(
        s.geometry.layers, ts.step - sum.first_step, streamer->stats().window_s,
        streamer->stats().window_exposed_s, run_step_s);
    wr.predicted_compute_ms = plan_policy.window_compute_ms;
    wr.predicted_exposed_ms = plan_policy.window_exposed_ms;
    wr.predicted_step_ms = plan_policy.predicted_step_ms;
    if (!c.quiet) std::printf("%s", stream::format_window_table(wr).c_str());
    if (metrics.is_open()) metrics << stream::window_report_json(wr).dump() << "\n";
    sum.window_ms = wr.measured_ms;
    sum.window_exposed_ms = wr.measured_exposed_ms;
  }
  if (traffic && traffic->steps > 0) {
    if (!c.quiet) std::printf("%s", stream::format_plan_traffic(*traffic).c_str());
    if (metrics.is_open()) metrics << stream::plan_traffic_json(*traffic).dump() << "\n";
    if (!traffic->match()) {
      lg->warn(
          "plan {}: the executor's traffic differs from the plan's in {} of {} steps: {}",
          c.plan_file, traffic->mismatched_steps, traffic->steps,
          stream::traffic_diff(traffic->first_mismatch_expected, traffic->first_mismatch_measured));
    }
  }
  if (run_step_s > 0) {
    sum.model_tflops = run_flops.model / run_step_s / 1e12;
    sum.hardware_tflops = run_flops.hardware / run_step_s / 1e12;
    sum.mfu = peak_flops > 0 ? run_flops.model / run_step_s / peak_flops : 0.0;
  }
  sum.host_peak_bytes = host_peak_rss_bytes();
  FERRY_TRY(sync_state());
  if (streamer) {
    sum.exposed_transfer_s = streamer->stats().exposed_s;
    sum.device_peak_bytes = streamer->device_peak_bytes();
  }
  FERRY_TRY(run_eval(ts.step));
  if (c.save_every > 0 && ts.step % c.save_every != 0) {
    FERRY_TRY(save_checkpoint(c.output_dir, s, ts, c.keep_checkpoints));
  }
  std::map<std::string, std::string> passthrough = job.passthrough;
  FERRY_TRY(export_hf_model(c.output_dir, s, job.config_json, passthrough));
  sum.final_step = ts.step;
  sum.wall_s = wall.elapsed_s();
  lg->info("done: step={} wall_s={:.1f} model written to {}", ts.step, sum.wall_s, c.output_dir);
  return sum;
}

}  // namespace ferry::train
