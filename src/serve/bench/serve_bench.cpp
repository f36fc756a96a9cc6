// SPDX-License-Identifier: Apache-2.0
#include "serve/bench/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "mem/budget.h"
#include "mem/buffer.h"
#include "mem/link_pacer.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "serve/engine.h"

namespace ferry::serve::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Snapshot {
  std::uint64_t h2d = 0, hits = 0, misses = 0, batches = 0, static_bytes = 0, host_misses = 0;
  std::uint64_t paged_bytes = 0, host_syncs = 0, steps = 0;
  double wait_s = 0;
  std::int64_t prefill = 0, decode = 0;
};

Snapshot snap(Engine& eng) {
  Snapshot s;
  // The CUDA engine copies through its own transfer engine; the CPU engine's expert copies go
  // through the host one.
  s.h2d = eng.transfer_engine() ? eng.transfer_engine()->counters().h2d_bytes.load()
                                : mem::host_transfer_engine().counters().h2d_bytes.load();
  s.host_syncs = eng.host_syncs();
  s.steps = eng.stats().steps;
  s.wait_s = mem::host_link_stats().wait_s;
  if (const ExpertPager* p = eng.experts().pager()) {
    s.hits = p->counters().hits;
    s.misses = p->counters().misses;
    s.batches = p->counters().copy_batches;
    s.paged_bytes = p->counters().bytes_copied;
  }
  s.static_bytes = eng.experts().counters().static_bytes_copied;
  s.host_misses = eng.experts().counters().cpu_misses + eng.experts().counters().bypassed;
  s.prefill = std::int64_t(eng.stats().prefill_tokens);
  s.decode = std::int64_t(eng.stats().decode_tokens);
  return s;
}

