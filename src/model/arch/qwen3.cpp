// SPDX-License-Identifier: Apache-2.0
// Qwen3: dense SwiGLU decoder with an RMSNorm over each head of q and k (weights [D]) and an
// explicit head_dim (transformers' Qwen3Config default is 128, independent of hidden_size).
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& qwen3() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kQwen3;
    a.model_type = "qwen3";
    a.hf_class = "Qwen3ForCausalLM";
    a.defaults = {.max_position_embeddings = 32768,
                  .rms_norm_eps = 1e-6,
                  .tie_word_embeddings = false,
                  .rope_theta = 10000.0,
                  .head_dim = 128};
    a.reads_attention_bias = true;
    a.qk_norm = QkNorm::kPerHead;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
