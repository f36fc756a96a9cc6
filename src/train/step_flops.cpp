// SPDX-License-Identifier: Apache-2.0
#include "train/step_flops.h"

#include <array>
#include <utility>

namespace ferry::train {

TokenMatmulParams token_matmul_params(const model::DecoderGeometry& g) {
  const double C = g.hidden, H = g.heads, G = g.kv_heads, D = g.head_dim, V = g.vocab;
  const double attn = C * H * D + 2.0 * C * G * D + H * D * C;
  double attn_extra = 2.0 * C;  // the two norms
  if (g.qkv_bias) attn_extra += H * D + 2.0 * G * D;
  if (g.o_bias) attn_extra += C;
  if (g.qk_norm == model::QkNorm::kPerHead) attn_extra += 2.0 * D;
  if (g.qk_norm == model::QkNorm::kFullWidth) attn_extra += H * D + G * D;
  TokenMatmulParams t;
  t.layer.resize(static_cast<std::size_t>(g.layers));
  t.layer_output.resize(static_cast<std::size_t>(g.layers));
  t.head = V * C;
  t.model_params = V * C * (g.tied_embeddings ? 1.0 : 2.0) + C;  // embed (+ lm_head), final norm
  for (int l = 0; l < g.layers; ++l) {
    const bool moe = g.layer_is_moe.empty() ? g.experts > 0 : g.layer_is_moe[std::size_t(l)];
    const double mlp = moe ? double(g.experts) * C + double(g.top_k) * 3.0 * g.expert_width * C
                           : 3.0 * double(g.mlp_width) * C;
    t.layer[std::size_t(l)] = attn + mlp;
    t.layer_output[std::size_t(l)] = moe ? 0.0 : double(g.mlp_width) * C;
    t.model_params += attn + mlp + attn_extra;
  }
  return t;
}

double attention_forward_flops(const model::DecoderGeometry& g,
                               std::span<const std::int32_t> cu_seqlens) {
  double pairs = 0;
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i) {
    const double s = cu_seqlens[i] - cu_seqlens[i - 1];
    pairs += s * (s + 1) / 2;
  }
  return 4.0 * double(g.head_dim) * double(g.heads) * pairs;
}

StepFlops micro_batch_flops(const model::DecoderGeometry& g, const TokenMatmulParams& t,
                            std::span<const std::int32_t> cu_seqlens, std::uint64_t layer_forwards,
                            std::uint64_t layer_backwards, std::uint64_t internals_forwards) {
  double layer_mean = 0, output_mean = 0;
  for (double p : t.layer) layer_mean += p;
  for (double p : t.layer_output) output_mean += p;
  if (!t.layer.empty()) layer_mean /= double(t.layer.size());
  if (!t.layer_output.empty()) output_mean /= double(t.layer_output.size());
  const double T = cu_seqlens.empty() ? 0.0 : double(cu_seqlens.back() - cu_seqlens.front());
  const double attn = attention_forward_flops(g, cu_seqlens);
  StepFlops f;
  f.model = 6.0 * t.model_params * T;
  f.hardware = double(layer_forwards) * (2.0 * layer_mean * T + attn) +
               double(layer_backwards) * (4.0 * layer_mean * T + 2.5 * attn) + 6.0 * t.head * T -
               double(internals_forwards) * 2.0 * output_mean * T;
  return f;
}

double known_peak_bf16_flops(std::string_view name) {
  // Dense bf16 tensor-core peaks with fp32 accumulation, vendors' data sheets. More specific
  // names first ("H100 PCIe" before "H100"); NVL parts and unknown devices: 0 (MFU not shown).
  static constexpr std::array<std::pair<std::string_view, double>, 9> kPeaks{{
      {"NVL", 0},
      {"H100 PCIe", 756e12},
      {"H200", 989e12},
      {"H100", 989e12},
      {"A100", 312e12},
      {"L40S", 362e12},
      {"RTX 4090", 165.2e12},
      {"RTX 3090", 71e12},
      {"A10G", 70e12},
  }};
  for (const auto& [key, peak] : kPeaks) {
    if (name.find(key) != std::string_view::npos) return peak;
  }
  return 0;
}

}  // namespace ferry::train
