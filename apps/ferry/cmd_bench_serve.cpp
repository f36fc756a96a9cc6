// SPDX-License-Identifier: Apache-2.0
// `ferry bench serve [--model DIR | --geometry NAME] [--modes resident,static,cpu-experts,paged]
//   [--budget-gib X | --expert-slots N] [--prompt-tokens P] [--decode-tokens D]
//   [--trace FILE | --synthetic calibrated|spread|none] [--link-gbps G] [--policy P] [--seed S]
//   [--miss-cost-model [--cpu-gflops F|auto]] [--bypass-window N] [--serial-miss-copies]
//   [--device cpu|cuda] [--expert-dtype f32|bf16] [--dense-dtype f32|bf16] [--kv-dtype f32|bf16]
//   [--no-cuda-graphs] [--no-device-resolve] [--cpu-expert-kernel fast|exact] [--json OUT]`
// --cpu-expert-kernel: how cpu-experts computes on the CPU (default: fast with --device cuda,
// exact on the CPU engine; docs/serve.md "The fast CPU expert path").
// --dense-dtype bf16 stores the dense weights (attention, router, lm_head, embedding) in bf16 on
// either engine (f32 arithmetic on the widened weights): half their bytes in the budget, so more
// expert slots at the same --budget-gib. Default f32 for every geometry and model.
// --device cuda runs every mode on the CUDA engine (GPU 0); its roofline rate is a pinned
// host->GPU copy measured in the same process, or with --link-gbps G the paced rate G (the copy
// stream held to G by timed waits; the paced probe's measured rate is reported beside it).
// Decode steps of resident and static run as CUDA graphs unless --no-cuda-graphs; so do paged
// decode steps, whose expert slots are resolved on the GPU (device-side slot resolution, LRU)
// unless --no-device-resolve (the host pager's per-layer round trip, for the A/B).
// Prefill and single-stream decode throughput of every expert mode on one random-weight model
// (or a loaded one) with the same prompt and forced routing; the measurement and the definitions
// are in serve/bench/serve_bench.h, the geometries in serve/bench/bench_geometry.h. A table goes
// to stdout, logs to stderr, the JSON report to --json (- for stdout instead of the table).
// The 48-layer qwen3-30b-a3b geometry's experts are drawn straight into the packed host store in
// --expert-dtype (bf16: ~60 GiB of host memory in all) and every mode's engine reads that store;
// the host bytes are estimated (and checked against MemAvailable) before anything is built, and
// the JSON reports the estimate beside the measured peak RSS.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "apps/ferry/cpu_expert_kernel_flag.h"
#include "apps/ferry/miss_placement_flags.h"
#include "apps/ferry/serve_device_flag.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "mem/budget.h"
#include "model/model_binding.h"
#include "serve/bench/bench_geometry.h"
#include "serve/bench/serve_bench.h"
#include "serve/builtin_model.h"
#include "serve/dense_weights.h"
#include "serve/sampler.h"
#include "serve/trace_synth.h"

