// SPDX-License-Identifier: Apache-2.0
// `ferry generate [--model DIR] (--prompt STR | --token-ids FILE) [--max-new-tokens N]
//   [--greedy | --temperature T --top-k K --top-p P --min-p M --seed S] [--repetition-penalty R]
//   [--presence-penalty P] [--frequency-penalty F] [--logprobs N] [--chat [--system S]]
//   [--stop STR]... [--mode M]
//   [--expert-slots N | --layer-slots N,N,.. | --expert-budget-mib M] [--policy lru|lfu|lfru]
//   [--miss-cost-model [--link-gbps G --cpu-gflops F|auto]] [--bypass-window N]
//   [--json]`
// One prompt through the serving engine (paged KV cache, chunked prefill, expert pager) on the
// CPU. Without --model it runs the built-in random-weight Qwen3-MoE (serve/builtin_model.h) with
// `ferry train`'s byte-level tokenizer, so it works offline. Routing traces: --record-trace F
// writes the routing; --replay-trace F forces it; --synthetic-trace calibrated|spread forces a
// generated one. Text goes to stdout; --json adds ids, timings and pager counters.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "apps/ferry/serve_engine_setup.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "model/model_binding.h"
#include "model/tokenizer/chat_renderer.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/engine.h"
#include "serve/http/http_server.h"
#include "serve/routing_trace.h"
#include "serve/trace_synth.h"

namespace ferry::app {
namespace {

struct GenerateConfig {
  std::string model_dir;
  std::string prompt;
  std::string token_ids_file;
  int max_new_tokens = 32;
  bool greedy = false;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::optional<std::uint64_t> seed;
  serve::PenaltyParams penalties;
  int logprobs = -1;   // --logprobs N: each generated token's logprob and N alternatives (JSON)
  bool chat = false;   // --chat: the prompt as a user message through the model's chat template
  std::string system;  // --system: a system message before it
  std::vector<std::string> stop;
  std::vector<int> stop_ids;
  EngineFlags engine;
  std::string record_trace, replay_trace, synthetic_trace;
  bool json = false;
};

Result<std::vector<std::int32_t>> read_ids(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  std::vector<std::int32_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string tok = text.substr(i, j - i);
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || v < 0 || v > INT32_MAX) {
      return invalid_argument("generate: {}: '{}' is not a non-negative token id", path, tok);
    }
    ids.push_back(static_cast<std::int32_t>(v));
    i = j;
  }
  return ids;
}

