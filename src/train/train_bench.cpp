// SPDX-License-Identifier: Apache-2.0
#include "train/train_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "mem/budget.h"
#include "mem/device_info.h"
#include "model/config.h"
#include "model/model_binding.h"
#include "model/param_spec.h"
#include "train/batcher.h"
#include "train/builtin_model.h"
#include "train/rng.h"
#include "train/step_flops.h"
#include "train/stream/activation_policy.h"
#include "train/stream/device_plan.h"
#include "train/stream/plan_policy.h"
#include "train/stream/stream_executor.h"
#include "train/stream/window_report.h"
#include "train/trainer.h"

namespace ferry::train {

namespace {

// --batch-size auto reports the largest batch a cap fits up to this, beyond --max-batch (which
// only bounds the batch that runs: a 7B step at batch 256 takes ~50 s on an H200).
constexpr int kLargestBatchSearched = 4096;

// B sequences of exactly S random tokens, next-token targets (the last one ignored).
MicroBatch make_batch(int batch, std::int64_t seq, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  MicroBatch b;
  b.cu_seqlens.push_back(0);
  for (int s = 0; s < batch; ++s) {
    const std::size_t first = b.ids.size();
    for (std::int64_t t = 0; t < seq; ++t) {
      b.ids.push_back(
          static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(vocab)));
      b.positions.push_back(static_cast<std::int32_t>(t));
    }
    for (std::int64_t t = 0; t < seq; ++t) {
      b.targets.push_back(t + 1 < seq ? b.ids[first + static_cast<std::size_t>(t) + 1] : -100);
    }
    b.cu_seqlens.push_back(static_cast<std::int32_t>(b.ids.size()));
  }
  b.useful_tokens = b.padded_tokens = b.tokens();
  b.counted = b.tokens() - batch;
  return b;
}

// The device optimizer tail a `ferry plan` document was solved with (its problem's
// device_update_layers, K resolved; 0 when off or absent): its predicted step assumes that tail
// in the optimizer gate and its staging in GPU memory.
Result<int> plan_tail_layers(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, path));
  if (!j.contains("problem") || !j["problem"].is_object()) return 0;
  const Json k = j["problem"].value("device_update_layers", Json(0));
  return k.is_number_integer() ? k.get<int>() : 0;
}

// The model a `ferry plan` document was solved for (its "model": stream::device_plan_model);
// null when absent (a document from before it was recorded).
Result<Json> plan_model(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, path));
  return j.contains("model") ? j["model"] : Json(nullptr);
}