namespace ferry::app {
namespace {

struct BenchServeConfig {
  std::string model_dir;
  std::string geometry = "qwen3-30b-a3b-mini";
  std::vector<std::string> modes = {"resident", "static", "cpu-experts", "paged"};
  double budget_gib = 0;  // 0: the geometry's scaled default
  int expert_slots = 0;
  int prompt_tokens = 128;
  int decode_tokens = 64;
  std::string trace_file;
  std::string synthetic = "calibrated";
  double link_gbps = 0;
  std::string policy = "lru";
  MissPlacementFlags miss;
  std::uint64_t seed = 1;
  std::string json_out;
  std::string device = "cpu";
  std::string expert_dtype = "f32";
  std::string dense_dtype = "f32";
  std::string kv_dtype = "f32";
  bool no_cuda_graphs = false;     // the A/B baseline: decode steps op by op
  bool no_device_resolve = false;  // the A/B baseline: paged slots resolved by the host pager
  std::string cpu_expert_kernel;   // --cpu-expert-kernel ("": the engine's default)
};

// MemAvailable of /proc/meminfo in bytes (0 if unknown).
std::size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string fmt_opt(const Json& j, const char* f) {
  return j.is_null() ? std::string("-") : fmt::format(fmt::runtime(f), j.get<double>());
}

void print_table(const Json& rep, const std::string& what) {
  std::printf("%s\n", what.c_str());
  const bool cuda = rep["device"] == "cuda";
  const Json& sz = rep["sizing"];
  // The engine's device budget: its fixed part (CPU engine: the KV pool; dense weights are read
  // in place) + the expert slots.
  const std::size_t fixed = sz[cuda ? "device_fixed_bytes" : "kv_bytes"].get<std::size_t>();
  std::printf("device budget %s = %s %s + %d expert slots per layer x %d MoE layers x %s\n",
              mem::format_bytes(sz["device_budget_bytes"]).c_str(),
              mem::format_bytes(fixed).c_str(),
              cuda ? "(dense weights, KV, tables, activations)" : "(KV pool)",
              sz["slots_per_layer"].get<int>(), sz["moe_layers"].get<int>(),
              mem::format_bytes(sz["expert_bytes"]).c_str());
  const std::string dense =
      cuda ? mem::format_bytes(sz["dense_device_bytes"].get<std::size_t>()) +
                 " in GPU memory (part of the fixed bytes)"
           : mem::format_bytes(sz["dense_bytes_charged"].get<std::size_t>()) +
                 " charged to the plan (the CPU engine reads them in host memory)";
  std::printf("dense weights %s: %s\n", sz["dense_dtype"].get<std::string>().c_str(),
              dense.c_str());
  std::printf("%-12s %12s %12s %8s %9s %14s %10s %10s %22s %6s\n", "mode", "prefill t/s",
              "decode t/s", "hit", "host/tok", "h2d B/tok dec", "roofline%", "syncs/tok",
              "device peak/budget", "ids=");
  for (const Json& m : rep["modes"]) {
    const std::string mode = m["mode"];
    if (!m["ran"].get<bool>()) {
      std::printf("%-12s skipped: %s\n", mode.c_str(), m["skipped"].get<std::string>().c_str());
      continue;
    }
    const Json& p = m["prefill"];
    const Json& d = m["decode"];
    const std::size_t budget = m["device_budget_bytes"];
    // Paged: misses per decode token computed from host memory (miss placement), no copy.
    const Json host_tok =
        d.contains("host_computed_misses_per_token") ? d["host_computed_misses_per_token"] : Json();
    std::printf("%-12s %12.1f %12.2f %8s %9s %14.0f %10s %10.2f %22s %6s\n", mode.c_str(),
                p["tokens_per_s"].get<double>(), d["tokens_per_s"].get<double>(),
                fmt_opt(d["hit_rate"], "{:.3f}").c_str(), fmt_opt(host_tok, "{:.2f}").c_str(),
                d["h2d_bytes_per_token"].get<double>(),
                fmt_opt(d["roofline_pct"], "{:.1f}").c_str(),
                d[cuda ? "host_syncs_per_token" : "copy_syncs_per_token"].get<double>(),
                (mem::format_bytes(m["device_peak_bytes"]) + "/" +
                 (budget ? mem::format_bytes(budget) : std::string("none")))
                    .c_str(),
                m["same_tokens_as_reference"].get<bool>() ? "yes" : "NO");
  }
  if (cuda) {
    for (const Json& m : rep["modes"]) {
      if (!m["ran"].get<bool>()) continue;
      const Json& g = m["cuda_graphs"];
      const Json& pc = m["paced_copies"];
      std::printf("%-12s graphs: %llu captured, %llu replays, %llu warm-up, %llu eligible%s%s",
                  m["mode"].get<std::string>().c_str(), g["captures"].get<unsigned long long>(),
                  g["replays"].get<unsigned long long>(),
                  g["warmup_steps"].get<unsigned long long>(),
                  g["eligible_steps"].get<unsigned long long>(),
                  g["disabled_reason"].get<std::string>().empty() ? "" : "; DISABLED: ",
                  g["disabled_reason"].get<std::string>().c_str());
      if (m.contains("device_resolve") && m["device_resolve"]["enabled"].get<bool>()) {
        std::printf(" | device-resolved layer calls %llu",
                    m["device_resolve"]["layer_calls"].get<unsigned long long>());
      }
      if (pc["copies"].get<unsigned long long>() > 0) {
        std::printf(" | paced copies %llu (%s)", pc["copies"].get<unsigned long long>(),
                    mem::format_bytes(pc["bytes"].get<std::size_t>()).c_str());
      }
      std::printf("\n");
    }
  }
  const Json& mp = rep["miss_placement"];
  for (const Json& m : rep["modes"]) {
    if (m["ran"].get<bool>() && m.contains("cpu_expert_kernel") &&
        m["cpu_expert_kernel"].is_string()) {
      std::printf("%s ran the %s CPU expert kernel (--cpu-expert-kernel)%s\n",
                  m["mode"].get<std::string>().c_str(),
                  m["cpu_expert_kernel"].get<std::string>().c_str(),
                  m["mode"] == "paged" ? " on its host-computed misses" : "");
    }
    if (!m["ran"].get<bool>() || !m.contains("miss_placement") ||
        !m["miss_placement"]["on"].get<bool>()) {
      continue;
    }
    const Json& pl = m["miss_placement"];
    std::string rate = fmt::format("{:.2f} GFLOP/s", pl["cpu_gflops_used"].get<double>());
    if (pl["cpu_rate_measured"].is_object()) {
      const Json& mr = pl["cpu_rate_measured"];
      rate += fmt::format(
          " measured (--cpu-gflops auto: {:.2f} GB/s of expert bytes, {} kernel, one row of "
          "one expert, {} experts)",
          mr["expert_gbps"].get<double>(), mr["kernel"].get<std::string>(),
          mr["experts"].get<int>());
    } else {
      rate += " assumed (--cpu-gflops)";
    }
    std::printf(
        "paged miss placement: cost model %s, CPU %s; bypass window %d; host/tok = "
        "decode misses computed from host memory per token (not copied%s)\n",
        mp["cost_model"].get<bool>() ? "on" : "off", rate.c_str(), mp["bypass_window"].get<int>(),
        cuda ? "; CPU arithmetic: logits not bit-identical" : "");
  }
  const Json& r = rep["ratios"];
  std::printf("paged/static: decode %s prefill %s | paged/cpu-experts: decode %s prefill %s\n",
              fmt_opt(r["paged_over_static_decode"], "{:.2f}x").c_str(),
              fmt_opt(r["paged_over_static_prefill"], "{:.2f}x").c_str(),
              fmt_opt(r["paged_over_cpu_experts_decode"], "{:.2f}x").c_str(),
              fmt_opt(r["paged_over_cpu_experts_prefill"], "{:.2f}x").c_str());
  const std::string syncs =
      cuda ? "syncs = every host wait on the GPU (logits, routing hook, routed ids); experts " +
                 rep["expert_dtype"].get<std::string>() + ", dense weights " +
                 rep["dense_dtype"].get<std::string>() + ", K/V " +
                 rep["kv_dtype"].get<std::string>() + ", activations f32"
           : std::string("syncs = host syncs of expert copies (other syncs not counted)");
  std::printf(
      "hit = device hit rate of expert uses in decode (host-computed misses count as misses); "
      "roofline%% = (h2d bytes / %.1f GB/s) / decode time%s; %s; resident runs without the "
      "budget (reference); ids= same greedy ids as the reference\n",
      rep["link"]["roofline_gbps"].get<double>(),
      mp["cost_model"].get<bool>() || mp["bypass_window"].get<int>() > 0
          ? " (with host-computed misses the link carries fewer bytes: those experts are not "
            "copied, only their result rows go up, so it is the link's busy share, not a "
            "distance to a copy-every-miss bound)"
          : "",
      syncs.c_str());
}

int run_bench_serve(const BenchServeConfig& cfg) {
  auto lg = log::get("serve");
  // The backend first: --device cuda without CUDA or a GPU fails here, before any weights exist.
  auto backend = serve_backend(cfg.device);
  if (!backend.ok()) {
    return fail(Status(backend.status().code(),
                       "bench serve --device cuda: " + backend.status().message()));
  }
  const bool cuda = cfg.device == "cuda";
  if (!cuda && cfg.no_cuda_graphs) {
    return fail(invalid_argument("bench serve: --no-cuda-graphs needs --device cuda"));
  }
  // Modes.
  serve::bench::ServeBenchConfig bc;
  for (const std::string& m : cfg.modes) {
    auto mode = serve::parse_expert_mode(m);
    if (!mode.ok()) return fail(mode.status());
    bc.modes.push_back(*mode);
  }
  auto policy = serve::parse_eviction_policy(cfg.policy);
  if (!policy.ok()) return fail(policy.status());
  bc.policy = *policy;
  bc.miss_cost_model = cfg.miss.cost_model;
  bc.cpu_gflops = cfg.miss.cpu_gflops;
  bc.measure_cpu_gflops = cfg.miss.cpu_gflops_auto;
  bc.bypass_window = cfg.miss.bypass_window;
  bc.overlap_misses = !cfg.miss.serial_copies;
  bc.device_resolve = !cfg.no_device_resolve;
  auto cpu_kernel = cpu_expert_kernel_of(cfg.cpu_expert_kernel);
  if (!cpu_kernel.ok()) return fail(cpu_kernel.status());
  bc.cpu_expert_kernel = *cpu_kernel;
  auto expert_dtype = serve::parse_expert_dtype(cfg.expert_dtype);
  if (!expert_dtype.ok()) return fail(expert_dtype.status());
  bc.expert_dtype = *expert_dtype;
  auto dense_dtype = serve::parse_dense_dtype(cfg.dense_dtype);
  if (!dense_dtype.ok()) return fail(dense_dtype.status());
  bc.dense_dtype = *dense_dtype;
  auto kv_dtype = serve::parse_kv_dtype(cfg.kv_dtype);
  if (!kv_dtype.ok()) return fail(kv_dtype.status());
  bc.kv_dtype = *kv_dtype;
  const std::size_t expert_elem = dtype_size(bc.expert_dtype);
  if (!cuda && bc.expert_dtype != DType::kF32) {
    // Before any weights exist (the 48-layer geometry takes minutes to build).
    return fail(unimplemented("bench serve: {} experts need --device cuda (the CPU engine is f32)",
                              to_string(bc.expert_dtype)));
  }

  // The model: a loaded folder or a built-in geometry with seeded random weights.
  std::unique_ptr<model::LoadedModel> loaded;
  std::unique_ptr<serve::BuiltinModel> builtin;
  std::string what;
  serve::bench::ParamBytes pb;
  std::size_t host_estimate = 0;  // built-in geometries: bench_host_bytes
  double build_s = 0;
  if (!cfg.model_dir.empty()) {
    auto m = model::load_model_f32(cfg.model_dir);
    if (!m.ok()) return fail(m.status());
    loaded = std::move(*m);
    pb = serve::bench::count_params(loaded->config);
    what = "model " + cfg.model_dir;
  } else {
    auto g = serve::bench::find_bench_geometry(cfg.geometry);
    if (!g.ok()) return fail(g.status());
    auto counted = serve::bench::count_params(g->spec);
    if (!counted.ok()) return fail(counted.status());
    pb = *counted;
    auto host = serve::bench::bench_host_bytes(*g, bc.expert_dtype);
    if (!host.ok()) return fail(host.status());
    const std::string host_what =
        host->packed ? fmt::format(
                           "{} f32 dense weights + {} {} experts drawn straight into the packed "
                           "host store",
                           mem::format_bytes(host->f32_weights),
                           mem::format_bytes(host->expert_store), cfg.expert_dtype)
                     : fmt::format("{} f32 weights + {} packed {} expert store",
                                   mem::format_bytes(host->f32_weights),
                                   mem::format_bytes(host->expert_store), cfg.expert_dtype);
    const std::size_t avail = host_memory_available();
    if (avail > 0 && host->total() > avail * 9 / 10) {
      return fail(resource_exhausted(
          "bench serve: geometry {} needs {} of host memory ({}; the engine computes the dense "
          "weights in f32), {} available; {}",
          g->name, mem::format_bytes(host->total()), host_what, mem::format_bytes(avail),
          host->packed && bc.expert_dtype == DType::kF32
              ? "use --device cuda --expert-dtype bf16 (half the expert bytes)"
              : "use --geometry qwen3-30b-a3b-mini or qwen3-30b-a3b-2l"));
    }
    host_estimate = host->total();
    lg->info("bench serve: building geometry={} params={} seed={} host_bytes={} ({}), available {}",
             g->name, pb.total, cfg.seed, mem::format_bytes(host->total()), host_what,
             avail ? mem::format_bytes(avail) : std::string("unknown"));
    const auto tb = std::chrono::steady_clock::now();
    auto b = host->packed ? serve::make_builtin_moe_packed(g->spec, cfg.seed, bc.expert_dtype)
                          : serve::make_builtin_moe(g->spec, cfg.seed);
    if (!b.ok()) return fail(b.status());
    builtin = std::move(*b);
    build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count();
    lg->info("bench serve: weights built in {:.1f} s, host peak rss {}", build_s,
             mem::format_bytes(host_peak_rss_bytes()));
    bc.host_store = builtin->experts.get();  // packed: every engine reads this one store
    what = "geometry " + g->name + " (" + g->scaling + ")";
  }
  const model::DecoderGeometry& geo = loaded ? loaded->geometry : builtin->geometry;
  const model::ModelParams& params = loaded ? loaded->params : builtin->params;
  if (geo.experts == 0) return fail(invalid_argument("bench serve: {} is a dense model", what));
  const int max_pos = static_cast<int>(loaded ? loaded->config.max_position_embeddings
                                              : builtin->config.max_position_embeddings);
  if (cfg.prompt_tokens + cfg.decode_tokens + 1 > max_pos) {
    return fail(invalid_argument(
        "bench serve: --prompt-tokens {} + --decode-tokens {} + 1 exceeds the model's {} positions",
        cfg.prompt_tokens, cfg.decode_tokens, max_pos));
  }

  // Sizing: slots, or a total budget with dense weights charged (default: the target's fraction).
  const std::size_t model_bytes = pb.total * sizeof(float);
  bc.expert_slots = cfg.expert_slots;
  // The dense weights in the engine's dense dtype (what its device budget holds of them).
  bc.dense_bytes = serve::dense_weight_bytes(params, bc.dense_dtype);
  std::string budget_basis;
  if (cfg.expert_slots == 0) {
    if (cfg.budget_gib > 0) {
      bc.budget_bytes = static_cast<std::size_t>(cfg.budget_gib * double(1ull << 30));
      budget_basis = "--budget-gib";
    } else {
      bc.expert_fraction = serve::bench::target_expert_fraction();
      bc.all_expert_bytes = pb.experts * expert_elem;
      budget_basis = fmt::format(
          "default: dense weights + KV + {:.1f}% of the expert bytes, the share 24 GiB holds "
          "after the dense weights on Qwen3-30B-A3B bf16",
          100.0 * bc.expert_fraction);
    }
  } else {
    budget_basis = "--expert-slots";
  }

  // Prompt and routing.
  serve::Rng rng(cfg.seed * 7919 + 11);
  for (int i = 0; i < cfg.prompt_tokens; ++i) {
    bc.prompt.push_back(static_cast<std::int32_t>(rng.next() % std::uint64_t(geo.vocab)));
  }
  bc.decode_tokens = cfg.decode_tokens;
  serve::RoutingTrace trace;
  std::string trace_what;
  if (!cfg.trace_file.empty()) {
    auto t = serve::RoutingTrace::load(cfg.trace_file);
    if (!t.ok()) return fail(t.status());
    trace = std::move(*t);
    if (trace.experts != geo.experts || trace.top_k != geo.top_k) {
      return fail(
          invalid_argument("bench serve: trace {} routes {} of {} experts, the model {} of {}",
                           cfg.trace_file, trace.top_k, trace.experts, geo.top_k, geo.experts));
    }
    trace_what = "file " + cfg.trace_file;
  } else if (cfg.synthetic != "none") {
    std::vector<int> moe_layers;
    for (int l = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l]) moe_layers.push_back(l);
    }
    trace = serve::make_synthetic_trace({.experts = geo.experts,
                                         .top_k = geo.top_k,
                                         .moe_layers = moe_layers,
                                         .sessions = 1,
                                         .prefill_tokens = cfg.prompt_tokens,
                                         .decode_tokens = cfg.decode_tokens + 1,
                                         .spread = cfg.synthetic == "spread",
                                         .seed = cfg.seed + 1});
    trace_what = "synthetic " + cfg.synthetic;
  }
  // none: the model's own router decides (no routing hook, so no hook round trip on CUDA).
  const bool forced = !cfg.trace_file.empty() || cfg.synthetic != "none";
  if (!forced) trace_what = "none (the model's own router)";
  bc.trace = forced ? &trace : nullptr;

