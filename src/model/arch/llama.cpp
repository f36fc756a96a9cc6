// SPDX-License-Identifier: Apache-2.0
// Llama (2, 3, 3.1, 3.2): dense SwiGLU decoder. attention_bias adds biases to q/k/v/o;
// rope scaling "llama3" for 3.1+. Defaults: transformers LlamaConfig.
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& llama() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kLlama;
    a.model_type = "llama";
    a.hf_class = "LlamaForCausalLM";
    a.defaults = {.max_position_embeddings = 2048,
                  .rms_norm_eps = 1e-6,
                  .tie_word_embeddings = false,
                  .rope_theta = 10000.0,
                  .head_dim = 0};
    a.reads_attention_bias = true;
    a.reads_mlp_bias = true;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
