// SPDX-License-Identifier: Apache-2.0
// The embedded default of `ferry generate` (and later `ferry serve`): a small random-weight MoE in
// the Qwen3-MoE architecture (per-head q/k RMSNorm, softmax -> top-k -> renormalise routing),
// built in memory from a seed, so the engine and the pager run on a CPU-only machine with no
// download. Its vocabulary is 259 = 256 bytes + 3 specials, the size of `ferry train`'s built-in
// byte-level tokenizer, which the CLI uses to turn text into ids.
// Init: weights ~ N(0, init_std^2) in canonical parameter order (model/param_spec.h) from
// serve::Rng(seed); RMSNorm weights are 1; the router gets router_std so routing is spread.
// parallel_init (benchmarks of full-width geometries, ~1e9 values): each tensor is drawn in chunks
// of 2^22 values, chunk c of tensor i from its own Rng(seed, i, c), on all hardware threads --
// the same values for any thread count, but not the sequential stream's values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/config.h"
#include "model/model_compute.h"

namespace ferry::serve {

struct BuiltinMoeSpec {
  int vocab = 259;
  int layers = 4;
  int hidden = 128;       // C
  int heads = 4;          // H
  int kv_heads = 2;       // G
  int head_dim = 32;      // D
  int experts = 16;       // E
  int top_k = 4;          // K
  int expert_width = 64;  // F of each expert
  int max_positions = 512;
  double init_std = 0.05;
  double router_std = 0.5;
  bool parallel_init = false;
};

struct BuiltinModel {
  model::ModelConfig config;
  model::DecoderGeometry geometry;
  model::ModelParams params;  // views into storage
  std::vector<std::vector<float>> storage;
};

std::string builtin_moe_config_json(const BuiltinMoeSpec& spec);
Result<std::unique_ptr<BuiltinModel>> make_builtin_moe(const BuiltinMoeSpec& spec,
                                                       std::uint64_t seed);

}  // namespace ferry::serve
