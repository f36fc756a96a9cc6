// SPDX-License-Identifier: Apache-2.0
// `ferry inspect MODEL_DIR [--json] [--check]`: architecture, parameter counts (total and active
// per token for MoE), checkpoint bytes per dtype, per-layer sizes, tied embeddings, rope summary.
// --check also resolves and validates every weight (presence, shape, dtype) without converting.
#include <cstdio>
#include <string>

#include "apps/ferry/commands.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/model_summary.h"
#include "model/param_spec.h"
#include "model/weights.h"

namespace ferry::app {
namespace {

struct InspectConfig {
  std::string model_dir;
  bool json = false;
  bool check = false;
};

InspectConfig& inspect_config() {
  static InspectConfig c;
  return c;
}

int run_inspect() {
  const InspectConfig& cfg = inspect_config();
  auto config = model::load_model_config(cfg.model_dir);
  if (!config.ok()) return fail(config.status());
  auto ck = model::Checkpoint::open(cfg.model_dir);
  if (!ck.ok()) return fail(ck.status());
  const model::ModelSummary s = model::summarize(*config, &*ck);
  if (cfg.check) {
    // Keep the checkpoint's dtype for the float kind it has, so nothing is converted when the
    // whole checkpoint shares one dtype (the common case).
    model::LoadOptions opts;
    if (s.checkpoint_bytes_per_dtype.size() == 1) {
      const std::string& dt = s.checkpoint_bytes_per_dtype.begin()->first;
      if (dt == "bf16") opts.dtype = DType::kBF16;
      if (dt == "f16") opts.dtype = DType::kF16;
    }
    auto w = model::ModelWeights::load(std::move(config).value(), std::move(ck).value(), opts);
    if (!w.ok()) return fail(w.status());
  }
  if (cfg.json) {
    Json j = model::to_json(s);
    if (cfg.check) j["weights_checked"] = true;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", model::to_text(s).c_str());
    if (cfg.check) {
      std::printf("weights: all %zu tensors present with expected shapes and float dtypes\n",
                  model::param_specs(s.config).size());
    }
  }
  return 0;
}

void register_inspect(CLI::App& app, CommandFn& run) {
  auto* cmd = app.add_subcommand("inspect", "summarise a Hugging Face model folder");
  InspectConfig& c = inspect_config();
  cmd->add_option("model_dir", c.model_dir, "folder with config.json and *.safetensors")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--json", c.json, "print JSON instead of text");
  cmd->add_flag("--check", c.check, "also validate every weight tensor (presence, shape, dtype)");
  cmd->callback([&run] { run = run_inspect; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_inspect);
}  // namespace ferry::app