PhaseResult phase(const Snapshot& a, const Snapshot& b, double seconds, bool decode,
                  std::size_t layer_bytes, bool cuda) {
  PhaseResult p;
  p.tokens = decode ? b.decode - a.decode : b.prefill - a.prefill;
  p.seconds = seconds;
  p.h2d_bytes = b.h2d - a.h2d;
  p.hits = b.hits - a.hits;
  p.host_misses = b.host_misses - a.host_misses;
  p.misses = b.misses - a.misses + p.host_misses;
  // CUDA: copy batches and static's bulk copies are ordered by events, not host syncs.
  p.copy_syncs = cuda ? 0
                      : (b.batches - a.batches) +
                            (layer_bytes ? (b.static_bytes - a.static_bytes) / layer_bytes : 0);
  p.expert_h2d_bytes = (b.paged_bytes - a.paged_bytes) + (b.static_bytes - a.static_bytes);
  p.host_syncs = b.host_syncs - a.host_syncs;
  p.steps = b.steps - a.steps;
  p.paced_wait_s = b.wait_s - a.wait_s;
  return p;
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Runs one mode; a mode the budget cannot hold comes back with `skipped` set.
Result<ModeResult> run_mode(const model::DecoderGeometry& geo, const model::ModelParams& params,
                            const ServeBenchConfig& cfg, const ServeBenchReport& plan,
                            ExpertMode mode) {
  ModeResult r;
  r.mode = mode;
  EngineConfig ec;
  ec.pager.mode = mode;
  ec.pager.policy = cfg.policy;
  ec.pager.expert_dtype = cfg.expert_dtype;
  ec.dense_dtype = cfg.dense_dtype;
  ec.kv.block_tokens = cfg.kv_block_tokens;
  ec.kv.dtype = cfg.kv_dtype;
  ec.kv.budget_bytes = plan.kv_bytes;
  ec.max_batch_tokens = static_cast<int>(cfg.prompt.size());
  ec.max_running = 1;
  ec.device_budget_bytes = mode == ExpertMode::kResident ? 0 : plan.device_budget_bytes;
  ec.pager.host_store = cfg.host_store;
  ec.pager.cpu_expert_kernel = cfg.cpu_expert_kernel;
  ec.cuda_graphs = cfg.cuda_graphs;
  if (plan.cuda) ec.link_pace_gbps = cfg.link_gbps;  // the CPU engine: mem::set_host_link_rate
  if (mode == ExpertMode::kPaged) {
    ec.pager.slots_per_layer = plan.slots_per_layer;
    ec.pager.miss_cost_model = cfg.miss_cost_model;
    ec.pager.cpu_gflops = cfg.cpu_gflops;
    ec.pager.measure_cpu_gflops = cfg.measure_cpu_gflops;
    ec.pager.bypass_window = cfg.bypass_window;
    ec.pager.overlap_misses = cfg.overlap_misses;
    ec.pager.device_resolve = cfg.device_resolve;
    ec.pager.link_gbps = cfg.link_gbps > 0 ? cfg.link_gbps : cfg.roofline_gbps;
  }
  const std::size_t layer_bytes = std::size_t(geo.experts) * plan.expert_bytes;
  // Beside the staging: the KV pool (CPU), or every fixed device byte (CUDA).
  const std::size_t beside = plan.cuda ? plan.device_fixed_bytes : plan.kv_bytes;
  if (mode == ExpertMode::kStatic && beside + layer_bytes > plan.device_budget_bytes) {
    r.skipped = fmt::format(
        "static stages one layer's {} experts ({}) beside {} ({}): over the device budget {}",
        geo.experts, mem::format_bytes(layer_bytes),
        plan.cuda ? "dense weights, KV, tables and activations" : "the KV pool",
        mem::format_bytes(beside), mem::format_bytes(plan.device_budget_bytes));
    return r;
  }
  kernels::Backend& backend = cfg.backend ? *cfg.backend : kernels::cpu_backend();
  Result<std::unique_ptr<Engine>> created = Engine::create(geo, params, ec, backend);
  if (!created.ok() && created.status().code() == StatusCode::kResourceExhausted) {
    // Out of memory (device or pinned host) while building the mode's engine: report, go on.
    r.skipped =
        fmt::format("{} engine does not fit{}: {}", to_string(mode),
                    mode == ExpertMode::kResident ? " (no budget: every expert on the device)" : "",
                    created.status().message());
    return r;
  }
  if (!created.ok()) return created.status();
  std::unique_ptr<Engine> eng = std::move(*created);
  std::unique_ptr<TraceReplayer> replayer;
  if (cfg.trace) {
    replayer = std::make_unique<TraceReplayer>(*cfg.trace);
    eng->set_routing_hook(replayer.get());
  }
  std::uint64_t hash = 1469598103934665603ull;
  eng->set_logits_observer([&hash](RequestId, int, std::span<const float> row) {
    hash = fnv1a(hash, row.data(), row.size_bytes());
  });
  GenerationRequest req;
  req.prompt = cfg.prompt;
  req.max_new_tokens = cfg.decode_tokens + 1;  // the first comes from the prefill step
  FERRY_ASSIGN_OR_RETURN(const RequestId id, eng->submit(std::move(req)));

  const Snapshot s0 = snap(*eng);
  const auto t0 = Clock::now();
  bool first = false;
  while (!first && !eng->idle()) {
    FERRY_ASSIGN_OR_RETURN(std::vector<TokenEvent> ev, eng->step());
    first = !ev.empty();
  }
  const auto t1 = Clock::now();
  const Snapshot s1 = snap(*eng);
  FERRY_TRY(eng->run_until_idle());
  const auto t2 = Clock::now();
  const Snapshot s2 = snap(*eng);
  const std::size_t static_layer = mode == ExpertMode::kStatic ? layer_bytes : 0;
  r.prefill =
      phase(s0, s1, std::chrono::duration<double>(t1 - t0).count(), false, static_layer, plan.cuda);
  r.decode =
      phase(s1, s2, std::chrono::duration<double>(t2 - t1).count(), true, static_layer, plan.cuda);
  FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng->take_output(id));
  r.tokens = std::move(out.tokens);
  r.logits_hash = hash;
  r.ran = true;
  r.device_budget_bytes = ec.device_budget_bytes;  // 0: unlimited (resident)
  r.device_peak_bytes = eng->device_budget().bytes_peak();
  r.expert_device_bytes = eng->experts().device_bytes();
  if (const ExpertPager* p = eng->experts().pager()) {
    for (int l = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l]) r.slots_per_layer = p->capacity(l);
    }
  }
  r.under_budget = mode != ExpertMode::kResident;
  r.graphs = eng->graph_stats();
  r.device_resolved = eng->experts().counters().device_resolved;
  r.cpu_expert_kernel = eng->experts().cpu_expert_kernel();
  if (mode == ExpertMode::kPaged) {
    r.placement_cpu_gflops = eng->experts().placement_cpu_gflops();
    r.measured_cpu_rate = eng->experts().measured_cpu_rate();
  }
  if (eng->transfer_engine() != nullptr) r.pace = eng->transfer_engine()->pace_stats();
  return r;
}

