// SPDX-License-Identifier: Apache-2.0
// `ferry serve [--model DIR] [--host H] [--port P] [--name NAME] [--mode M]
//   [--expert-slots N | --layer-slots N,N,.. | --expert-budget-mib M] [--policy lru|lfu|lfru]
//   [--miss-cost-model [--link-gbps G --cpu-gflops F|auto]] [--bypass-window N]
//   [--max-running N] [--max-batch-tokens N] [--kv-budget-mib M] [--kv-block-tokens N]
//   [--no-prefix-cache] [--kv-admission reserve|preempt]
//   [--device-budget-mib M] [--max-tokens-default N] [--http-threads N] [--api-key KEY]
//   [--duration-s S]
//   [--split fixed|auto [--wsa-max-context N] [--wsa-decide-steps N]
//                       [--live-price-by-caps on|off]]`
// `ferry serve --plan-only --trace FILE --budget-gib X [--model DIR] [--link-gbps G]
//   [--plan-bytes-per-param B] [--max-running N] [--wsa-max-context N]
//   [--configurator-price-by-caps on|off]` prints the MV-WSA split for that trace and budget
// (serve/wsa/trace_plan.h) and exits. Its configurator is the benches' (wsa::offline_split):
// --configurator-price-by-caps on (the default, as in serve_split_bench and
// serve_split_engine_bench) prices a recomputed prompt block at each split's own caps
// (allocate_priced_by_caps), off at one price (allocate). A routing trace has no prefix curve,
// so on and off print the same split today (docs/serve_wsa.md "ferry serve flags").
// --split auto: one device budget (--device-budget-mib) divided live between expert slots and KV
// blocks by MV-WSA (serve/wsa/live_split.h, docs/serve_wsa.md); implies --mode paged. It starts
// from the 50/50 split (wsa::configure_auto_split; no configurator: nothing is observed yet), or
// with --trace FILE (a routing trace of an earlier run, --record-trace) from the offline
// configurator's split of that trace for these pools (a warm start), and the live controller
// moves from there; --live-price-by-caps on (default off, as in the benches)
// makes the controller judge splits with the cap-dependent block price
// (ControllerConfig::price_by_caps; it needs the prefix cache's curve).
// OpenAI-style HTTP (serve/http/http_server.h, docs/serve.md "HTTP server") over the CPU serving
// engine. Without --model it serves the built-in random-weight Qwen3-MoE with `ferry train`'s
// byte-level tokenizer, as `ferry generate` does. Prints "listening port=<P>" on stdout once
// bound (useful with --port 0); stops on SIGINT/SIGTERM or after --duration-s.
// The model and the engine flags it shares with generate and perplexity: serve_engine_setup.h.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "apps/ferry/serve_engine_setup.h"
#include "core/dtype.h"
#include "core/file_util.h"
#include "core/log.h"
#include "model/model_binding.h"
#include "model/tokenizer/chat_renderer.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/engine.h"
#include "serve/http/http_server.h"
#include "serve/routing_trace.h"
#include "serve/wsa/live_split.h"
#include "serve/wsa/trace_plan.h"

