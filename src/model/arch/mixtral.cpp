// SPDX-License-Identifier: Apache-2.0
// Mixtral: Llama-style attention (no biases), every layer a sparse MoE of num_local_experts
// experts of width intermediate_size. The router takes the softmax over all experts, keeps the
// top-k and always renormalises them (== softmax over the top-k logits). Hub tensor names use
// "block_sparse_moe" and w1 (gate) / w3 (up) / w2 (down); transformers 5.x calls the block "mlp".
#include "model/arch/arch.h"

namespace ferry::model::arch {

const ArchDescription& mixtral() {
  static const ArchDescription d = [] {
    ArchDescription a{};
    a.arch = Arch::kMixtral;
    a.model_type = "mixtral";
    a.hf_class = "MixtralForCausalLM";
    a.defaults = {.max_position_embeddings = 4096 * 32,
                  .rms_norm_eps = 1e-5,
                  .tie_word_embeddings = false,
                  .rope_theta = 1e6,
                  .head_dim = 0};
    a.moe = true;
    a.moe_names = {.block = "block_sparse_moe",
                   .router = "gate",
                   .expert_gate = "w1",
                   .expert_up = "w3",
                   .expert_down = "w2",
                   .fused_block = "mlp"};
    a.router_norm_from_config = false;  // always renormalised
    a.norm_topk_prob_default = true;
    return a;
  }();
  return d;
}

}  // namespace ferry::model::arch