int run_generate(const GenerateConfig& cfg) {
  auto holder = load_serving_model(cfg.model_dir);
  if (!holder.ok()) return fail(holder.status());
  const model::DecoderGeometry& geo = holder->geometry();
  serve::GenerationRequest req;
  std::vector<std::int32_t> chat_stop_ids;  // --chat: the end of the assistant's turn
  if (!cfg.token_ids_file.empty()) {
    auto ids = read_ids(cfg.token_ids_file);
    if (!ids.ok()) return fail(ids.status());
    req.prompt = std::move(*ids);
  } else {
    if (!holder->tokenizer) {
      return fail(
          invalid_argument("generate: {} has no tokenizer.json; use --token-ids", cfg.model_dir));
    }
    std::string text = cfg.prompt;
    if (cfg.chat) {  // the model's template (ChatML for the built-in model)
      auto renderer = cfg.model_dir.empty()
                          ? Result<model::ChatRenderer>(model::ChatRenderer::chatml())
                          : model::ChatRenderer::from_tokenizer_config(cfg.model_dir +
                                                                       "/tokenizer_config.json");
      if (!renderer.ok()) return fail(renderer.status());
      std::vector<model::ChatMessage> msgs;
      if (!cfg.system.empty()) msgs.push_back({"system", cfg.system});
      msgs.push_back({"user", cfg.prompt});
      auto rendered = renderer->render(msgs, /*add_generation_prompt=*/true);
      if (!rendered.ok()) return fail(rendered.status());
      text = std::move(*rendered);
      // Stop at the end of the assistant's turn, as ferry serve does: the tokenizer's
      // <|im_end|> / <|endoftext|> and the model folder's own end tokens.
      chat_stop_ids = serve::http::default_stop_ids(*holder->tokenizer);
      if (!cfg.model_dir.empty()) {
        for (const std::int32_t id :
             model::model_end_token_ids(cfg.model_dir, *holder->tokenizer)) {
          chat_stop_ids.push_back(id);
        }
      }
    }
    auto ids = holder->tokenizer->encode(text);
    if (!ids.ok()) return fail(ids.status());
    req.prompt.assign(ids->begin(), ids->end());
  }
  req.max_new_tokens = cfg.max_new_tokens;
  if (!cfg.greedy) {
    req.sampling = {.temperature = cfg.temperature,
                    .top_k = cfg.top_k,
                    .top_p = cfg.top_p,
                    .min_p = cfg.min_p,
                    .seed = cfg.seed};
  }
  req.sampling.penalties = cfg.penalties;
  req.logprobs = cfg.logprobs;
  req.stop_strings = cfg.stop;
  req.stop_token_ids.assign(cfg.stop_ids.begin(), cfg.stop_ids.end());
  req.stop_token_ids.insert(req.stop_token_ids.end(), chat_stop_ids.begin(), chat_stop_ids.end());
  if (holder->tokenizer) {
    const model::Tokenizer* tok = &*holder->tokenizer;
    req.detokenize = [tok](std::span<const std::int32_t> ids) { return tok->decode(ids); };
  } else if (!req.stop_strings.empty()) {
    return fail(invalid_argument("generate: --stop needs a tokenizer.json in the model folder"));
  }

  auto ec = engine_config(cfg.engine, geo, "generate");
  if (!ec.ok()) return fail(ec.status());
  ec->max_seq_len = static_cast<int>(holder->config().max_position_embeddings);
  auto backend = serve_backend(cfg.engine.device);
  if (!backend.ok()) return fail(backend.status());
  auto engine = serve::Engine::create(geo, holder->params(), *ec, **backend);
  if (!engine.ok()) return fail(engine.status());
  serve::Engine& eng = **engine;

  std::unique_ptr<serve::TraceRecorder> recorder;
  std::unique_ptr<serve::TraceReplayer> replayer;
  std::vector<int> moe_layers;
  for (int l = 0; l < geo.layers; ++l) {
    if (geo.layer_is_moe[l]) moe_layers.push_back(l);
  }
  if (!cfg.replay_trace.empty() || !cfg.synthetic_trace.empty()) {
    serve::RoutingTrace trace;
    if (!cfg.replay_trace.empty()) {
      auto t = serve::RoutingTrace::load(cfg.replay_trace);
      if (!t.ok()) return fail(t.status());
      trace = std::move(*t);
    } else {
      trace = serve::make_synthetic_trace({.experts = geo.experts,
                                           .top_k = geo.top_k,
                                           .moe_layers = moe_layers,
                                           .sessions = 1,
                                           .prefill_tokens = static_cast<int>(req.prompt.size()),
                                           .decode_tokens = cfg.max_new_tokens,
                                           .spread = cfg.synthetic_trace == "spread",
                                           .seed = cfg.seed.value_or(0) + 1});
    }
    if (trace.experts != geo.experts || trace.top_k != geo.top_k) {
      return fail(invalid_argument("generate: trace routes {} of {} experts, the model {} of {}",
                                   trace.top_k, trace.experts, geo.top_k, geo.experts));
    }
    replayer = std::make_unique<serve::TraceReplayer>(std::move(trace));
    eng.set_routing_hook(replayer.get());
  } else if (!cfg.record_trace.empty()) {
    recorder = std::make_unique<serve::TraceRecorder>(geo.experts, geo.top_k);
    eng.set_routing_hook(recorder.get());
  }

  auto id = eng.submit(std::move(req));
  if (!id.ok()) return fail(id.status());
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<double> ttft_s;
  std::vector<std::int32_t> streamed;
  while (!eng.idle()) {
    auto events = eng.step();
    if (!events.ok()) return fail(events.status());
    if (!ttft_s && !events->empty()) {
      ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto out = eng.take_output(*id);
  if (!out.ok()) return fail(out.status());
  if (recorder) {
    if (Status s = recorder->trace().save(cfg.record_trace); !s.ok()) return fail(s);
  }
  const serve::ExpertExecutor& ex = eng.experts();
  if (cfg.json) {
    Json j = {{"model", cfg.model_dir.empty() ? "builtin-qwen3-moe" : cfg.model_dir},
              {"mode", cfg.engine.mode},
              {"policy", cfg.engine.policy},
              {"ids", out->tokens},
              {"text", out->text},
              {"finish_reason", std::string(serve::to_string(out->finish))},
              {"prefill_tokens", eng.stats().prefill_tokens},
              {"decode_tokens", eng.stats().decode_tokens},
              {"steps", eng.stats().steps},
              {"ttft_s", ttft_s.value_or(0.0)},
              {"total_s", total_s},
              {"kv_blocks_peak", eng.stats().kv_blocks_peak},
              {"kv_dtype", std::string(to_string(eng.kv().dtype()))},
              {"kv_blocks", eng.kv().num_blocks()},
              {"kv_block_bytes", eng.kv().block_bytes()},
              {"device", cfg.engine.device},
              {"device_weight_bytes", eng.device_weight_bytes()},
              {"dense_dtype", std::string(to_string(eng.config().dense_dtype))},
              {"host_dense_weight_bytes", eng.host_dense_weight_bytes()},
              {"device_peak_bytes", eng.device_budget().bytes_peak()},
              {"expert_device_bytes", ex.device_bytes()},
              {"static_bytes_copied", ex.counters().static_bytes_copied}};
    if (cfg.logprobs >= 0) {  // per generated token: id, logprob, [[id, logprob] alternatives]
      Json lps = Json::array();
      for (const serve::TokenLogprob& lp : out->logprobs) {
        Json top = Json::array();
        for (const auto& [tid, x] : lp.top) top.push_back(Json::array({tid, x}));
        lps.push_back({{"id", lp.token}, {"logprob", lp.logprob}, {"top", top}});
      }
      j["logprobs"] = lps;
    }
    if (const serve::ExpertPager* p = ex.pager()) {
      const serve::PagerCounters& c = p->counters();
      std::vector<int> slots;  // per MoE layer
      for (int l : moe_layers) slots.push_back(p->capacity(l));
      j["pager"] = {{"hits", c.hits},
                    {"misses", c.misses},
                    {"hit_rate", c.hit_rate()},
                    {"bytes_copied", c.bytes_copied},
                    {"evictions", c.evictions},
                    {"copy_batches", c.copy_batches},
                    {"host_computed_misses", ex.counters().cpu_misses},
                    {"bypassed", ex.counters().bypassed},
                    // the miss cost model's CPU rate: --cpu-gflops, or measured (auto)
                    {"cpu_gflops", ex.placement_cpu_gflops()},
                    {"cpu_rate_measured", ex.measured_cpu_rate().has_value()},
                    {"slots", slots},
                    {"budget_bytes", p->budget().bytes_limit()},
                    {"budget_peak_bytes", p->budget().bytes_peak()}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    // Human summary on stderr (stdout carries only the generated text).
    auto lg = log::get("serve");
    lg->info("mode={} prefill_tokens={} decode_tokens={} steps={} total_s={:.3f} ttft_s={:.3f}",
             cfg.engine.mode, eng.stats().prefill_tokens, eng.stats().decode_tokens,
             eng.stats().steps, total_s, ttft_s.value_or(0.0));
    if (const serve::ExpertPager* p = ex.pager()) {
      const serve::PagerCounters& c = p->counters();
      lg->info(
          "pager policy={} hits={} misses={} hit_rate={:.3f} copied_mib={:.1f} evictions={} "
          "host_computed_misses={} bypassed={}",
          cfg.engine.policy, c.hits, c.misses, c.hit_rate(), double(c.bytes_copied) / (1 << 20),
          c.evictions, ex.counters().cpu_misses, ex.counters().bypassed);
    }
    if (const auto& rate = ex.measured_cpu_rate()) {
      lg->info(
          "miss cost model: CPU rate measured {:.2f} GFLOP/s ({:.2f} GB/s of expert bytes, {} "
          "kernel, one row of each of {} experts)",
          rate->gflops, rate->expert_gbps, serve::to_string(rate->kernel), rate->experts);
    }
    if (holder->tokenizer) {
      std::printf("%s\n", out->text.c_str());
    } else {
      for (std::size_t i = 0; i < out->tokens.size(); ++i) {
        std::printf("%s%d", i ? " " : "", out->tokens[i]);
      }
      std::printf("\n");
    }
  }
  return 0;
}

void register_generate(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<GenerateConfig>();
  auto* cmd =
      app.add_subcommand("generate", "generate text from one prompt with the serving engine");
  cmd->add_option("--model", cfg->model_dir, "Hugging Face model folder (default: built-in MoE)")
      ->check(CLI::ExistingDirectory)
      ->envname("FERRY_MODEL");
  auto* prompt = cmd->add_option("--prompt", cfg->prompt, "prompt text");
  auto* ids =
      cmd->add_option("--token-ids", cfg->token_ids_file, "file of whitespace-separated ids")
          ->check(CLI::ExistingFile);
  prompt->excludes(ids);
  cmd->add_option("--max-new-tokens", cfg->max_new_tokens, "tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  auto* greedy = cmd->add_flag("--greedy", cfg->greedy, "argmax decoding (the default)");
  auto* temp =
      cmd->add_option("--temperature", cfg->temperature, "sampling temperature (0: greedy)")
          ->check(CLI::Range(0.0, 100.0));
  auto* topk = cmd->add_option("--top-k", cfg->top_k, "keep the K most likely (0: all)")
                   ->check(CLI::Range(0, 1 << 24));
  auto* topp = cmd->add_option("--top-p", cfg->top_p, "nucleus mass in (0, 1]")
                   ->check(CLI::Range(1e-6, 1.0));
  auto* minp = cmd->add_option("--min-p", cfg->min_p,
                               "keep only tokens at least this share of the most likely one's "
                               "probability, in [0, 1] (0: off)")
                   ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", cfg->seed, "sampling seed (default: the engine's fixed seed)");
  greedy->excludes(temp)->excludes(topk)->excludes(topp)->excludes(minp);
  cmd->add_option("--repetition-penalty", cfg->penalties.repetition,
                  "divide (multiply) the positive (negative) logits of prompt and generated tokens "
                  "(1: off)")
      ->check(CLI::Range(1e-6, 1e6));
  cmd->add_option("--presence-penalty", cfg->penalties.presence,
                  "subtract from the logits of tokens generated so far (0: off)")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", cfg->penalties.frequency,
                  "subtract per occurrence among the generated tokens (0: off)")
      ->check(CLI::Range(-2.0, 2.0));
  auto* chat = cmd->add_flag("--chat", cfg->chat,
                             "render --prompt as a user message with the model's chat template "
                             "(tokenizer_config.json; ChatML for the built-in model)");
  cmd->add_option("--system", cfg->system, "with --chat: a system message before it")->needs(chat);
  cmd->add_option("--logprobs", cfg->logprobs,
                  "with --json: each generated token's logprob and N alternatives (0..20)")
      ->check(CLI::Range(0, serve::kMaxTopLogprobs));
  cmd->add_option("--stop", cfg->stop, "stop string (repeatable)");
  cmd->add_option("--stop-id", cfg->stop_ids, "stop token id (repeatable)");
  add_engine_flags(cmd, cfg->engine);
  auto* rec = cmd->add_option("--record-trace", cfg->record_trace, "write the routing trace here");
  auto* rep = cmd->add_option("--replay-trace", cfg->replay_trace, "force routing from a trace")
                  ->check(CLI::ExistingFile);
  auto* syn = cmd->add_option("--synthetic-trace", cfg->synthetic_trace,
                              "force a generated trace: calibrated or spread")
                  ->check(CLI::IsMember({"calibrated", "spread"}));
  rep->excludes(syn);
  rec->excludes(rep)->excludes(syn);
  cmd->add_flag("--json", cfg->json, "JSON output: ids, text, timings, pager counters");
  cmd->callback([cfg, &run, prompt, ids] {
    if (prompt->count() == 0 && ids->count() == 0) {
      throw CLI::RequiredError("--prompt or --token-ids");
    }
    run = [cfg] { return run_generate(*cfg); };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_generate);
}  // namespace ferry::app
