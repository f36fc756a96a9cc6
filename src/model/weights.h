// SPDX-License-Identifier: Apache-2.0
// ModelWeights: every ParamSpec of a model resolved to a ConstTensorView.
//   - zero-copy from the checkpoint's mmap when the file dtype is the requested one and the data
//     is aligned to its element size;
//   - otherwise converted (e.g. bf16 -> f32) into an owned host buffer.
// Checks: every spec present (kNotFound names the tensor, its layer and the checkpoint), shape
// equal (kInvalidArgument "expected shape [...], found [...]"), floating-point dtype.
// MoE experts are accepted in the hub form (one tensor per expert, names from arch/*.cpp) and in
// the transformers 5.x fused form ("mlp.experts.gate_up_proj" [E, 2F, C], gate rows first, and
// "mlp.experts.down_proj" [E, C, F]); fused tensors stored transposed ([E, C, 2F] / [E, F, C])
// are copied transposed. When C == 2F (or C == F) the two layouts cannot be told apart and the
// untransposed 5.x layout is assumed.
// Extra checkpoint tensors: rotary inv_freq and a tied model's lm_head are ignored; per-layer
// tensors the architecture does not have (q_norm on Llama, experts on a dense layer, layer index
// >= num_hidden_layers, ...) mean config and weights disagree -> kInvalidArgument; anything else
// is logged as a warning.
// Ownership: views point into the Checkpoint's mappings or into buffers owned by this object; they
// stay valid while the ModelWeights lives (moving it keeps them valid).
// Tests: tests/unit/model/weights_test.cpp (incl. the transformers fixtures in tests/data/models).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/param_spec.h"

namespace ferry::model {

struct LoadOptions {
  DType dtype = DType::kF32;  // every weight is handed out in this dtype
};

struct ExpertWeights {
  ConstTensorView gate;  // [Fe, C]
  ConstTensorView up;    // [Fe, C]
  ConstTensorView down;  // [C, Fe]
};

// Views of one decoder layer; absent weights are empty views (data == nullptr).
struct LayerWeights {
  ConstTensorView attn_norm;               // [C]
  ConstTensorView q, k, v;                 // [H*D, C], [Hkv*D, C], [Hkv*D, C]
  ConstTensorView q_bias, k_bias, v_bias;  // [H*D], [Hkv*D], [Hkv*D]
  ConstTensorView q_norm, k_norm;          // [D] (per head) or [H*D]/[Hkv*D] (OLMoE)
  ConstTensorView o;                       // [C, H*D]
  ConstTensorView o_bias;                  // [C]
  ConstTensorView mlp_norm;                // [C]
  ConstTensorView gate, up, down;          // dense: [F, C], [F, C], [C, F]
  ConstTensorView router;                  // MoE: [E, C]
  std::vector<ExpertWeights> experts;      // MoE: E entries
  bool is_moe() const { return !experts.empty(); }
};

class ModelWeights {
 public:
  // Reads <dir>/config.json and the checkpoint in <dir>.
  static Result<ModelWeights> load(const std::string& dir, const LoadOptions& opts = {});
  static Result<ModelWeights> load(ModelConfig config, Checkpoint checkpoint,
                                   const LoadOptions& opts = {});

  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<ConstTensorView>& views() const { return views_; }  // parallel to specs()

  const ConstTensorView& embed() const { return embed_; }            // [V, C]
  const ConstTensorView& final_norm() const { return final_norm_; }  // [C]
  const ConstTensorView& lm_head() const { return lm_head_; }        // [V, C]; embed if tied
  const LayerWeights& layer(int l) const { return layers_.at(static_cast<std::size_t>(l)); }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  std::size_t zero_copy_tensors() const { return zero_copy_; }  // views straight into the mmap
  std::size_t owned_bytes() const { return owned_bytes_; }      // converted/copied bytes

 private:
  friend class WeightLoader;

  ModelConfig config_;
  Checkpoint checkpoint_;
  std::vector<ParamSpec> specs_;
  std::vector<ConstTensorView> views_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
  ConstTensorView embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::size_t zero_copy_ = 0;
  std::size_t owned_bytes_ = 0;
};

}  // namespace ferry::model
