// SPDX-License-Identifier: Apache-2.0
// Rotary-embedding frequency tables from a model's rope configuration, matching Hugging Face's
// rope initialisation functions: default, linear, dynamic (NTK), yarn and llama3 scaling.
// The table feeds RopeArgs::inv_freq and RopeArgs::attention_scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"

namespace ferry::kernels {

enum class RopeType : std::uint8_t { kDefault, kLinear, kDynamic, kYarn, kLlama3 };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // rotary dims R = head_dim * factor (rounded down, even)
  double factor = 1.0;                 // linear / dynamic / yarn / llama3
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  std::int64_t original_max_position_embeddings = 0;  // llama3 / yarn / dynamic
  double beta_fast = 32.0, beta_slow = 1.0;           // yarn
  double attention_factor = 0.0;              // yarn: 0 -> derived from factor (0.1 ln(factor) + 1)
  double mscale = 0.0, mscale_all_dim = 0.0;  // yarn (DeepSeek-style), 0 = unset
  bool truncate = true;                       // yarn
};

struct RopeTable {
  std::vector<float> inv_freq;  // [R/2]
  float attention_scaling = 1.0f;
  int rotary_dims = 0;  // R
};

// head_dim: D. max_position_embeddings: the config's, used by dynamic scaling's seq-len rule
// (dynamic scaling is applied for the given seq_len; pass 0 to use the unscaled table).
Result<RopeTable> make_rope_table(const RopeScaling& rope, int head_dim,
                                  std::int64_t max_position_embeddings = 0,
                                  std::int64_t seq_len = 0);

}  // namespace ferry::kernels
