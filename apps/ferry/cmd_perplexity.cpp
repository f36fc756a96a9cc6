// SPDX-License-Identifier: Apache-2.0
// `ferry perplexity [--model DIR] (--text-file F | --token-ids F) [--context N] [--json]
//   [--engine serve|compute] [--max-running N] [the engine flags of ferry generate]`: mean
// negative log-likelihood and perplexity of a token sequence under a Hugging Face model.
// Long inputs are cut into windows of --context tokens; window w feeds tokens [s, s+ctx) and
// predicts tokens [s+1, s+ctx]. Windows start every --stride tokens (default: the context, so
// they do not overlap); a window scores only the tokens no earlier window scored, so every token
// after the first is predicted exactly once, and a stride under the context gives each scored
// token at least context - stride tokens before it (Hugging Face's sliding-window perplexity).
// --json adds the per-token log-probabilities.
//   --engine serve (the default): the serving engine scores each window as a prompt
//     (GenerationRequest::prompt_logprobs, no token generated), --max-running windows batched at
//     a time, with every flag of `ferry generate`'s engine: --mode resident|static|cpu-experts|
//     paged with the pager's size and policy, --device cpu|cuda, --expert-dtype / --dense-dtype.
//     So a MoE that does not fit the GPU is scored through the pager, and every mode gives the
//     same logprobs bits (the engine's byte identity). Without --model: the built-in MoE. The
//     context is capped at the model's max positions - 1; without --kv-budget-mib the KV pool is
//     sized for --max-running windows.
//   --engine compute: the training forward (model::ModelCompute, f32 on the CPU; --backend
//     reference for the plain kernels).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "apps/ferry/serve_engine_setup.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/engine.h"
#include "serve/kv_cache.h"

namespace ferry::app {
namespace {

struct PerplexityConfig {
  std::string model_dir;
  std::string text_file;
  std::string token_ids_file;
  std::string tokenizer_file;  // default: <model>/tokenizer.json
  std::string engine = "serve";
  std::string backend = "cpu";  // --engine compute
  int context = 1024;
  int stride = 0;       // 0: the context
  int max_running = 4;  // --engine serve: windows in flight
  EngineFlags engine_flags;
  bool kv_budget_given = false;
  bool add_special_tokens = false;
  bool json = false;
};

Result<std::vector<std::int32_t>> read_token_ids(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  std::vector<std::int32_t> ids;
  std::size_t i = 0;
  int line = 1;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(ch))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string tok = text.substr(i, j - i);
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || v < 0 || v > INT32_MAX) {
      return invalid_argument("perplexity: {}:{}: '{}' is not a non-negative token id", path, line,
                              tok);
    }
    ids.push_back(static_cast<std::int32_t>(v));
    i = j;
  }
  return ids;
}

// `builtin`: the built-in model's tokenizer, used when there is no folder and no --tokenizer.
Result<std::vector<std::int32_t>> load_tokens(const PerplexityConfig& cfg,
                                              const model::Tokenizer* builtin = nullptr) {
  if (!cfg.token_ids_file.empty()) return read_token_ids(cfg.token_ids_file);
  std::optional<model::Tokenizer> own;
  if (!cfg.tokenizer_file.empty() || !cfg.model_dir.empty() || !builtin) {
    const std::string tok_path =
        cfg.tokenizer_file.empty() ? cfg.model_dir + "/tokenizer.json" : cfg.tokenizer_file;
    FERRY_ASSIGN_OR_RETURN(own, model::Tokenizer::from_file(tok_path));
  }
  const model::Tokenizer& tokenizer = own ? *own : *builtin;
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(cfg.text_file));
  FERRY_ASSIGN_OR_RETURN(auto ids,
                         tokenizer.encode(text, {.add_special_tokens = cfg.add_special_tokens}));
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

