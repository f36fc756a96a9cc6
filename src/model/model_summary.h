// SPDX-License-Identifier: Apache-2.0
// What `ferry inspect` prints about a model folder: architecture, parameter counts (total and,
// for MoE, active per token: all non-expert weights plus K of the E experts of each MoE layer;
// embeddings and LM head included), checkpoint bytes per dtype, per-layer sizes and the rope
// summary. Computed from ModelConfig + param_specs (no weights read) and the checkpoint header.
// Tests: tests/unit/model/model_summary_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace ferry::model {

struct LayerSummary {
  int layer = 0;
  bool moe = false;
  std::int64_t attention_params = 0;  // q/k/v/o (+ biases, q/k norms)
  std::int64_t mlp_params = 0;        // dense gate/up/down, or router + all experts
  std::int64_t expert_params = 0;     // one expert (MoE layers)
  std::int64_t norm_params = 0;       // input + post-attention layernorms
};

struct ModelSummary {
  ModelConfig config;
  std::int64_t total_params = 0;
  std::int64_t active_params = 0;     // per token; == total for dense models
  std::int64_t embedding_params = 0;  // embed (+ lm_head when untied)
  std::vector<LayerSummary> layers;
  // From the checkpoint header (empty when none was given).
  std::map<std::string, std::uint64_t> checkpoint_bytes_per_dtype;  // "bf16" -> bytes
  std::size_t checkpoint_tensors = 0;
  std::size_t checkpoint_shards = 0;
};

ModelSummary summarize(const ModelConfig& config, const Checkpoint* checkpoint);
Json to_json(const ModelSummary& s);
std::string to_text(const ModelSummary& s);
// "llama3 (theta 500000, factor 8, low 1, high 4, original 8192)"
std::string rope_summary(const kernels::RopeScaling& r);

}  // namespace ferry::model