  bc.link_gbps = cfg.link_gbps;
  bc.cuda_graphs = !cfg.no_cuda_graphs;
  bc.backend = cuda ? *backend : nullptr;
  const double memcpy_gbps = serve::bench::measure_host_copy_gbps();
  double pinned_gbps = 0, paced_gbps = 0;
  if (cuda) {
    auto g = serve::bench::measure_pinned_h2d_gbps();
    if (!g.ok()) return fail(g.status());
    pinned_gbps = *g;
    if (cfg.link_gbps > 0) {
      // The paced link's own rate, measured the same way (at most --link-gbps).
      auto pg = serve::bench::measure_pinned_h2d_gbps(cfg.link_gbps);
      if (!pg.ok()) return fail(pg.status());
      paced_gbps = *pg;
      if (cfg.link_gbps > pinned_gbps) {
        lg->warn(
            "bench serve: --link-gbps {} is above the measured link ({:.1f} GB/s): pacing "
            "cannot make copies faster",
            cfg.link_gbps, pinned_gbps);
      }
    }
  }
  // Paced: the roofline is the paced rate (what the link is allowed to carry).
  bc.roofline_gbps = cfg.link_gbps > 0 ? cfg.link_gbps : cuda ? pinned_gbps : memcpy_gbps;
  lg->info(
      "bench serve: device={} modes={} prompt={} decode={} link_gbps={} memcpy_gbps={:.1f} "
      "pinned_h2d_gbps={:.1f}",
      cfg.device, cfg.modes.size(), cfg.prompt_tokens, cfg.decode_tokens, cfg.link_gbps,
      memcpy_gbps, pinned_gbps);