Json phase_json(const PhaseResult& p, ExpertMode mode, double roofline_gbps, bool cuda) {
  const double per_tok = p.tokens ? double(p.h2d_bytes) / double(p.tokens) : 0.0;
  Json j = {{"tokens", p.tokens},
            {"seconds", p.seconds},
            {"tokens_per_s", p.tokens_per_s()},
            {"h2d_bytes", p.h2d_bytes},
            {"h2d_bytes_per_token", per_tok},
            {"copy_syncs", p.copy_syncs},
            {"copy_syncs_per_token", p.tokens ? double(p.copy_syncs) / double(p.tokens) : 0.0},
            {"paced_wait_s", p.paced_wait_s},
            {"expert_h2d_bytes", p.expert_h2d_bytes},
            {"expert_h2d_bytes_per_token",
             p.tokens ? double(p.expert_h2d_bytes) / double(p.tokens) : 0.0},
            {"steps", p.steps}};
  // Counted on the CUDA engine only (the CPU engine has no device to wait on).
  j["host_syncs"] = cuda ? Json(p.host_syncs) : Json(nullptr);
  j["host_syncs_per_token"] =
      cuda && p.tokens ? Json(double(p.host_syncs) / double(p.tokens)) : Json(nullptr);
  // Hit rate of expert uses on the device: paged measured; resident all hits; static none (every
  // expert is streamed every forward); cpu-experts has no device copies of experts (null).
  switch (mode) {
    case ExpertMode::kPaged:
      j["hit_rate"] = p.hits + p.misses ? double(p.hits) / double(p.hits + p.misses) : 0.0;
      j["host_computed_misses"] = p.host_misses;
      j["host_computed_misses_per_token"] =
          p.tokens ? double(p.host_misses) / double(p.tokens) : 0.0;
      break;
    case ExpertMode::kResident:
      j["hit_rate"] = 1.0;
      break;
    case ExpertMode::kStatic:
      j["hit_rate"] = 0.0;
      break;
    case ExpertMode::kCpuExperts:
      j["hit_rate"] = nullptr;
      break;
  }
  const double link_bps = roofline_gbps * 1e9;
  if (p.h2d_bytes > 0 && p.seconds > 0) {
    j["link_busy_s"] = double(p.h2d_bytes) / link_bps;
    j["roofline_pct"] = 100.0 * double(p.h2d_bytes) / link_bps / p.seconds;
    j["roofline_tokens_per_s"] = link_bps / per_tok;
  } else {
    j["link_busy_s"] = 0.0;
    j["roofline_pct"] = nullptr;
    j["roofline_tokens_per_s"] = nullptr;
  }
  return j;
}

const ModeResult* find_mode(const ServeBenchReport& r, ExpertMode m) {
  for (const ModeResult& x : r.modes) {
    if (x.mode == m && x.ran) return &x;
  }
  return nullptr;
}

Json ratio(const ModeResult* a, const ModeResult* b, bool decode) {
  if (!a || !b) return nullptr;
  const double ta = (decode ? a->decode : a->prefill).tokens_per_s();
  const double tb = (decode ? b->decode : b->prefill).tokens_per_s();
  if (tb <= 0) return nullptr;
  return ta / tb;
}

}  // namespace

double measure_host_copy_gbps() {
  const std::size_t n = 64u << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    a[std::size_t(rep) * 4096] = b[std::size_t(rep) * 8192];  // keep the copies observable
  }
  return double(n) / best / 1e9;
}