// Bytes over seconds in GB/s; 0 where nothing moved (no NVMe home).
double rate_gbps(std::uint64_t bytes, double seconds) {
  return seconds > 0.0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace

Result<Json> run_train_bench(const TrainBenchConfig& c) {
  if (c.steps < 1 || c.warmup < 0 || c.batch < 1 || c.seq < 2 || c.accum < 1) {
    return invalid_argument(
        "bench train: needs --steps >= 1, --warmup >= 0, batch >= 1, seq >= 2, grad-accum >= 1");
  }
  if (c.policies.empty()) return invalid_argument("bench train: no --policies");
  if (c.device != "cpu" && c.device != "cuda") {
    return invalid_argument("bench train: --device {} (expected cpu or cuda)", c.device);
  }
  kernels::Backend* be = &kernels::cpu_backend();
  std::string device_name = "cpu";
  if (c.device == "cuda") {
    FERRY_ASSIGN_OR_RETURN(be, kernels::cuda_backend(0));
    const mem::CudaInfo info = mem::query_cuda_info();
    if (!info.devices.empty()) device_name = info.devices.front().name;
  }
  const double peak = c.peak_tflops > 0 ? c.peak_tflops * 1e12 : known_peak_bf16_flops(device_name);
  FERRY_ASSIGN_OR_RETURN(const model::GemmPrecision precision,
                         model::parse_gemm_precision(c.gemm_precision, be->device()));
  FERRY_ASSIGN_OR_RETURN(const stream::HeadUpdate head_update,
                         stream::parse_head_update(c.head_update));
  FERRY_ASSIGN_OR_RETURN(const bool bf16_compute, bf16_compute_weights(c.weights_dtype, c.device));
  FERRY_ASSIGN_OR_RETURN(const bool bf16_grads, bf16_gradients(c.grad_dtype));

  // The random-weight model's config; each policy's host arena is filled in place with the
  // built-in init (the bits write_builtin_model would write), so no f32 model file or TrainState
  // sits beside the arena: the largest bench model is what the arena alone fits in host memory.
  BuiltinModelSpec spec = c.model;
  spec.max_positions = std::max<int>(spec.max_positions, static_cast<int>(c.seq));
  FERRY_ASSIGN_OR_RETURN(const model::ModelConfig config,
                         model::parse_model_config_text(builtin_config_json(spec), "bench config"));
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(config));
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  const TokenMatmulParams tm = token_matmul_params(geo);

  Json rep{
      {"bench", "train"},
      {"device", device_name},
      {"arch", spec.model_type},
      {"geometry",
       {{"layers", geo.layers},
        {"hidden", geo.hidden},
        {"heads", geo.heads},
        {"kv_heads", geo.kv_heads},
        {"head_dim", geo.head_dim},
        {"intermediate", geo.mlp_width},
        {"vocab", geo.vocab},
        {"tie_embeddings", config.tie_word_embeddings}}},
      {"params", tm.model_params},
      {"batch", c.batch},
      {"batch_auto", c.batch_auto},
      {"device_budget_bytes", c.device_budget_bytes == mem::MemoryBudget::kUnlimited
                                  ? Json(nullptr)
                                  : Json(c.device_budget_bytes)},
      {"grad_accum", c.accum},
      {"seq", c.seq},
      {"steps", c.steps},
      {"warmup", c.warmup},
      {"peak_tflops", peak / 1e12},
      {"optimizer", describe(c.optim)},
      {"gemm_precision", model::to_string(precision)},
      {"weights_dtype", bf16_compute || c.optim.master != MasterWeights::kF32 ? "bf16" : "f32"},
      {"grad_dtype", bf16_grads ? "bf16" : "f32"},
      // As asked: `all` (kDeviceUpdateAllLayers) as the model's layers, "auto" (a plan's own);
      // each policy reports the tail it ran (device_update_layers_run).
      {"device_update_layers", c.device_update_layers == stream::kDeviceUpdateAuto
                                   ? Json("auto")
                                   : Json(c.device_update_layers == stream::kDeviceUpdateAllLayers
                                              ? geo.layers
                                              : c.device_update_layers)},
      {"device_update_slots",
       c.device_update_layers != 0 ? Json(c.device_update_slots) : Json(nullptr)},
      {"head_update", c.head_update},
      // As asked (-1: all, -2: auto, null: not given); each policy reports the resolved K.
      {"resident_layers_asked",
       c.resident_layers == kResidentNotGiven ? Json(nullptr) : Json(c.resident_layers)},
      {"device_update_prestage",
       c.device_update_layers != 0 ? Json(c.device_update_prestage) : Json(nullptr)},
      {"policies", Json::array()}};
  AdamWConfig adamw;
  // One pinned host arena for every policy: the previous policy's, re-initialized to the same
  // bytes, instead of allocating and pinning tens of GB again per policy (a full-depth 3B policy
  // spent ~40 s outside its timed steps on the H200; setup_s now times the parts).
  std::unique_ptr<stream::HostArena> reuse;
  for (const std::string& name : c.policies) {
    Timer setup;
    BuiltinInit init(spec, c.seed, specs);
    const auto fill = [&](std::size_t i, float* out) { init.fill(i, out); };
    std::unique_ptr<stream::HostArena> arena;
    if (reuse) {
      reuse->reinitialize(fill);
      arena = std::move(reuse);
    } else {
      FERRY_ASSIGN_OR_RETURN(arena, stream::HostArena::create_initialized(
                                        config, c.optim, stream::StreamExecutor::host_tier(*be),
                                        fill, bf16_compute, bf16_grads));
    }
    const double arena_s = setup.elapsed_s();
    // A policy by name, or a `ferry plan` document's boundary homes (plan=FILE).
    stream::ActivationPolicy pol;
    double predicted_step_ms = 0;
    std::string plan_fingerprint;  // a plan document's (stream::plan_fingerprint)
    int plan_batch = 0;            // what a plan was solved for
    // GPU-resident layers as asked (not given: none); a plan runs its own K unless a number is
    // given (0 included); `auto` leaves a plan its K, which its solve already chose.
    int resident_asked = c.resident_layers == kResidentNotGiven ? 0 : c.resident_layers;
    Json plan_tail = nullptr;  // the device tail layers a plan was solved with
    // The tail this policy runs: as asked, or with auto a plan's own (named policies: none).
    int tail_layers =
        c.device_update_layers == stream::kDeviceUpdateAuto ? 0 : c.device_update_layers;
    if (name.rfind("plan=", 0) == 0) {
      const std::string nvme =
          (std::filesystem::temp_directory_path() / "ferry_bench_train_nvme").string();
      FERRY_ASSIGN_OR_RETURN(const stream::PlanPolicy pp,
                             stream::read_plan_policy(name.substr(5), geo.layers, nvme));
      // A plan solved for another model (architecture or shapes) fits another model's bytes:
      // H200, session 16, a --geometry qwen2.5-3b plan (Qwen2) fitted 40 GiB at batch 32, and
      // this bench's Qwen3 of that geometry (its q/k norm workspaces) ran it at batch 31.
      FERRY_ASSIGN_OR_RETURN(const Json planned, plan_model(name.substr(5)));
      const std::string differs =
          stream::device_plan_model_mismatch(planned, stream::device_plan_model(config));
      if (!differs.empty()) {
        rep["policies"].push_back(
            {{"policy", name},
             {"error", fmt::format("{} was solved for another model ({}): its GPU bytes and "
                                   "predicted step are not this run's; bench the plan's model "
                                   "(--arch qwen2 for a Qwen2.5 --geometry) or solve the plan "
                                   "for this one",
                                   name, differs)}});
        reuse = std::move(arena);
        continue;
      }
      pol = pp.policy;
      predicted_step_ms = pp.predicted_step_ms;
      plan_fingerprint = pp.fingerprint;
      plan_batch = pp.batch_size;
      if (c.resident_layers == kResidentNotGiven || c.resident_layers == stream::kResidentAuto) {
        resident_asked = pp.resident_layers;
      }
      FERRY_ASSIGN_OR_RETURN(const int k, plan_tail_layers(name.substr(5)));
      plan_tail = k;
      if (c.device_update_layers == stream::kDeviceUpdateAuto) tail_layers = k;
      const int run_k = tail_layers == stream::kDeviceUpdateAllLayers
                            ? geo.layers
                            : std::min(tail_layers, geo.layers);
      if (std::min(k, geo.layers) != run_k) {
        log::get("bench")->warn(
            "bench train: {} was solved for --device-update-layers {}, this run uses {}: its "
            "predicted step and GPU memory assume the plan's tail (ferry plan "
            "--device-update-layers)",
            name, k, run_k);
      }
    } else {
      FERRY_ASSIGN_OR_RETURN(pol, stream::parse_policy(name, geo.layers));
    }
    int b = c.batch;
    int largest_fitting = 0;  // batch auto: the largest batch the cap fits, --max-batch aside
    if (c.batch_auto) {
      // The device optimizer tail's staging counts against the cap like the rest of the plan.
      // So do GPU-resident layers given as a number or all (auto fills what the batch leaves).
      stream::ModelSizes sizes = stream::model_sizes(*arena);
      const int resident = resident_asked == stream::kResidentAuto
                               ? 0
                               : stream::ResidentLayers::resolve(*arena, resident_asked);
      sizes.resident_bytes = stream::ResidentLayers::bytes(
          *arena, resident, stream::bf16_weight_views(sizes, *be, precision));
      sizes.optimizer_tail_bytes = stream::DeviceOptimizerTail::staging_bytes(
          *arena, tail_layers, c.device_update_slots, resident);
      FERRY_ASSIGN_OR_RETURN(
          largest_fitting,
          stream::largest_batch(geo, sizes, pol, c.prefetch + 1, c.seq, c.device_budget_bytes, *be,
                                precision, kLargestBatchSearched));
      b = std::min(largest_fitting, c.max_batch);
      // A plan runs at the batch it was solved for, if the executor's plan fits it too.
      if (plan_batch > 0 && b > 0) b = std::min(b, plan_batch);
      if (b == 0) {
        rep["policies"].push_back(
            {{"policy", name},
             {"error", fmt::format("not even batch 1 fits the device budget of {}",
                                   mem::format_bytes(c.device_budget_bytes))}});
        reuse = std::move(arena);
        continue;
      }
    }
    const MicroBatch batch = make_batch(b, c.seq, geo.vocab, c.seed + 1);
    const std::int64_t tokens = static_cast<std::int64_t>(b) * c.seq;
    const stream::StreamOptions so{.policy = pol,
                                   .prefetch = c.prefetch,
                                   .device_budget_bytes = c.device_budget_bytes,
                                   .optimizer_threads = c.optimizer_threads,
                                   .gemm_precision = precision,
                                   .device_update_layers = tail_layers,
                                   .device_update_slots = c.device_update_slots,
                                   .resident_layers = resident_asked,
                                   .head_update = head_update,
                                   .device_update_prestage = c.device_update_prestage};
    Timer create;
    auto ex = stream::StreamExecutor::create(std::move(arena), config, c.seed, b, c.seq, so, *be);
    const double executor_s = create.elapsed_s();
    if (!ex.ok()) {
      rep["policies"].push_back({{"policy", name}, {"error", ex.status().to_string()}});
      continue;
    }
    stream::StreamExecutor& x = **ex;
    std::vector<double> step_s;
    StepFlops flops;
    double loss_first = 0, loss_last = 0;
    stream::TransferStats s0;
    for (int step = 0; step < c.warmup + c.steps; ++step) {
      if (step == c.warmup) s0 = x.stats();  // the timed part starts here
      Timer t;
      x.begin_step(c.accum);
      // Gradient accumulation: the optimizer runs once per c.accum micro-batches, the weights
      // stream twice per micro-batch.
      double loss = 0;
      for (int a = 0; a < c.accum; ++a) {
        const std::uint64_t f0 = x.stats().layer_forwards, b0 = x.stats().layer_backwards,
                            i0 = x.stats().internals_forwards;
        FERRY_ASSIGN_OR_RETURN(const model::ForwardResult r, x.micro_batch(batch.view()));
        loss += r.mean_loss() / c.accum;
        if (step >= c.warmup) {
          flops +=
              micro_batch_flops(geo, tm, batch.cu_seqlens, x.stats().layer_forwards - f0,
                                x.stats().layer_backwards - b0, x.stats().internals_forwards - i0);
        }
      }
      FERRY_TRY(x.finish_step(adamw, 1e-5, static_cast<std::int64_t>(step) + 1).status());
      const double dt = t.elapsed_s();
      if (step == 0) loss_first = loss;
      loss_last = loss;
      if (step >= c.warmup) step_s.push_back(dt);
    }
    x.wait_optimizer();  // the last update belongs to the run
    const stream::TransferStats& s = x.stats();
    double total_s = 0;
    for (double v : step_s) total_s += v;
    std::vector<double> ws(s.window_s.size()), wes(s.window_s.size());
    for (std::size_t w = 0; w < ws.size(); ++w) {
      ws[w] = s.window_s[w] - s0.window_s[w];
      wes[w] = s.window_exposed_s[w] - s0.window_exposed_s[w];
    }
    const auto report = stream::make_window_report(geo.layers, c.steps, ws, wes, total_s);
    const double per = 1.0 / c.steps;
    // Per update the device tail served (warmup included: every step ran the optimizer).
    auto tail_per_step = [&](std::uint64_t n) -> Json {
      const std::uint64_t steps = x.device_tail_stats().steps;
      return steps > 0 ? Json(static_cast<double>(n) / static_cast<double>(steps)) : Json(nullptr);
    };
    // The optimizer's time per step and a lower bound on how much of it compute hid: the forward
    // windows' exposed time is at most what the forward waited for updates (it also holds weight
    // copies), so 1 - that / optimizer time is a floor on the overlap.
    const double ms_per_step = 1e3 / (c.warmup + c.steps);  // every step ran the optimizer
    const double opt_ms = x.optimizer_busy_s() * ms_per_step;
    // The same per unit: each layer's update and the globals' (the plan's optimizer gate).
    Json opt_layer_ms = Json::array();
    const std::vector<double> unit_s = x.optimizer_unit_busy_s();
    for (int l = 0; l < geo.layers; ++l)
      opt_layer_ms.push_back(unit_s[static_cast<std::size_t>(l)] * ms_per_step);
    const double opt_globals_ms = unit_s.back() * ms_per_step;
    // The globals' two ready points (the forward waits for the embedding before its first layer,
    // for the final norm + lm_head only at the head): the embedding's and the head's share.
    const std::array<double, 2> globals_split = x.optimizer_globals_busy_s();
    double fwd_exposed_ms = 0;
    for (int l = 0; l < geo.layers; ++l) fwd_exposed_ms += report.measured_exposed_ms[l];
    const double hidden = opt_ms > 0 ? 1.0 - std::min(1.0, fwd_exposed_ms / opt_ms) : 1.0;
    // The device tail's mean per unit (warmup included): first H2D byte to last D2H byte, and
    // each phase (GPU clock on a GPU); with several slots the units overlap.
    const stream::DeviceTailStats tail = x.device_tail_stats();
    auto per_unit_ms = [&](double sum_s) -> Json {
      return tail.units_updated > 0 ? Json(sum_s * 1e3 / static_cast<double>(tail.units_updated))
                                    : Json(nullptr);
    };
    rep["policies"].push_back(
        {{"policy", name},
         {"describe", pol.describe()},
         {"batch_size", b},
         {"largest_fitting_batch", c.batch_auto ? Json(largest_fitting) : Json(nullptr)},
         // The batch a plan's prediction is for (it runs at batch_size, maybe fewer).
         {"plan_batch", plan_batch > 0 ? Json(plan_batch) : Json(nullptr)},
         // The device tail layers the plan was solved with (null: not a plan).
         {"plan_device_update_layers", plan_tail},
         // The device tail this policy ran (-1: all).
         {"device_update_layers_run", tail_layers},
         {"predicted_step_ms", predicted_step_ms > 0 ? Json(predicted_step_ms) : Json(nullptr)},
         {"plan_fingerprint", plan_fingerprint.empty() ? Json(nullptr) : Json(plan_fingerprint)},
         {"step_ms_median", median(step_s) * 1e3},
         {"step_ms_mean", total_s * per * 1e3},
         {"tokens_per_s", static_cast<double>(tokens) * c.accum * c.steps / total_s},
         {"model_tflops", flops.model / total_s / 1e12},
         {"hardware_tflops", flops.hardware / total_s / 1e12},
         {"mfu", peak > 0 ? flops.model / total_s / peak : 0.0},
         {"exposed_ms_per_step", (s.exposed_s - s0.exposed_s) * per * 1e3},
         {"exposed_pct", 100 * (s.exposed_s - s0.exposed_s) / total_s},
         {"optimizer_ms_per_step", opt_ms},
         {"optimizer_hidden_pct_at_least", 100 * hidden},
         {"setup_s",
          {{"arena", arena_s},
           {"arena_allocate", x.arena().setup_times().allocate_s},
           {"arena_zero", x.arena().setup_times().zero_s},
           {"arena_init", x.arena().setup_times().init_s},
           {"arena_round", x.arena().setup_times().round_s},
           {"executor", executor_s}}},
         {"optimizer_layer_ms", opt_layer_ms},
         {"optimizer_globals_ms", opt_globals_ms},
         {"optimizer_embed_ms", globals_split[0] * ms_per_step},
         {"optimizer_head_ms", globals_split[1] * ms_per_step},
         {"host_peak_bytes", host_peak_rss_bytes()},
         {"device_peak_bytes", x.device_peak_bytes()},
         {"device_planned_bytes", x.device_planned_bytes()},
         // Kept layer internals (+keep:LIST): how many, their device bytes, and the layer passes
         // per step (each kept layer's backward skips its re-forward: kept_layer_backwards).
         // GPU-resident layers (--resident-layers, resolved): their device bytes, and their
         // updates run on the device per step (every applied step: resident_layers).
         {"resident_layers", x.resident_layers()},
         {"device_resident_bytes", x.device_resident_bytes()},
         {"resident_updates", x.resident_stats().updates},
         {"kept_layers", pol.kept_count()},
         {"device_kept_bytes", x.device_kept_bytes()},
         {"layer_forwards_per_step", double(s.layer_forwards - s0.layer_forwards) * per},
         {"layer_backwards_per_step", double(s.layer_backwards - s0.layer_backwards) * per},
         // Of layer_forwards_per_step, the internals-only re-forwards before each backward.
         {"internals_forwards_per_step",
          double(s.internals_forwards - s0.internals_forwards) * per},
         {"kept_layer_backwards_per_step", double(s.kept_layers - s0.kept_layers) * per},
         {"host_bytes_per_param", x.arena().bytes_per_param()},
         {"weight_h2d_bytes_per_step", double(s.weight_h2d - s0.weight_h2d) * per},
         {"grad_d2h_bytes_per_step", double(s.grad_d2h - s0.grad_d2h) * per},
         {"act_bytes_per_step", double(s.act_d2h - s0.act_d2h + s.act_h2d - s0.act_h2d) * per},
         // Of those, the boundaries written to / read from NVMe (through the bounce buffer).
         {"nvme_write_bytes_per_step", double(s.nvme_write - s0.nvme_write) * per},
         {"nvme_read_bytes_per_step", double(s.nvme_read - s0.nvme_read) * per},
         // The host's time inside those disk calls, and the rates they give (0 without NVMe):
         // what the executor got from the disk, beside the profile's nvme_*_gbps.
         {"nvme_write_s_per_step", (s.nvme_write_s - s0.nvme_write_s) * per},
         {"nvme_read_s_per_step", (s.nvme_read_s - s0.nvme_read_s) * per},
         {"nvme_write_gbps",
          rate_gbps(s.nvme_write - s0.nvme_write, s.nvme_write_s - s0.nvme_write_s)},
         {"nvme_read_gbps", rate_gbps(s.nvme_read - s0.nvme_read, s.nvme_read_s - s0.nvme_read_s)},
         {"loss_first", loss_first},
         {"loss_last", loss_last},
         {"optimizer_busy_s", x.optimizer_busy_s()},
         // bf16 weight views (FERRY_BF16_WEIGHT_VIEWS): whether the layer GEMMs read the slots'
         // bf16 twins in place, and the layer GEMM weight converts since create (0 with views).
         {"bf16_weight_views", x.bf16_weight_views()},
         {"gemm_weight_converts", x.gemm_weight_converts()},
         // GEMM input reuse (FERRY_GEMM_INPUT_REUSE): on/off and the activation converts.
         {"gemm_input_reuse", x.gemm_input_reuse()},
         {"gemm_input_converts", x.gemm_input_converts()},
         {"device_update_units", x.device_tail_stats().units_updated},
         // Where the device (from the bottom) and the CPU (from the top) met, on average.
         {"device_update_units_per_step", tail_per_step(x.device_tail_stats().units_updated)},
         {"cpu_update_layers_per_step", tail_per_step(x.device_tail_stats().cpu_units)},
         {"device_update_h2d_bytes", x.device_tail_stats().h2d_bytes},
         {"device_update_d2h_bytes", x.device_tail_stats().d2h_bytes},
         {"device_update_busy_s", x.device_tail_stats().busy_s},
         {"device_update_slots", tail.slots > 0 ? Json(tail.slots) : Json(nullptr)},
         {"device_update_unit_ms_mean", per_unit_ms(tail.unit_s)},
         {"device_update_unit_h2d_ms_mean", per_unit_ms(tail.unit_h2d_s)},
         {"device_update_unit_kernel_ms_mean", per_unit_ms(tail.unit_kernel_s)},
         {"device_update_unit_d2h_ms_mean", per_unit_ms(tail.unit_d2h_s)},
         // Pre-staged during the backward (units, bytes, and the units the device then took
         // with their staging: only their gradients went up at submit).
         {"device_update_prestaged_units", tail.prestaged_units},
         {"device_update_prestaged_bytes", tail.prestaged_bytes},
         {"device_update_prestage_hits", tail.prestage_hits},
         {"windows", stream::window_report_json(report)}});
    reuse = stream::StreamExecutor::release_arena(std::move(*ex));
  }
  return rep;
}