  auto report = serve::bench::run_serve_bench(geo, params, bc);
  if (!report.ok()) return fail(report.status());
  Json j = serve::bench::report_json(*report);
  j["model"] = what;
  j["geometry"] = {{"name", cfg.model_dir.empty() ? cfg.geometry : cfg.model_dir},
                   {"layers", geo.layers},
                   {"hidden", geo.hidden},
                   {"experts", geo.experts},
                   {"top_k", geo.top_k},
                   {"expert_width", geo.expert_width},
                   {"vocab", geo.vocab},
                   {"dtype", cfg.dense_dtype},
                   {"expert_dtype", cfg.expert_dtype},
                   {"dense_dtype", cfg.dense_dtype},
                   {"params", pb.total},
                   {"expert_params", pb.experts},
                   {"model_bytes", model_bytes}};
  j["sizing"]["basis"] = budget_basis;
  j["sizing"]["budget_bytes"] = report->config.budget_bytes;
  j["host"] = {{"estimate_bytes", host_estimate ? Json(host_estimate) : Json(nullptr)},
               {"peak_rss_bytes", host_peak_rss_bytes()},
               {"experts_packed_at_build", bc.host_store != nullptr},
               {"weights_build_s", build_s},
               {"basis",
                "estimate: bench_host_bytes (weights + expert store); peak_rss: getrusage "
                "ru_maxrss at the end of the run"}};
  j["trace"] = trace_what;
  j["seed"] = cfg.seed;
  j["link"]["memcpy_gbps"] = memcpy_gbps;
  j["link"]["pinned_h2d_gbps"] = cuda ? Json(pinned_gbps) : Json(nullptr);
  j["link"]["paced_h2d_gbps"] = cuda && cfg.link_gbps > 0 ? Json(paced_gbps) : Json(nullptr);
  j["link"]["roofline_basis"] =
      cuda                ? (cfg.link_gbps > 0
                                 ? "--link-gbps: the copy stream paced to it by timed waits on the GPU "
                                   "(paced_h2d_gbps: the same 256 MiB probe through the paced engine; "
                                   "pinned_h2d_gbps: unpaced)"
                                 : "pinned host->GPU 0 copy rate (256 MiB, best of 5) measured in this "
                                   "process; copies not paced")
      : cfg.link_gbps > 0 ? "--link-gbps (copies paced to it)"
                          : "measured memcpy rate (unpaced)";
  j["machine"] =
      cuda ? fmt::format(
                 "CUDA engine on GPU 0 ({} routed experts in the pinned host store, slots "
                 "and copies; {} dense weights; f32 K/V and activations)",
                 cfg.expert_dtype, cfg.dense_dtype)
           : "CPU engine; device tier emulated in host memory (memcpy H2D), not a GPU measurement";
  if (cfg.json_out != "-") {
    print_table(j, what + "; trace " + trace_what + "; sizing: " + budget_basis);
  }
  if (!cfg.json_out.empty()) {
    if (cfg.json_out == "-") {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::ofstream f(cfg.json_out);
      f << j.dump(2) << "\n";
      if (!f) return fail(io_error("bench serve: cannot write {}", cfg.json_out));
    }
  }
  return 0;
}

