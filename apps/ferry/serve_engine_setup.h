// SPDX-License-Identifier: Apache-2.0
// The serving engine's command-line setup shared by `ferry generate`, `serve` and `perplexity`: the
// model it runs (a Hugging Face folder, or the built-in random-weight MoE with `ferry train`'s
// byte-level tokenizer when no folder is given) and the engine flags (--mode, the pager's size and
// policy, miss placement, the KV pool, --device and the decode-step switches), turned into an
// EngineConfig. `ferry serve` adds flags of its own (MV-WSA, admission, the prefix cache,
// --max-running) in cmd_serve.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/ferry/miss_placement_flags.h"
#include "apps/ferry/serve_device_flag.h"
#include "core/result.h"
#include "model/model_binding.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/builtin_model.h"
#include "serve/serve_config.h"

namespace ferry::app {

// The model the engine runs; owns its weights (and the tokenizer, when the folder has one).
struct ServingModel {
  std::unique_ptr<model::LoadedModel> loaded;
  std::unique_ptr<serve::BuiltinModel> builtin;
  std::optional<model::Tokenizer> tokenizer;
  const model::DecoderGeometry& geometry() const {
    return loaded ? loaded->geometry : builtin->geometry;
  }
  const model::ModelParams& params() const { return loaded ? loaded->params : builtin->params; }
  const model::ModelConfig& config() const { return loaded ? loaded->config : builtin->config; }
};

// model_dir empty: the built-in MoE.
Result<ServingModel> load_serving_model(const std::string& model_dir);

struct EngineFlags {
  std::string mode = "resident";
  int expert_slots = 0;
  std::vector<int> layer_slots;  // per MoE layer, in layer order
  double expert_budget_mib = 0;
  std::string policy = "lru";
  MissPlacementFlags miss;        // paged: per-miss copy vs host compute
  std::string cpu_expert_kernel;  // --cpu-expert-kernel ("": the engine's default)
  int max_batch_tokens = 64;
  double kv_budget_mib = 64;
  double device_budget_mib = 0;
  int kv_block_tokens = 16;
  std::string device = "cpu";
  ServeStepSwitches step;  // --no-cuda-graphs, --no-device-resolve
};

// Registers the flags on `cmd`; returns the --kv-budget-mib option (a command may size the pool
// itself when it was not given). miss_link_flag false: the command registers its own --link-gbps
// (ferry serve's, shared by MV-WSA and the miss cost model).
CLI::Option* add_engine_flags(CLI::App* cmd, EngineFlags& f, bool miss_link_flag = true);

// The EngineConfig the flags describe (max_running 1, max_seq_len unset: the caller's).
// `command` names the command in errors.
Result<serve::EngineConfig> engine_config(const EngineFlags& f, const model::DecoderGeometry& geo,
                                          std::string_view command);

}  // namespace ferry::app