Result<double> measure_pinned_h2d_gbps(double pace_gbps, std::size_t chunk_bytes) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<mem::TransferEngine> cuda_te,
                         mem::cuda_transfer_engine(0));
  FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(Device::kCuda, 0));
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<LinkEngine> te,
      LinkEngine::create(std::move(cuda_te),
                         {.gbps = pace_gbps, .chunk_bytes = chunk_bytes, .stream = &ss.h2d()}));
  const std::size_t n = 256u << 20;
  mem::MemoryBudget host_budget(mem::MemTier::kPinnedHost), dev_budget(mem::MemTier::kDevice);
  FERRY_ASSIGN_OR_RETURN(mem::Buffer h, mem::Buffer::allocate(mem::MemTier::kPinnedHost, n,
                                                              host_budget, {.what = "h2d probe"}));
  FERRY_ASSIGN_OR_RETURN(mem::Buffer d, mem::Buffer::allocate(mem::MemTier::kDevice, n, dev_budget,
                                                              {.what = "h2d probe"}));
  std::memset(h.data(), 1, n);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {  // the first warms the mapping up
    const auto t0 = Clock::now();
    FERRY_TRY(te->h2d(d.data(), h.data(), n, ss.h2d()));
    FERRY_TRY(ss.h2d().synchronize());
    if (rep > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(n) / best / 1e9;
}

Result<ServeBenchReport> run_serve_bench(const model::DecoderGeometry& geo,
                                         const model::ModelParams& params,
                                         const ServeBenchConfig& cfg) {
  if (geo.experts == 0) return invalid_argument("bench serve: the model is dense (no experts)");
  if (cfg.modes.empty()) return invalid_argument("bench serve: no modes to run");
  if (cfg.prompt.empty()) return invalid_argument("bench serve: empty prompt");
  if (cfg.decode_tokens < 1) return invalid_argument("bench serve: decode tokens must be >= 1");
  if (cfg.roofline_gbps <= 0) return invalid_argument("bench serve: roofline rate must be > 0");
  ServeBenchReport r;
  r.config = cfg;
  r.cuda = cfg.backend != nullptr && cfg.backend->device() == Device::kCuda;
  if (!r.cuda && cfg.expert_dtype != DType::kF32) {
    return unimplemented("bench serve: {} experts need --device cuda (the CPU engine is f32)",
                         to_string(cfg.expert_dtype));
  }
  r.expert_bytes =
      3 * std::size_t(geo.hidden) * std::size_t(geo.expert_width) * dtype_size(cfg.expert_dtype);
  for (bool m : geo.layer_is_moe) r.moe_layers += m;
  // The KV pool holds exactly the request: prompt + decode + 1 positions, in whole blocks.
  const std::int64_t positions = std::int64_t(cfg.prompt.size()) + cfg.decode_tokens + 1;
  const std::int64_t blocks = (positions + cfg.kv_block_tokens - 1) / cfg.kv_block_tokens;
  r.kv_bytes = std::size_t(blocks) * kv_block_bytes(geo, cfg.kv_block_tokens, cfg.kv_dtype);
  const std::size_t per_slot_row = r.expert_bytes * std::size_t(r.moe_layers);
  // Bytes of the device budget that are not expert slots: the CPU engine's plan charges dense
  // weights (read in place) and KV; the CUDA engine holds dense weights, KV, pointer tables and
  // activations in GPU memory, measured on a probe engine (its peak minus its top-k slots).
  std::size_t fixed = r.kv_bytes + (cfg.expert_slots > 0 ? 0 : cfg.dense_bytes);
  if (r.cuda) {
    EngineConfig pc;
    pc.pager.mode = ExpertMode::kPaged;
    pc.pager.expert_dtype = cfg.expert_dtype;
    pc.dense_dtype = cfg.dense_dtype;
    pc.pager.slots_per_layer = geo.top_k;
    pc.pager.host_store = cfg.host_store;
    // Paged's own fixed bytes: with device slot resolution, its state (under LRU only).
    pc.pager.policy = cfg.policy;
    pc.pager.device_resolve = cfg.device_resolve;
    pc.kv.block_tokens = cfg.kv_block_tokens;
    pc.kv.dtype = cfg.kv_dtype;
    pc.kv.budget_bytes = r.kv_bytes;
    pc.max_batch_tokens = static_cast<int>(cfg.prompt.size());
    pc.max_running = 1;
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> probe,
                           Engine::create(geo, params, pc, *cfg.backend));
    r.device_fixed_bytes = probe->device_budget().bytes_peak() - probe->experts().device_bytes();
    r.dense_device_bytes = probe->device_weight_bytes();
    fixed = r.device_fixed_bytes;
  }
  if (cfg.expert_slots > 0) {
    r.slots_per_layer = std::min(cfg.expert_slots, geo.experts);
    r.expert_budget_bytes = std::size_t(r.slots_per_layer) * per_slot_row;
  } else {
    if (cfg.expert_fraction > 0) {
      r.config.budget_bytes =
          fixed + std::size_t(cfg.expert_fraction * double(cfg.all_expert_bytes));
    }
    const std::size_t budget = r.config.budget_bytes;
    if (budget == 0) return invalid_argument("bench serve: no budget and no slot count");
    if (budget <= fixed) {
      if (r.cuda) {
        return resource_exhausted(
            "bench serve: budget {} does not hold the dense weights, the KV pool, the pointer "
            "tables and the activations ({} on the CUDA engine)",
            mem::format_bytes(budget), mem::format_bytes(fixed));
      }
      return resource_exhausted(
          "bench serve: budget {} does not hold the dense weights ({}) and the KV pool ({})",
          mem::format_bytes(budget), mem::format_bytes(cfg.dense_bytes),
          mem::format_bytes(r.kv_bytes));
    }
    r.expert_budget_bytes = budget - fixed;
    r.slots_per_layer =
        static_cast<int>(std::min<std::size_t>(r.expert_budget_bytes / per_slot_row, geo.experts));
    r.expert_budget_bytes = std::size_t(r.slots_per_layer) * per_slot_row;
  }
  if (r.slots_per_layer < geo.top_k) {
    return resource_exhausted(
        "bench serve: {} expert slots per layer ({} per expert, {} MoE layers), fewer than "
        "top-k = {}",
        r.slots_per_layer, mem::format_bytes(r.expert_bytes), r.moe_layers, geo.top_k);
  }
  r.device_budget_bytes = (r.cuda ? fixed : r.kv_bytes) + r.expert_budget_bytes;

  const double saved_rate = mem::host_link_rate();
  // The CPU engine's emulated link; the CUDA engine paces its own copy stream (run_mode).
  mem::set_host_link_rate(cfg.link_gbps > 0 && !r.cuda ? cfg.link_gbps * 1e9 : 0.0);
  for (ExpertMode m : cfg.modes) {
    Result<ModeResult> mr = run_mode(geo, params, cfg, r, m);
    if (!mr.ok()) {
      mem::set_host_link_rate(saved_rate);
      return mr.status();
    }
    r.modes.push_back(std::move(*mr));
  }
  mem::set_host_link_rate(saved_rate);
  return r;
}