void register_bench_serve(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<BenchServeConfig>();
  auto* cmd = bench_cmd(app)->add_subcommand(
      "serve", "prefill/decode throughput of the expert modes (docs/serve.md)");
  auto* model = cmd->add_option("--model", cfg->model_dir, "Hugging Face MoE model folder")
                    ->check(CLI::ExistingDirectory);
  auto* geometry =
      cmd->add_option("--geometry", cfg->geometry,
                      "built-in random-weight geometry: qwen3-30b-a3b, qwen3-30b-a3b-2l, "
                      "qwen3-30b-a3b-mini (default), serve-builtin, tiny");
  model->excludes(geometry);
  cmd->add_option("--modes", cfg->modes, "modes to run, in order (the first is the reference)")
      ->delimiter(',')
      ->check(CLI::IsMember({"resident", "static", "cpu-experts", "paged"}));
  auto* budget = cmd->add_option("--budget-gib", cfg->budget_gib,
                                 "total device budget: dense weights + KV + expert slots")
                     ->check(CLI::Range(1e-6, 1e6));
  auto* slots = cmd->add_option("--expert-slots", cfg->expert_slots, "expert slots per MoE layer")
                    ->check(CLI::Range(1, 1 << 20));
  budget->excludes(slots);
  cmd->add_option("--prompt-tokens", cfg->prompt_tokens, "prefill length P")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--decode-tokens", cfg->decode_tokens, "decode steps D")
      ->check(CLI::Range(1, 1 << 20));
  auto* trace = cmd->add_option("--trace", cfg->trace_file, "routing trace file to replay")
                    ->check(CLI::ExistingFile);
  auto* syn =
      cmd->add_option("--synthetic", cfg->synthetic,
                      "synthetic trace profile (default calibrated); none: the model's own router")
          ->check(CLI::IsMember({"calibrated", "spread", "none"}));
  trace->excludes(syn);
  cmd->add_option("--link-gbps", cfg->link_gbps,
                  "pace host->device expert copies to G GB/s (PCIe Gen4: 24): the emulated "
                  "tier's memcpy, or with --device cuda the copy stream (timed waits on the GPU)")
      ->check(CLI::Range(1e-3, 1e4));
  cmd->add_flag("--no-cuda-graphs", cfg->no_cuda_graphs,
                "--device cuda: launch decode steps op by op instead of replaying CUDA graphs "
                "(A/B; same bits)");
  cmd->add_flag("--no-device-resolve", cfg->no_device_resolve,
                "paged: resolve expert slots with the host pager (one routed-id round trip per "
                "MoE layer) instead of on the device in decode steps (A/B; same bits; the CPU "
                "engine: its CPU twin)");
  add_miss_placement_flags(cmd, cfg->miss, /*with_link=*/false,  // the link: --link-gbps
                           /*with_dtype=*/false);                // its own --expert-dtype
  add_cpu_expert_kernel_flag(cmd, cfg->cpu_expert_kernel);
  cmd->add_option("--policy", cfg->policy, "pager eviction policy: lru, lfu, lfru")
      ->check(CLI::IsMember({"lru", "lfu", "lfru"}));
  cmd->add_option("--seed", cfg->seed, "seed of the weights, prompt and synthetic trace");
  cmd->add_option("--json", cfg->json_out, "write the JSON report here (-: stdout, no table)");
  add_serve_device_flag(cmd, cfg->device);
  cmd->add_option("--expert-dtype", cfg->expert_dtype,
                  "routed experts stored and copied in f32 (default) or bf16 (--device cuda only; "
                  "f32 accumulation)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--dense-dtype", cfg->dense_dtype,
                  "dense weights (attention, router, lm_head, embedding) stored in f32 (default) "
                  "or bf16: half their device bytes, f32 arithmetic on the widened weights")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--kv-dtype", cfg->kv_dtype,
                  "KV cache stored in f32 (default) or bf16: half the request's pool, the rest "
                  "of the budget goes to expert slots; rows rounded when written")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([cfg, &run] { run = [cfg] { return run_bench_serve(*cfg); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_bench_serve);
}  // namespace ferry::app