Status check_ids(const std::vector<std::int32_t>& toks, std::int64_t vocab) {
  if (toks.size() < 2) {
    return invalid_argument("perplexity: need at least 2 tokens, got {}", toks.size());
  }
  for (std::size_t i = 0; i < toks.size(); ++i) {
    if (toks[i] >= vocab) {
      return invalid_argument(
          "perplexity: token id {} at position {} is outside the vocabulary of {}", toks[i], i,
          vocab);
    }
  }
  return ok_status();
}

// A window feeds tokens [begin, begin + len) and predicts tokens begin + 1 .. begin + len; the
// first `skip` of those predictions an earlier window scored.
struct Window {
  std::int64_t begin = 0, len = 0, skip = 0;
};

std::vector<Window> plan_windows(std::int64_t n, std::int64_t ctx, std::int64_t stride) {
  std::vector<Window> windows;
  std::int64_t scored_to = 0;  // tokens 1 .. scored_to are scored
  for (std::int64_t b = 0; scored_to < n - 1; b += stride) {
    const std::int64_t len = std::min(ctx, n - 1 - b);
    windows.push_back({.begin = b, .len = len, .skip = scored_to - b});
    scored_to = b + len;
  }
  return windows;
}

void print_result(const PerplexityConfig& cfg, std::int64_t n, std::int64_t counted, double nll_sum,
                  const std::vector<float>& logprobs, Json extra) {
  const double mean = nll_sum / static_cast<double>(counted);
  if (cfg.json) {
    Json out = {{"model", cfg.model_dir.empty() ? "builtin-qwen3-moe" : cfg.model_dir},
                {"tokens", n},
                {"predicted", counted},
                {"mean_nll", mean},
                {"perplexity", std::exp(mean)},
                {"engine", cfg.engine},
                {"logprobs", logprobs}};
    out.update(extra);
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("tokens %lld  predicted %lld  mean_nll %.6f  perplexity %.4f\n",
                static_cast<long long>(n), static_cast<long long>(counted), mean, std::exp(mean));
  }
}

// The stride between window starts for windows of ctx tokens (ctx: --context, or less where the
// model has fewer positions): --stride, the context without one, never more than ctx.
std::int64_t window_stride(const PerplexityConfig& cfg, std::int64_t ctx) {
  return std::min<std::int64_t>(cfg.stride > 0 ? cfg.stride : cfg.context, ctx);
}

