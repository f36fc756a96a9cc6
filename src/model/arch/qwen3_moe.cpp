// SPDX-License-Identifier: Apache-2.0
// Qwen3-MoE: Qwen3 attention (per-head q/k norm) with sparse MoE MLPs on the layers selected by
// decoder_sparse_step / mlp_only_layers (the others are dense MLPs of intermediate_size). Experts
// have width moe_intermediate_size; top-k weights are renormalised iff norm_topk_prob (default
// false). transformers 5.x writes the expert count as "num_local_experts", 4.x as "num_experts".
// head_dim has no class default: hidden_size / num_attention_heads unless config.json sets it.
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& qwen3_moe() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kQwen3Moe;
    a.model_type = "qwen3_moe";
    a.hf_class = "Qwen3MoeForCausalLM";
    a.defaults = {.max_position_embeddings = 32768,
                  .rms_norm_eps = 1e-6,
                  .tie_word_embeddings = false,
                  .rope_theta = 10000.0,
                  .head_dim = 0};
    a.reads_attention_bias = true;
    a.qk_norm = QkNorm::kPerHead;
    a.moe = true;
    a.moe_names = {.block = "mlp",
                   .router = "gate",
                   .expert_gate = "gate_proj",
                   .expert_up = "up_proj",
                   .expert_down = "down_proj",
                   .fused_block = "mlp"};
    a.router_norm_from_config = true;
    a.norm_topk_prob_default = false;
    a.expert_width_is_moe_intermediate = true;
    a.reads_sparse_step = true;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
