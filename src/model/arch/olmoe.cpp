// SPDX-License-Identifier: Apache-2.0
// OLMoE: every layer a sparse MoE (experts of width intermediate_size); q and k are RMS-normalised
// over the WHOLE projection (q_norm weight [H*D], k_norm weight [Hkv*D]), not per head; optional
// clip_qkv clamps q/k/v. norm_topk_prob defaults to false. Defaults: transformers OlmoeConfig.
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& olmoe() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kOlmoe;
    a.model_type = "olmoe";
    a.hf_class = "OlmoeForCausalLM";
    a.defaults = {.max_position_embeddings = 4096,
                  .rms_norm_eps = 1e-5,
                  .tie_word_embeddings = false,
                  .rope_theta = 10000.0,
                  .head_dim = 0};
    a.reads_attention_bias = true;
    a.qk_norm = QkNorm::kFullWidth;
    a.moe = true;
    a.moe_names = {.block = "mlp",
                   .router = "gate",
                   .expert_gate = "gate_proj",
                   .expert_up = "up_proj",
                   .expert_down = "down_proj",
                   .fused_block = "mlp"};
    a.router_norm_from_config = true;
    a.norm_topk_prob_default = false;
    a.reads_clip_qkv = true;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