// --engine serve: each window a scoring-only request (prompt_logprobs, max_new_tokens 0).
int run_perplexity_serving(const PerplexityConfig& cfg) {
  auto holder = load_serving_model(cfg.model_dir);
  if (!holder.ok()) return fail(holder.status());
  const model::DecoderGeometry& geo = holder->geometry();
  auto tokens = load_tokens(cfg, holder->tokenizer ? &*holder->tokenizer : nullptr);
  if (!tokens.ok()) return fail(tokens.status());
  if (Status st = check_ids(*tokens, geo.vocab); !st.ok()) return fail(st);
  const int max_pos = static_cast<int>(holder->config().max_position_embeddings);
  std::int64_t ctx = cfg.context;
  if (ctx > max_pos - 1) {  // a window is ctx + 1 positions
    ctx = max_pos - 1;
    log::get("perplexity")
        ->info("context {} capped at {}: the model has {} positions", cfg.context, ctx, max_pos);
  }
  auto ec = engine_config(cfg.engine_flags, geo, "perplexity");
  if (!ec.ok()) return fail(ec.status());
  ec->max_seq_len = max_pos;
  ec->max_running = cfg.max_running;
  if (!cfg.kv_budget_given) {  // room for max_running whole windows
    const std::int64_t blocks_per_window =
        (ctx + 1 + ec->kv.block_tokens - 1) / ec->kv.block_tokens;
    ec->kv.budget_bytes = std::size_t(cfg.max_running) * std::size_t(blocks_per_window) *
                          serve::kv_block_bytes(geo, ec->kv.block_tokens, ec->kv.dtype);
  }
  auto backend = serve_backend(cfg.engine_flags.device);
  if (!backend.ok()) return fail(backend.status());
  auto engine = serve::Engine::create(geo, holder->params(), *ec, **backend);
  if (!engine.ok()) return fail(engine.status());
  serve::Engine& eng = **engine;

  const std::vector<std::int32_t>& toks = *tokens;
  const auto n = static_cast<std::int64_t>(toks.size());
  const std::vector<Window> plan = plan_windows(n, ctx, window_stride(cfg, ctx));
  // Windows go in a group at a time (a few times --max-running, so the engine always has the
  // next ones queued) rather than all at once: a long text with a small stride is many windows,
  // each holding its prompt and its logprobs until taken.
  const std::size_t group = 4 * std::size_t(cfg.max_running);
  std::vector<float> logprobs;
  logprobs.reserve(std::size_t(n - 1));
  double nll_sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t first = 0; first < plan.size(); first += group) {
    const std::size_t last = std::min(plan.size(), first + group);
    std::vector<serve::RequestId> ids;
    for (std::size_t k = first; k < last; ++k) {
      const Window& w = plan[k];
      serve::GenerationRequest req;
      req.prompt.assign(toks.begin() + w.begin, toks.begin() + w.begin + w.len + 1);
      req.max_new_tokens = 0;
      req.prompt_logprobs = 0;
      auto id = eng.submit(std::move(req));
      if (!id.ok()) return fail(id.status());
      ids.push_back(*id);
    }
    if (Status st = eng.run_until_idle(); !st.ok()) return fail(st);
    for (std::size_t k = first; k < last; ++k) {
      auto out = eng.take_output(ids[k - first]);
      if (!out.ok()) return fail(out.status());
      for (std::size_t i = std::size_t(plan[k].skip); i < out->prompt_logprobs.size(); ++i) {
        const float lp = out->prompt_logprobs[i].logprob;
        nll_sum -= double(lp);
        logprobs.push_back(lp);
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto counted = static_cast<std::int64_t>(logprobs.size());
  if (counted != n - 1) {  // a bug, not an input error
    return fail(internal_error("perplexity: scored {} tokens of {}", counted, n - 1));
  }
  log::get("perplexity")
      ->info(
          "engine=serve mode={} device={} windows={} context={} steps={} seconds={:.3f} "
          "tokens_per_s={:.1f}",
          cfg.engine_flags.mode, cfg.engine_flags.device, plan.size(), ctx, eng.stats().steps,
          seconds, double(n) / std::max(seconds, 1e-9));
  print_result(cfg, n, counted, nll_sum, logprobs,
               {{"mode", cfg.engine_flags.mode},
                {"device", cfg.engine_flags.device},
                {"context", ctx},
                {"windows", plan.size()},
                {"seconds", seconds}});
  return 0;
}

int run_perplexity(const PerplexityConfig& cfg) {
  if (cfg.engine == "serve") return run_perplexity_serving(cfg);
  if (cfg.model_dir.empty()) {
    return fail(invalid_argument("perplexity: --engine compute needs --model"));
  }
  auto tokens = load_tokens(cfg);
  if (!tokens.ok()) return fail(tokens.status());
  auto loaded = model::load_model_f32(cfg.model_dir);
  if (!loaded.ok()) return fail(loaded.status());
  const model::LoadedModel& m = **loaded;
  if (Status st = check_ids(*tokens, m.geometry.vocab); !st.ok()) return fail(st);
  kernels::Backend& be =
      cfg.backend == "reference" ? kernels::reference_backend() : kernels::cpu_backend();
  const std::int64_t ctx = cfg.context;
  auto compute = model::ModelCompute::create(m.geometry, ctx, be);
  if (!compute.ok()) return fail(compute.status());

  const std::vector<std::int32_t>& toks = *tokens;
  const std::int64_t n = static_cast<std::int64_t>(toks.size());
  std::vector<std::int32_t> ids(ctx), pos(ctx), tgt(ctx), cu(2);
  std::vector<float> nll(ctx), logprobs;
  logprobs.reserve(n - 1);
  double nll_sum = 0;
  std::int64_t counted = 0;
  for (const Window& w : plan_windows(n, ctx, window_stride(cfg, ctx))) {
    const std::int64_t s = w.begin, len = w.len;
    for (std::int64_t t = 0; t < len; ++t) {
      ids[t] = toks[s + t];
      pos[t] = static_cast<std::int32_t>(t);
      tgt[t] = toks[s + t + 1];
    }
    cu[0] = 0;
    cu[1] = static_cast<std::int32_t>(len);
    const model::PackedBatch batch{
        .ids = ConstTensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {len}),
        .positions = ConstTensorView::contiguous(pos.data(), DType::kI32, Device::kCpu, {len}),
        .cu_seqlens = ConstTensorView::contiguous(cu.data(), DType::kI32, Device::kCpu, {2}),
        .targets = ConstTensorView::contiguous(tgt.data(), DType::kI32, Device::kCpu, {len})};
    auto res = (*compute)->forward(
        m.params, batch, TensorView::contiguous(nll.data(), DType::kF32, Device::kCpu, {len}));
    if (!res.ok()) return fail(res.status());
    for (std::int64_t t = w.skip; t < len; ++t) {
      nll_sum += double(nll[t]);
      logprobs.push_back(-nll[t]);
    }
    counted += len - w.skip;
  }
  print_result(cfg, n, counted, nll_sum, logprobs, {{"backend", cfg.backend}});
  return 0;
}

void register_perplexity(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<PerplexityConfig>();
  auto* cmd = app.add_subcommand("perplexity", "mean NLL and perplexity of a text under a model");
  cmd->add_option("--model", cfg->model_dir,
                  "Hugging Face model folder (default with --engine serve: the built-in MoE)")
      ->check(CLI::ExistingDirectory);
  auto* text = cmd->add_option("--text-file", cfg->text_file, "UTF-8 text to score")
                   ->check(CLI::ExistingFile);
  auto* ids =
      cmd->add_option("--token-ids", cfg->token_ids_file, "file of whitespace-separated token ids")
          ->check(CLI::ExistingFile);
  text->excludes(ids);
  cmd->add_option("--tokenizer", cfg->tokenizer_file, "tokenizer.json (default: in --model)");
  cmd->add_option("--context", cfg->context, "tokens per window")
      ->check(CLI::Range(2, 1 << 20))
      ->envname("FERRY_CONTEXT");
  cmd->add_option("--stride", cfg->stride,
                  "tokens between window starts (default: the context; smaller: overlapping "
                  "windows, each token scored once with at least context - stride before it)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--engine", cfg->engine,
                  "serve (the serving engine, with its modes and devices; the default) or compute "
                  "(the training forward, f32 on the CPU)")
      ->check(CLI::IsMember({"serve", "compute"}));
  auto* backend = cmd->add_option("--backend", cfg->backend, "--engine compute: cpu or reference")
                      ->check(CLI::IsMember({"cpu", "reference"}));
  cmd->add_option("--max-running", cfg->max_running, "--engine serve: windows scored at a time")
      ->check(CLI::Range(1, 4096));
  CLI::Option* kv_budget = add_engine_flags(cmd, cfg->engine_flags);
  cmd->add_flag("--add-special-tokens", cfg->add_special_tokens,
                "apply the tokenizer's post-processor (e.g. a BOS token)");
  cmd->add_flag("--json", cfg->json, "JSON output with per-token log-probabilities");
  cmd->callback([cfg, &run, text, ids, backend, kv_budget] {
    if (text->count() == 0 && ids->count() == 0) {
      throw CLI::RequiredError("--text-file or --token-ids");
    }
    if (cfg->stride > cfg->context) {
      throw CLI::ValidationError("--stride",
                                 "must be at most --context (windows would leave gaps)");
    }
    if (backend->count() > 0 && cfg->engine != "compute") {
      throw CLI::ValidationError("--backend", "is for --engine compute");
    }
    cfg->kv_budget_given = kv_budget->count() > 0;
    run = [cfg] { return run_perplexity(*cfg); };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_perplexity);
}  // namespace ferry::app