namespace ferry::app {
namespace {

struct ServeCliConfig {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string name;
  EngineFlags engine;  // mode, pager, miss placement, KV pool, --device, step switches
  int max_running = 4;
  bool no_prefix_cache = false;
  std::string kv_admission;  // reserve | preempt; "": reserve, preempt under --split auto
  int default_max_tokens = 16;
  int http_threads = 0;                // 0: HttpServerConfig::http_threads' default
  std::string api_key;                 // "": no key (FERRY_API_KEY)
  std::string chat_template = "auto";  // auto | chatml | a Jinja template file
  double duration_s = 0;
  std::string split = "fixed";
  int wsa_max_context = 0;
  int wsa_decide_steps = 64;
  bool plan_only = false;
  std::string trace;
  double budget_gib = 0;
  double link_gbps = 24;
  int plan_bytes_per_param = 4;
  std::string configurator_price_by_caps = "on";  // --plan-only: offline_split's price_by_caps
  std::string live_price_by_caps = "off";         // --split auto: ControllerConfig::price_by_caps
  bool configurator_flag_given = false, live_flag_given = false;  // for the no-effect warnings
};

std::string slots_text(const std::vector<int>& slots) {
  std::string t;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (i) t += ',';  // not `"," + std::string`: GCC 12 -O3 reports a false -Wrestrict on it
    t += std::to_string(slots[i]);
  }
  return t;
}

int run_plan(const ServeCliConfig& c, const model::DecoderGeometry& geo) {
  if (c.trace.empty() || c.budget_gib <= 0) {
    return fail(invalid_argument("serve: --plan-only needs --trace FILE and --budget-gib X"));
  }
  auto trace = serve::RoutingTrace::load(c.trace);
  if (!trace.ok()) return fail(trace.status());
  serve::wsa::TracePlanSpec spec{
      .budget_bytes = static_cast<std::size_t>(c.budget_gib * double(1ull << 30)),
      .bytes_per_param = c.plan_bytes_per_param,
      .block_tokens = c.engine.kv_block_tokens,
      .concurrency = c.max_running,
      .max_context = c.wsa_max_context,
      .link_bytes_per_s = c.link_gbps * 1e9,
      .price_by_caps = c.configurator_price_by_caps == "on"};
  auto plan = serve::wsa::plan_from_trace(*trace, geo, spec);
  if (!plan.ok()) return fail(plan.status());
  const serve::wsa::SplitProblem& p = plan->problem;
  std::printf(
      "plan: budget %.3f GiB for expert slots + kv blocks; expert %s, kv block %s (%d tokens); "
      "kv floor %d blocks; link %.1f GB/s\n",
      c.budget_gib, mem::format_bytes(p.expert_bytes).c_str(),
      mem::format_bytes(p.kv_block_bytes).c_str(), c.engine.kv_block_tokens, p.kv_floor_blocks,
      c.link_gbps);
  const bool by_caps = spec.price_by_caps;
  std::printf("configurator: price by caps %s%s\n", by_caps ? "on" : "off",
              !by_caps                        ? " (one block price)"
              : serve::wsa::has_cap_prices(p) ? ""
                                              : " (no prefix curve in a routing trace: one "
                                                "block price, the same split as off)");
  auto row = [&](const serve::wsa::PlanRow& r) {
    std::printf("%-14s step %.5f ms (modelled)  kv_blocks=%d  bytes=%s  slots=%s\n", r.name.c_str(),
                r.step_s * 1e3, r.split.kv_blocks, mem::format_bytes(r.split.bytes(p)).c_str(),
                slots_text(r.split.slots).c_str());
  };
  row(plan->chosen);
  for (const auto& r : plan->fixed) row(r);
  std::printf("moe layers (engine index of each slot entry): %s\n",
              slots_text(plan->moe_layers).c_str());
  return 0;
}

// How a model folder's chat completions are rendered (--chat-template): auto, the folder's
// tokenizer_config.json template (ChatML natively, any other through the Jinja subset);
// chatml, ChatML whatever the folder says; anything else, a Jinja template file (vLLM's
// --chat-template FILE) with the folder's bos/eos tokens. A folder without a template, or with
// one the subset cannot render, gets chat refused with the reason (never a wrong prompt); a
// corrupt tokenizer_config.json or an unreadable template file fails the start.
struct ChatSetup {
  std::shared_ptr<const model::ChatRenderer> renderer;  // null with a refusal
  std::string refusal, source;
};
Result<ChatSetup> chat_setup(const std::string& model_dir, const std::string& mode) {
  ChatSetup out;
  const std::string config = model_dir + "/tokenizer_config.json";
  const std::string hint =
      "; send the formatted prompt to /v1/completions, or start the server with --chat-template "
      "chatml or --chat-template FILE (a Jinja template)";
  if (mode == "chatml") {
    out.renderer = std::make_shared<const model::ChatRenderer>(model::ChatRenderer::chatml());
    out.source = "ChatML (--chat-template chatml)";
    return out;
  }
  if (mode != "auto") {
    FERRY_ASSIGN_OR_RETURN(const std::string source, read_file(mode));
    model::SpecialTokens tokens;  // the folder's bos / eos, when it has a tokenizer_config.json
    if (std::filesystem::exists(config)) {
      FERRY_ASSIGN_OR_RETURN(tokens, model::read_special_tokens(config));
    }
    auto r = model::ChatRenderer::from_source(source, tokens.bos, tokens.eos);
    if (!r.ok()) return r.status();
    out.renderer = std::make_shared<const model::ChatRenderer>(std::move(*r));
    out.source = mode;
    return out;
  }
  auto r = model::ChatRenderer::from_tokenizer_config(config);
  if (r.ok()) {
    out.renderer = std::make_shared<const model::ChatRenderer>(std::move(*r));
    out.source = std::string(out.renderer->kind()) + " (" + config + ")";
    return out;
  }
  if (r.status().code() == StatusCode::kNotFound) {
    out.refusal =
        "this model's chat completions are refused: it has no chat template "
        "(tokenizer_config.json)" +
        hint;
  } else if (r.status().code() == StatusCode::kUnimplemented) {
    out.refusal = "this model's chat completions are refused: " + r.status().message() + hint;
  } else {
    return r.status();  // a corrupt tokenizer_config.json: say so at the start
  }
  return out;
}

int run_serve(const ServeCliConfig& c) {
  auto holder = load_serving_model(c.model_dir);
  if (!holder.ok()) return fail(holder.status());
  std::optional<model::Tokenizer>& tokenizer = holder->tokenizer;
  const model::DecoderGeometry& geo = holder->geometry();
  const model::ModelParams& params = holder->params();
  const model::ModelConfig& mcfg = holder->config();
  if (c.plan_only) {
    if (c.live_flag_given) {
      log::get("serve")->warn("--live-price-by-caps has no effect with --plan-only");
    }
    return run_plan(c, geo);
  }
  if (c.configurator_flag_given) {
    log::get("serve")->warn(
        "--configurator-price-by-caps has no effect without --plan-only (--split auto's "
        "warm start from --trace plans at one price; the live controller's price: "
        "--live-price-by-caps)");
  }

  auto engine_cfg = engine_config(c.engine, geo, "serve");
  if (!engine_cfg.ok()) return fail(engine_cfg.status());
  serve::EngineConfig& ec = *engine_cfg;
  ec.pager.link_gbps = c.link_gbps;  // one link: MV-WSA's and the miss cost model's
  ec.kv.prefix_cache = !c.no_prefix_cache;
  ec.kv_preempt = c.kv_admission == "preempt";  // the flag admits "reserve" and "preempt" only
  ec.max_running = c.max_running;
  ec.max_seq_len = static_cast<int>(mcfg.max_position_embeddings);
  const bool auto_split = c.split == "auto";
  if (!auto_split && c.split != "fixed") {
    return fail(invalid_argument("serve: --split is fixed or auto, got '{}'", c.split));
  }
  const int wsa_ctx = c.wsa_max_context > 0 ? c.wsa_max_context : ec.max_seq_len;
  const int floor_blocks =
      c.max_running * ((wsa_ctx + c.engine.kv_block_tokens - 1) / c.engine.kv_block_tokens);
  const bool live_by_caps = c.live_price_by_caps == "on";
  if (live_by_caps && !auto_split) {
    log::get("serve")->warn("--live-price-by-caps on has no effect without --split auto");
  } else if (live_by_caps && c.no_prefix_cache) {
    log::get("serve")->warn(
        "--live-price-by-caps on has no effect with --no-prefix-cache (no prefix curve to price)");
  }
  if (auto_split && c.kv_admission == "reserve") {
    return fail(invalid_argument(
        "serve: --split auto resizes the KV pool live and needs --kv-admission preempt (a "
        "shrink may take blocks a reservation promised)"));
  }
  if (auto_split) {
    if (c.engine.device_budget_mib <= 0) {
      return fail(invalid_argument(
          "serve: --split auto needs --device-budget-mib (the budget it divides)"));
    }
    if (c.trace.empty()) {
      if (Status st =
              serve::wsa::configure_auto_split(geo, ec.device_budget_bytes, floor_blocks, ec);
          !st.ok()) {
        return fail(st);
      }
    } else {
      // A warm start: the offline configurator's split of the recorded trace, planned for this
      // engine's pools (its budget, expert and K/V element sizes, blocks, floor).
      auto trace = serve::RoutingTrace::load(c.trace);
      if (!trace.ok()) return fail(trace.status());
      auto plan = serve::wsa::plan_from_trace(
          *trace, geo,
          {.budget_bytes = ec.device_budget_bytes,
           .bytes_per_param = static_cast<int>(dtype_size(ec.pager.expert_dtype)),
           .kv_bytes_per_elt = static_cast<int>(dtype_size(ec.kv.dtype)),
           .block_tokens = c.engine.kv_block_tokens,
           .concurrency = c.max_running,
           .max_context = wsa_ctx,
           .link_bytes_per_s = c.link_gbps * 1e9});
      if (!plan.ok()) return fail(plan.status());
      if (Status st = serve::wsa::configure_auto_split(geo, ec.device_budget_bytes, floor_blocks,
                                                       plan->chosen.split, ec);
          !st.ok()) {
        return fail(st);
      }
      log::get("serve")->info("--split auto starts from the plan of {}: {}", c.trace,
                              serve::wsa::to_string(plan->chosen.split));
    }
  } else if (!c.trace.empty()) {
    log::get("serve")->warn("--trace has no effect without --plan-only or --split auto");
  }
  auto backend = serve_backend(c.engine.device);
  if (!backend.ok()) return fail(backend.status());
  auto engine = serve::Engine::create(geo, params, ec, **backend);
  if (!engine.ok()) return fail(engine.status());
  if (const auto& rate = (*engine)->experts().measured_cpu_rate()) {
    log::get("serve")->info(
        "miss cost model: CPU rate measured {:.2f} GFLOP/s ({:.2f} GB/s of expert bytes, {} "
        "kernel, one row of each of {} experts)",
        rate->gflops, rate->expert_gbps, serve::to_string(rate->kernel), rate->experts);
  }
  std::unique_ptr<serve::wsa::LiveSplit> live;
  if (auto_split) {
    auto ls =
        serve::wsa::LiveSplit::attach(**engine, {.budget_bytes = ec.device_budget_bytes,
                                                 .concurrency = c.max_running,
                                                 .max_context_tokens = wsa_ctx,
                                                 .decide_every_steps = c.wsa_decide_steps,
                                                 .link_bytes_per_s = c.link_gbps * 1e9,
                                                 .decode_on_device = c.engine.device == "cuda",
                                                 .controller = {.price_by_caps = live_by_caps}});
    if (!ls.ok()) return fail(ls.status());
    live = std::move(*ls);
  }

  serve::http::HttpServerConfig hc;
  hc.model_name = !c.name.empty()       ? c.name
                  : c.model_dir.empty() ? std::string("builtin-qwen3-moe")
                                        : std::filesystem::path(c.model_dir).filename().string();
  hc.default_max_tokens = c.default_max_tokens;
  hc.http_threads = c.http_threads;
  hc.api_key = c.api_key;
  if (!c.model_dir.empty()) {
    auto chat = chat_setup(c.model_dir, c.chat_template);
    if (!chat.ok()) return fail(chat.status());
    hc.chat = chat->renderer;
    if (tokenizer) hc.extra_stop_ids = model::model_end_token_ids(c.model_dir, *tokenizer);
    hc.chat_refusal = chat->refusal;
    if (hc.chat) log::get("serve")->info("chat template: {}", chat->source);
  } else if (c.chat_template != "auto" && c.chat_template != "chatml") {
    return fail(
        invalid_argument("serve: --chat-template FILE needs --model (the built-in model "
                         "is ChatML)"));
  }
  if (!hc.chat_refusal.empty()) log::get("serve")->warn("{}", hc.chat_refusal);
  serve::http::HttpServer server(**engine, tokenizer ? &*tokenizer : nullptr, hc);
  auto port = server.start(c.host, c.port);
  if (!port.ok()) return fail(port.status());
  install_stop_signals();
  // The mode the engine runs (--split auto makes it paged whatever --mode said).
  const std::string_view mode_run = serve::to_string(ec.pager.mode);
  const std::string_view kv_dtype = to_string((*engine)->kv().dtype());
  std::printf("listening port=%d model=%s mode=%.*s kv_blocks=%d kv_dtype=%.*s\n", *port,
              hc.model_name.c_str(), static_cast<int>(mode_run.size()), mode_run.data(),
              (*engine)->kv().num_blocks(), static_cast<int>(kv_dtype.size()), kv_dtype.data());
  std::fflush(stdout);
  {
    // Reserved (the pools' maxima) against held (what is committed): a resizable engine's
    // pools hold only their live sizes (docs/serve_wsa.md "Memory of a resizable engine"),
    // unless the GPU lacks VMM and they are held whole (docs/mem_virtual_region.md).
    const serve::Engine& eng = **engine;
    log::get("serve")->info(
        "device memory: budget charge {} of {}, held {} ({}), pools reserved {}",
        mem::format_bytes(eng.device_budget().bytes_used()),
        eng.device_budget().bytes_limit() == mem::MemoryBudget::kUnlimited
            ? std::string("unlimited")
            : mem::format_bytes(eng.device_budget().bytes_limit()),
        mem::format_bytes(eng.device_held_bytes()),
        eng.pools_backed_up_front() ? "whole pools: no VMM" : "committed",
        mem::format_bytes(eng.pool_reserved_bytes()));
    if (eng.pools_backed_up_front() &&
        eng.device_budget().bytes_limit() != mem::MemoryBudget::kUnlimited &&
        eng.device_held_bytes() > eng.device_budget().bytes_limit()) {
      log::get("serve")->warn(
          "device memory: held {} is over the {} budget: without CUDA virtual memory management "
          "the resizable pools of --split auto hold their maxima; a fixed split (no --split auto) "
          "stays within the budget",
          mem::format_bytes(eng.device_held_bytes()),
          mem::format_bytes(eng.device_budget().bytes_limit()));
    }
  }
  wait_for_stop(c.duration_s);
  server.stop();
  if (live) {
    const auto& st = live->stats();
    std::fprintf(stderr,
                 "wsa: decisions=%llu priced_by_caps=%llu moves=%llu final kv_blocks=%d "
                 "slots=%s device_peak_mib=%.1f held_peak_mib=%.1f\n",
                 static_cast<unsigned long long>(st.decisions),
                 static_cast<unsigned long long>(st.priced_by_caps),
                 static_cast<unsigned long long>(st.moves), live->current().kv_blocks,
                 slots_text(live->current().slots).c_str(),
                 double((*engine)->device_budget().bytes_peak()) / double(1 << 20),
                 double((*engine)->device_held_peak_bytes()) / double(1 << 20));
  }
  return 0;
}

void register_serve(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<ServeCliConfig>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-style HTTP server over the serving engine");
  cmd->add_option("--model", c->model_dir, "Hugging Face model folder (default: built-in MoE)")
      ->check(CLI::ExistingDirectory)
      ->envname("FERRY_MODEL");
  cmd->add_option("--host", c->host, "address to bind");
  cmd->add_option("--port", c->port, "port (0 = ephemeral)")->check(CLI::Range(0, 65535));
  cmd->add_option("--name", c->name, "model name in the API (default: the folder name)");
  add_engine_flags(cmd, c->engine, /*miss_link_flag=*/false);  // --link-gbps below
  cmd->add_option("--max-running", c->max_running, "sequences decoded concurrently")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--no-prefix-cache", c->no_prefix_cache,
                "turn off automatic prefix caching (finished requests' KV blocks kept and reused)")
      ->envname("FERRY_NO_PREFIX_CACHE");
  cmd->add_option("--kv-admission", c->kv_admission,
                  "reserve: a request is admitted when the KV pool holds its prompt + max_tokens "
                  "(it never waits once running; the default); preempt: admitted for what it "
                  "has computed, blocks grow as it decodes, and a decode short of a block "
                  "preempts the youngest running request, which is recomputed later with the "
                  "same tokens (more requests run in the same pool; implied by --split auto)")
      ->check(CLI::IsMember({"reserve", "preempt"}));
  cmd->add_option("--max-tokens-default", c->default_max_tokens,
                  "max_tokens of a request that gives none")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--chat-template", c->chat_template,
                  "auto: the model's tokenizer_config.json template (refused if it has none or "
                  "one ferry cannot render); chatml: ChatML whatever it says; FILE: a Jinja "
                  "chat template file");
  cmd->add_option("--http-threads", c->http_threads,
                  "connection handler threads; each open stream or waiting request holds one "
                  "(0: max(8, cores - 1, 2 x --max-running + 8))")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--api-key", c->api_key,
                  "require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                  "(401 otherwise); prefer the FERRY_API_KEY variable, which ps does not show")
      ->envname("FERRY_API_KEY");
  cmd->add_option("--duration-s", c->duration_s, "stop after this long (0 = until a signal)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--split", c->split,
                  "fixed: the pools keep their sizes; auto: MV-WSA divides --device-budget-mib "
                  "between expert slots and KV blocks while serving (the pools hold their live "
                  "sizes through CUDA virtual memory; without it, or with FERRY_VMM=off, both "
                  "pools are held whole)")
      ->check(CLI::IsMember({"fixed", "auto"}))
      ->envname("FERRY_SPLIT");
  cmd->add_option("--wsa-max-context", c->wsa_max_context,
                  "max context for the KV admission floor (floor = max-running x this; 0: the "
                  "model's max positions)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--wsa-decide-steps", c->wsa_decide_steps,
                  "most steps between MV-WSA decisions (they come sooner, once 2 x E expert "
                  "accesses per MoE layer have arrived, at least 4 steps apart)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--plan-only", c->plan_only,
                "print the MV-WSA split for --trace and --budget-gib, then exit");
  cmd->add_option("--trace", c->trace,
                  "routing trace file for --plan-only; with --split auto, the live split starts "
                  "from that trace's plan (a warm start)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--budget-gib", c->budget_gib, "expert slots + KV budget for --plan-only (GiB)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--link-gbps", c->link_gbps,
                  "host-to-device link (GB/s): MV-WSA's miss cost and --miss-cost-model")
      ->check(CLI::Range(0.001, 1e4));
  cmd->add_option("--plan-bytes-per-param", c->plan_bytes_per_param,
                  "bytes per expert/KV element in the plan (4: this engine's f32; 2: bf16)")
      ->check(CLI::Range(1, 8));
  auto* by_caps =
      cmd->add_option("--configurator-price-by-caps", c->configurator_price_by_caps,
                      "--plan-only's configurator, as the benches': on (default) prices a "
                      "recomputed prompt block at each split's own caps (allocate_priced_by_caps); "
                      "off: one price (allocate). A routing trace has no prefix curve, so both "
                      "give the same split there")
          ->check(CLI::IsMember({"on", "off"}))
          ->envname("FERRY_CONFIGURATOR_PRICE_BY_CAPS");
  auto* live_by_caps =
      cmd->add_option("--live-price-by-caps", c->live_price_by_caps,
                      "--split auto: on prices a recomputed prompt block at each split's own caps "
                      "in the live controller's decisions (needs the prefix cache); off (default): "
                      "one price")
          ->check(CLI::IsMember({"on", "off"}))
          ->envname("FERRY_LIVE_PRICE_BY_CAPS");
  cmd->callback([&run, c, by_caps, live_by_caps] {
    c->configurator_flag_given = by_caps->count() > 0;
    c->live_flag_given = live_by_caps->count() > 0;
    run = [c] { return run_serve(*c); };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_serve);
}  // namespace ferry::app