Json report_json(const ServeBenchReport& r) {
  const ServeBenchConfig& c = r.config;
  const ModeResult* ref = nullptr;
  for (const ModeResult& m : r.modes) {
    if (m.ran) {
      ref = &m;
      break;
    }
  }
  Json modes = Json::array();
  for (const ModeResult& m : r.modes) {
    Json j = {{"mode", std::string(to_string(m.mode))}, {"ran", m.ran}};
    if (!m.ran) {
      j["skipped"] = m.skipped;
      modes.push_back(j);
      continue;
    }
    j["reference"] = &m == ref;
    j["under_budget"] = m.under_budget;
    j["prefill"] = phase_json(m.prefill, m.mode, c.roofline_gbps, r.cuda);
    j["decode"] = phase_json(m.decode, m.mode, c.roofline_gbps, r.cuda);
    j["tokens"] = m.tokens;
    j["same_tokens_as_reference"] = ref && m.tokens == ref->tokens;
    j["same_logits_bits_as_reference"] = ref && m.logits_hash == ref->logits_hash;
    j["device_budget_bytes"] = m.device_budget_bytes;  // 0: unlimited (resident)
    j["device_peak_bytes"] = m.device_peak_bytes;
    j["expert_device_bytes"] = m.expert_device_bytes;
    j["slots_per_layer"] = m.mode == ExpertMode::kPaged ? Json(m.slots_per_layer) : Json(nullptr);
    const bool placement =
        m.mode == ExpertMode::kPaged && (c.miss_cost_model || c.bypass_window > 0);
    // cpu-experts' kernel; paged's host-computed misses run the same one on CUDA (expert_ffn_row
    // on the CPU engine)
    j["cpu_expert_kernel"] = m.mode == ExpertMode::kCpuExperts || (placement && r.cuda)
                                 ? Json(std::string(to_string(m.cpu_expert_kernel)))
                                 : Json(nullptr);
    if (m.mode == ExpertMode::kPaged) {
      Json measured = nullptr;
      if (m.measured_cpu_rate) {
        const CpuExpertRate& cr = *m.measured_cpu_rate;
        measured = {{"gflops", cr.gflops},
                    {"expert_gbps", cr.expert_gbps},
                    {"seconds_per_expert", cr.seconds_per_expert},
                    {"experts", cr.experts},
                    {"calls_per_pass", cr.calls},
                    {"passes", cr.passes},
                    {"kernel", std::string(to_string(cr.kernel))}};
      }
      j["miss_placement"] = {{"on", placement},
                             {"cpu_gflops_used", m.placement_cpu_gflops},
                             {"cpu_rate_measured", measured}};
    }
    if (r.cuda) {
      j["cuda_graphs"] = {{"enabled", c.cuda_graphs},
                          {"eligible_steps", m.graphs.eligible_steps},
                          {"warmup_steps", m.graphs.warmup_steps},
                          {"captures", m.graphs.captures},
                          {"replays", m.graphs.replays},
                          {"disabled_reason", m.graphs.disabled_reason}};
      j["device_resolve"] = {{"enabled", c.device_resolve && m.mode == ExpertMode::kPaged},
                             {"layer_calls", m.device_resolved}};
      j["paced_copies"] = {
          {"copies", m.pace.copies}, {"chunks", m.pace.chunks}, {"bytes", m.pace.bytes}};
    }
    modes.push_back(j);
  }
  const ModeResult* paged = find_mode(r, ExpertMode::kPaged);
  const ModeResult* stat = find_mode(r, ExpertMode::kStatic);
  const ModeResult* cpu = find_mode(r, ExpertMode::kCpuExperts);
  const ModeResult* res = find_mode(r, ExpertMode::kResident);
  return Json{
      {"prompt_tokens", c.prompt.size()},
      {"decode_tokens", c.decode_tokens},
      {"policy", std::string(to_string(c.policy))},
      {"miss_placement",
       {{"cost_model", c.miss_cost_model},
        {"cpu_gflops", c.measure_cpu_gflops ? Json("auto") : Json(c.cpu_gflops)},
        {"cost_model_rule",
         "a miss of r rows is computed from host memory when r * 6*C*F / cpu_gflops < expert "
         "bytes / link rate; cpu_gflops auto = 6*C*F / the measured time of one row of one "
         "expert (a decode miss: memory-bound, so this is expert bytes / host read rate), which "
         "over-prices r > 1 rows for the grouped kernel (weights read once)"},
        {"bypass_window", c.bypass_window},
        {"overlap_misses", c.overlap_misses},
        {"device_resolve", c.device_resolve}}},
      {"device", r.cuda ? "cuda" : "cpu"},
      {"dtype",
       fmt::format("{} routed experts, {} dense weights (bf16: stored bf16, widened exactly, f32 "
                   "accumulation); {} K/V (bf16: rows rounded when written, f32 attention); f32 "
                   "activations{}",
                   to_string(c.expert_dtype), to_string(c.dense_dtype), to_string(c.kv_dtype),
                   c.expert_dtype == DType::kBF16 && c.dense_dtype == DType::kBF16
                       ? ""
                       : " (the issue's target is bf16 weights: f32 ones take 2x its bytes)")},
      {"expert_dtype", std::string(to_string(c.expert_dtype))},
      {"dense_dtype", std::string(to_string(c.dense_dtype))},
      {"kv_dtype", std::string(to_string(c.kv_dtype))},
      {"link",
       {{"paced", c.link_gbps > 0},
        {"link_gbps", c.link_gbps},
        {"roofline_gbps", c.roofline_gbps}}},
      {"cuda_graphs", r.cuda ? Json(c.cuda_graphs) : Json(nullptr)},
      {"sizing",
       {{"from", c.expert_slots > 0 ? "expert_slots" : "budget"},
        {"budget_bytes", c.budget_bytes},
        {"dense_bytes_charged", c.expert_slots > 0 ? 0 : c.dense_bytes},
        {"dense_dtype", std::string(to_string(c.dense_dtype))},
        {"dense_device_bytes", r.cuda ? Json(r.dense_device_bytes) : Json(nullptr)},
        {"kv_bytes", r.kv_bytes},
        {"device_fixed_bytes", r.cuda ? Json(r.device_fixed_bytes) : Json(nullptr)},
        {"expert_bytes", r.expert_bytes},
        {"moe_layers", r.moe_layers},
        {"slots_per_layer", r.slots_per_layer},
        {"expert_budget_bytes", r.expert_budget_bytes},
        {"device_budget_bytes", r.device_budget_bytes}}},
      {"modes", modes},
      {"ratios",
       {{"paged_over_static_decode", ratio(paged, stat, true)},
        {"paged_over_static_prefill", ratio(paged, stat, false)},
        {"paged_over_cpu_experts_decode", ratio(paged, cpu, true)},
        {"paged_over_cpu_experts_prefill", ratio(paged, cpu, false)},
        {"paged_over_resident_decode", ratio(paged, res, true)}}},
      {"definitions",
       {{"h2d_bytes",
         r.cuda ? "every host->device byte of the CUDA engine's transfer engine (expert copies, "
                  "step inputs, pointer tables, the routing hook's ids, cpu-experts' rows)"
                : "host->device bytes of the host transfer engine (expert copies)"},
        {"expert_h2d_bytes", "expert bytes copied: pager misses + static bulk layer copies"},
        {"host_syncs",
         r.cuda ? "host waits on the GPU, counted: 1 per step (logits read-back) + 1 per MoE layer "
                  "and step for the routed ids (paged, cpu-experts); the trace replay's forced "
                  "routing goes up once per step (no host wait)"
                : "null: the CPU engine has no device to wait on"},
        {"device_fixed_bytes",
         "CUDA: dense weights + KV + pointer tables + activations, the budget's non-slot part, "
         "measured on a probe engine"},
        {"dense_device_bytes",
         "CUDA: the dense (non-expert) weights' bytes in GPU memory in dense_dtype (part of "
         "device_fixed_bytes), measured on the probe engine"},
        {"roofline_pct",
         "100 * (h2d bytes / roofline rate) / phase seconds = tokens/s over roofline tokens/s "
         "(roofline tokens/s = rate / h2d bytes per token); null when no bytes move. With "
         "host-computed misses (paged miss placement) the link carries fewer bytes (those "
         "experts are not copied; on CUDA only their result rows go up), so roofline_pct is the "
         "share of the phase the link is busy, not a distance to a copy-every-miss bound"},
        {"host_computed_misses",
         "paged miss placement: misses computed from host memory (cost model or bypass), no "
         "copy; counted in the hit rate's misses. On CUDA these rows are CPU arithmetic (not "
         "bit-identical to the GPU's; same_logits_bits_as_reference may be false)"},
        {"copy_syncs",
         r.cuda ? "0 on CUDA: pager miss batches and static bulk copies are ordered by events on "
                  "the device, not by host syncs (see host_syncs)"
                : "host syncs of expert copies: pager miss batches + static bulk layer copies; "
                  "other host syncs not counted"},
        {"hit_rate",
         "paged: pager hits / (hits + misses), misses computed from host memory included; "
         "resident 1; static 0; cpu-experts null"},
        {"resident", "run without the budget, as the reference"},
        {"cuda_graphs",
         "CUDA decode steps with no host wait inside (resident, static): per step shape, one "
         "eager warm-up step, then captured once and replayed (captures + replays = steps run "
         "as graphs); paged and cpu-experts wait on routed ids, so they run eagerly"},
        {"paced_copies",
         "CUDA with --link-gbps: host->device copies on the engine's copy stream (expert misses, "
         "static bulk copies) held to link_gbps by timed waits on that stream"}}},
  };
}

}  // namespace ferry::serve::bench