std::string format_train_bench(const Json& r) {
  const bool autob = r.value("batch_auto", false);
  std::string out = fmt::format(
      "bench train on {} | {} {} layers, hidden {}, {:.3g} B params | batch {} x seq {} x accum {} "
      "| "
      "{} timed steps | {} | {} GEMMs | {} weights\n",
      r["device"].get<std::string>(), r.value("arch", std::string("qwen3")),
      r["geometry"]["layers"].get<int>(), r["geometry"]["hidden"].get<int>(),
      r["params"].get<double>() / 1e9,
      autob ? std::string("auto (largest that fits)") : std::to_string(r["batch"].get<int>()),
      r["seq"].get<std::int64_t>(), r.value("grad_accum", 1), r["steps"].get<int>(),
      r["optimizer"].get<std::string>(), r.value("gemm_precision", std::string("f32")),
      r.value("weights_dtype", std::string("f32")));
  out += fmt::format("{:<22} {:>5} {:>10} {:>10} {:>8} {:>8} {:>6} {:>11} {:>8} {:>12} {:>10}\n",
                     "policy", "batch", "step ms", "tok/s", "TFLOPS", "hw", "MFU%", "exposed ms",
                     "opt ms", "device peak", "host peak");
  for (const Json& p : r["policies"]) {
    if (p.contains("error")) {
      out +=
          fmt::format("{:<22} {}\n", p["policy"].get<std::string>(), p["error"].get<std::string>());
      continue;
    }
    out += fmt::format(
        "{:<22} {:>5} {:>10.1f} {:>10.0f} {:>8.2f} {:>8.2f} {:>6.1f} {:>11.1f} {:>8.1f} {:>12} "
        "{:>10}\n",
        p["policy"].get<std::string>(), p.value("batch_size", r["batch"].get<int>()),
        p["step_ms_median"].get<double>(), p["tokens_per_s"].get<double>(),
        p["model_tflops"].get<double>(), p["hardware_tflops"].get<double>(),
        100 * p["mfu"].get<double>(), p["exposed_ms_per_step"].get<double>(),
        p["optimizer_ms_per_step"].get<double>(),
        mem::format_bytes(p["device_peak_bytes"].get<std::size_t>()),
        mem::format_bytes(p["host_peak_bytes"].get<std::size_t>()));
    if (p.value("resident_layers", 0) > 0) {
      out += fmt::format("{:<22} resident layers: {} ({} of the device tier)\n", "",
                         p["resident_layers"].get<int>(),
                         mem::format_bytes(p["device_resident_bytes"].get<std::size_t>()));
    }
    if (p.value("device_update_units", std::uint64_t{0}) > 0) {
      out += fmt::format(
          "{:<22} device tail: {:.2f} layers/step (cpu {:.2f}), {} slots, per unit {:.1f} ms "
          "(h2d {:.1f}, kernels {:.1f}, d2h {:.1f})\n",
          "", p["device_update_units_per_step"].get<double>(),
          p["cpu_update_layers_per_step"].get<double>(), p["device_update_slots"].get<int>(),
          p["device_update_unit_ms_mean"].get<double>(),
          p["device_update_unit_h2d_ms_mean"].get<double>(),
          p["device_update_unit_kernel_ms_mean"].get<double>(),
          p["device_update_unit_d2h_ms_mean"].get<double>());
    }
  }
  return out;
}

}  // namespace ferry::train
