// SPDX-License-Identifier: Apache-2.0
// Qwen2 / Qwen2.5: dense SwiGLU decoder whose q/k/v projections always carry a bias (o_proj
// never does). Defaults: transformers Qwen2Config (the small Qwen2.5 checkpoints set
// tie_word_embeddings true explicitly).
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& qwen2() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kQwen2;
    a.model_type = "qwen2";
    a.hf_class = "Qwen2ForCausalLM";
    a.defaults = {.max_position_embeddings = 32768,
                  .rms_norm_eps = 1e-6,
                  .tie_word_embeddings = false,
                  .rope_theta = 10000.0,
                  .head_dim = 0};
    a.qkv_bias_always = true;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
