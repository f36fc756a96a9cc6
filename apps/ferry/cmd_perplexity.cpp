// SPDX-License-Identifier: Apache-2.0
// `ferry perplexity --model DIR (--text-file F | --token-ids F) [--json]`: mean negative
// log-likelihood and perplexity of a token sequence under a Hugging Face model, on the CPU.
// Long inputs are cut into windows of --context tokens; window w feeds tokens [s, s+ctx) and
// predicts tokens [s+1, s+ctx], so every token after the first is predicted exactly once.
// --json adds the per-token log-probabilities.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::app {
namespace {

struct PerplexityConfig {
  std::string model_dir;
  std::string text_file;
  std::string token_ids_file;
  std::string tokenizer_file;  // default: <model>/tokenizer.json
  std::string backend = "cpu";
  int context = 1024;
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

Result<std::vector<std::int32_t>> load_tokens(const PerplexityConfig& cfg) {
  if (!cfg.token_ids_file.empty()) return read_token_ids(cfg.token_ids_file);
  const std::string tok_path =
      cfg.tokenizer_file.empty() ? cfg.model_dir + "/tokenizer.json" : cfg.tokenizer_file;
  FERRY_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::from_file(tok_path));
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(cfg.text_file));
  FERRY_ASSIGN_OR_RETURN(auto ids,
                         tokenizer.encode(text, {.add_special_tokens = cfg.add_special_tokens}));
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

int run_perplexity(const PerplexityConfig& cfg) {
  auto tokens = load_tokens(cfg);
  if (!tokens.ok()) return fail(tokens.status());
  if (tokens->size() < 2) {
    return fail(invalid_argument("perplexity: need at least 2 tokens, got {}", tokens->size()));
  }
  auto loaded = model::load_model_f32(cfg.model_dir);
  if (!loaded.ok()) return fail(loaded.status());
  const model::LoadedModel& m = **loaded;
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    if ((*tokens)[i] >= m.geometry.vocab) {
      return fail(
          invalid_argument("perplexity: token id {} at position {} is outside the "
                           "vocabulary of {}",
                           (*tokens)[i], i, m.geometry.vocab));
    }
  }
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
  for (std::int64_t s = 0; s + 1 < n; s += ctx) {
    const std::int64_t len = std::min<std::int64_t>(ctx, n - 1 - s);
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
    nll_sum += res->loss_sum;
    counted += res->counted;
    for (std::int64_t t = 0; t < len; ++t) logprobs.push_back(-nll[t]);
  }
  const double mean = nll_sum / static_cast<double>(counted);
  if (cfg.json) {
    Json out = {{"model", cfg.model_dir},       {"tokens", n},
                {"predicted", counted},         {"mean_nll", mean},
                {"perplexity", std::exp(mean)}, {"logprobs", logprobs}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("tokens %lld  predicted %lld  mean_nll %.6f  perplexity %.4f\n",
                static_cast<long long>(n), static_cast<long long>(counted), mean, std::exp(mean));
  }
  return 0;
}

void register_perplexity(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<PerplexityConfig>();
  auto* cmd = app.add_subcommand("perplexity", "mean NLL and perplexity of a text under a model");
  cmd->add_option("--model", cfg->model_dir, "Hugging Face model folder")
      ->required()
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
  cmd->add_option("--backend", cfg->backend, "cpu or reference")
      ->check(CLI::IsMember({"cpu", "reference"}));
  cmd->add_flag("--add-special-tokens", cfg->add_special_tokens,
                "apply the tokenizer's post-processor (e.g. a BOS token)");
  cmd->add_flag("--json", cfg->json, "JSON output with per-token log-probabilities");
  cmd->callback([cfg, &run, text, ids] {
    if (text->count() == 0 && ids->count() == 0) {
      throw CLI::RequiredError("--text-file or --token-ids");
    }
    run = [cfg] { return run_perplexity(*cfg); };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_perplexity);
}  // namespace ferry::app
