// SPDX-License-Identifier: Apache-2.0
// ModelWeights loading: resolve each ParamSpec to a checkpoint tensor (or a slice of a fused
// expert tensor), check it, and hand out a zero-copy or converted view. See weights.h.
#include "model/weights.h"

#include <charconv>
#include <cstring>
#include <set>
#include <unordered_set>

#include <fmt/format.h>

#include "core/log.h"
#include "model/arch/arch.h"

namespace ferry::model {

namespace {

// Where a spec's bytes come from: a whole tensor, or rows [row0, row0 + rows) of expert `e` in a
// fused [E, R, X] tensor (transposed: [E, X, R], rows taken along the last axis).
struct Source {
  const Checkpoint::Entry* entry = nullptr;
  bool fused = false;
  bool transposed = false;
  std::int64_t expert = 0;
  std::int64_t row0 = 0;
};

std::string describe(const ParamSpec& s) {
  if (s.layer < 0) return std::string(to_string(s.role));
  if (s.expert < 0) return fmt::format("{}, layer {}", to_string(s.role), s.layer);
  return fmt::format("{}, layer {}, expert {}", to_string(s.role), s.layer, s.expert);
}

// "model.layers.<N>.<rest>" -> N (or -1) and rest.
int parse_layer(std::string_view name, std::string_view* rest) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  name.remove_prefix(kPrefix.size());
  int n = 0;
  const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec != std::errc() || p == name.data() || p == name.data() + name.size() || *p != '.') {
    return -1;
  }
  *rest = std::string_view(p + 1, name.data() + name.size() - (p + 1));
  return n;
}

}  // namespace

class WeightLoader {
 public:
  WeightLoader(ModelWeights& w, const LoadOptions& opts)
      : w_(w), opts_(opts), desc_(arch::get(w.config_.arch)) {}

  Status run() {
    w_.specs_ = param_specs(w_.config_);
    w_.views_.reserve(w_.specs_.size());
    for (const ParamSpec& s : w_.specs_) {
      FERRY_ASSIGN_OR_RETURN(const Source src, resolve(s));
      FERRY_ASSIGN_OR_RETURN(ConstTensorView v, materialize(s, src));
      w_.views_.push_back(v);
    }
    FERRY_TRY(check_extras());
    assemble();
    return {};
  }

 private:
  Result<Source> resolve(const ParamSpec& s) {
    const Checkpoint& ck = w_.checkpoint_;
    if (const Checkpoint::Entry* e = ck.find(s.hf_name)) {
      FERRY_TRY(check_tensor_shape(*e->info, s.shape, e->file->path()));
      used_.insert(s.hf_name);
      return Source{e};
    }
    const arch::MoeNames& n = desc_.moe_names;
    if (desc_.moe && n.fused_block != n.block &&
        (s.role == ParamRole::kRouter || is_expert_role(s.role))) {
      // Same per-expert names under the 5.x block name (e.g. Mixtral's "mlp").
      std::string alt = s.hf_name;
      const std::string from = fmt::format(".{}.", n.block),
                        to = fmt::format(".{}.", n.fused_block);
      if (const auto pos = alt.find(from); pos != std::string::npos) {
        alt.replace(pos, from.size(), to);
        if (const Checkpoint::Entry* e = ck.find(alt)) {
          FERRY_TRY(check_tensor_shape(*e->info, s.shape, e->file->path()));
          used_.insert(alt);
          return Source{e};
        }
      }
    }
    if (desc_.moe && is_expert_role(s.role)) {
      FERRY_ASSIGN_OR_RETURN(auto fused, resolve_fused(s));
      if (fused.entry != nullptr) return fused;
    }
    return not_found("model: tensor {} ({}) not found in checkpoint {}", s.hf_name, describe(s),
                     ck.path());
  }

  // Looks for the fused 5.x expert tensors of the spec's layer; entry == nullptr when absent.
  Result<Source> resolve_fused(const ParamSpec& s) {
    const bool down = s.role == ParamRole::kExpertDown;
    const std::string name =
        fmt::format("{}{}.experts.{}", layer_prefix(s.layer), desc_.moe_names.fused_block,
                    down ? "down_proj" : "gate_up_proj");
    const Checkpoint::Entry* e = w_.checkpoint_.find(name);
    if (e == nullptr) return Source{};
    const std::int64_t E = w_.config_.num_experts, C = w_.config_.hidden_size,
                       F = w_.config_.moe_intermediate_size;
    const std::int64_t R = down ? C : 2 * F, X = down ? F : C;  // untransposed [E, R, X]
    const std::vector<std::int64_t> plain = {E, R, X}, transposed = {E, X, R};
    Source src{e, /*fused=*/true};
    if (e->info->shape == plain) {
      src.transposed = false;
    } else if (e->info->shape == transposed) {
      src.transposed = true;
    } else {
      return invalid_argument(
          "model: tensor {}: expected shape {} (or transposed {}), found {} (in {})", name,
          shape_string(plain), shape_string(transposed), shape_string(e->info->shape),
          e->file->path());
    }
    src.expert = s.expert;
    src.row0 = s.role == ParamRole::kExpertUp ? F : 0;
    used_.insert(name);
    return src;
  }

  Result<ConstTensorView> materialize(const ParamSpec& s, const Source& src) {
    const TensorInfo& t = *src.entry->info;
    const SafetensorsFile& f = *src.entry->file;
    if (!is_float(t.dtype)) {
      return invalid_argument("model: tensor {}: expected a floating-point dtype, found {} (in {})",
                              t.name, to_string(t.dtype), f.path());
    }
    const std::size_t esize = dtype_size(t.dtype);
    const std::int64_t n = s.numel();
    const std::byte* base = f.bytes(t).data();
    TensorInfo out_info{s.hf_name, opts_.dtype, s.shape, 0, 0};

    const std::byte* src_bytes = base;
    std::unique_ptr<std::byte[]> staging;
    if (src.fused) {
      const std::int64_t R = t.shape[src.transposed ? 2 : 1], X = t.shape[src.transposed ? 1 : 2];
      const std::int64_t rows = s.shape[0];  // spec is [rows, X]
      const std::byte* expert = base + static_cast<std::size_t>(src.expert * R * X) * esize;
      if (!src.transposed) {
        src_bytes = expert + static_cast<std::size_t>(src.row0 * X) * esize;
      } else {
        // [X, R] -> rows [row0, row0 + rows) of its transpose: out[r][x] = in[x][row0 + r].
        staging.reset(new std::byte[static_cast<std::size_t>(n) * esize]);
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t x = 0; x < X; ++x) {
            std::memcpy(staging.get() + static_cast<std::size_t>(r * X + x) * esize,
                        expert + static_cast<std::size_t>(x * R + src.row0 + r) * esize, esize);
          }
        }
        src_bytes = staging.get();
      }
    }
    const bool aligned = reinterpret_cast<std::uintptr_t>(src_bytes) % esize == 0;
    if (t.dtype == opts_.dtype && aligned && !staging) {
      ++w_.zero_copy_;
      return make_view(src_bytes, out_info, f.path());
    }
    const std::size_t out_bytes = static_cast<std::size_t>(n) * dtype_size(opts_.dtype);
    if (t.dtype == opts_.dtype && staging) {
      w_.owned_.push_back(std::move(staging));
    } else {
      std::unique_ptr<std::byte[]> buf(new std::byte[out_bytes]);
      if (aligned) {
        convert_elements(src_bytes, t.dtype, buf.get(), opts_.dtype, static_cast<std::size_t>(n));
      } else {
        // Unaligned source: copy to an aligned staging buffer first, then convert.
        std::unique_ptr<std::byte[]> tmp(new std::byte[static_cast<std::size_t>(n) * esize]);
        std::memcpy(tmp.get(), src_bytes, static_cast<std::size_t>(n) * esize);
        convert_elements(tmp.get(), t.dtype, buf.get(), opts_.dtype, static_cast<std::size_t>(n));
      }
      w_.owned_.push_back(std::move(buf));
    }
    w_.owned_bytes_ += out_bytes;
    return make_view(w_.owned_.back().get(), out_info, f.path());
  }

  // Is `rest` (the part after "model.layers.N.") something a layer of another configuration
  // would hold? Those mean config.json and the weights disagree.
  static bool looks_like_layer_weight(std::string_view rest) {
    return rest.starts_with("self_attn.") || rest.starts_with("mlp.") ||
           rest.starts_with("block_sparse_moe.") || rest.ends_with("layernorm.weight");
  }

  Status check_extras() {
    std::vector<std::string> warned;
    for (const std::string& name : w_.checkpoint_.names()) {
      if (used_.count(name) != 0) continue;
      if (name.ends_with("rotary_emb.inv_freq")) continue;
      if (name == "lm_head.weight" && w_.config_.tie_word_embeddings) continue;
      std::string_view rest;
      const int layer = parse_layer(name, &rest);
      if (layer >= w_.config_.num_hidden_layers) {
        return invalid_argument(
            "model: checkpoint {} has tensor {} for layer {}, but config has num_hidden_layers {} "
            "(wrong config.json?)",
            w_.checkpoint_.path(), name, layer, w_.config_.num_hidden_layers);
      }
      if (layer >= 0 && looks_like_layer_weight(rest)) {
        return invalid_argument(
            "model: checkpoint {} has tensor {}, which a {} layer {} as configured does not have "
            "(wrong model_type or config.json?)",
            w_.checkpoint_.path(), name, w_.config_.model_type, layer);
      }
      warned.push_back(name);
    }
    if (!warned.empty()) {
      log::get("model")->warn("checkpoint={} unused_tensors={} first={}", w_.checkpoint_.path(),
                              warned.size(), warned.front());
    }
    return {};
  }

  void assemble() {
    const ModelConfig& c = w_.config_;
    w_.layers_.assign(static_cast<std::size_t>(c.num_hidden_layers), {});
    for (std::size_t i = 0; i < w_.specs_.size(); ++i) {
      const ParamSpec& s = w_.specs_[i];
      const ConstTensorView& v = w_.views_[i];
      if (s.layer < 0) {
        if (s.role == ParamRole::kEmbed) w_.embed_ = v;
        if (s.role == ParamRole::kFinalNorm) w_.final_norm_ = v;
        if (s.role == ParamRole::kLmHead) w_.lm_head_ = v;
        continue;
      }
      LayerWeights& L = w_.layers_[static_cast<std::size_t>(s.layer)];
      if (is_expert_role(s.role) && L.experts.empty()) {
        L.experts.resize(static_cast<std::size_t>(c.num_experts));
      }
      switch (s.role) {
        case ParamRole::kAttnNorm:
          L.attn_norm = v;
          break;
        case ParamRole::kQProj:
          L.q = v;
          break;
        case ParamRole::kKProj:
          L.k = v;
          break;
        case ParamRole::kVProj:
          L.v = v;
          break;
        case ParamRole::kOProj:
          L.o = v;
          break;
        case ParamRole::kQBias:
          L.q_bias = v;
          break;
        case ParamRole::kKBias:
          L.k_bias = v;
          break;
        case ParamRole::kVBias:
          L.v_bias = v;
          break;
        case ParamRole::kOBias:
          L.o_bias = v;
          break;
        case ParamRole::kQNorm:
          L.q_norm = v;
          break;
        case ParamRole::kKNorm:
          L.k_norm = v;
          break;
        case ParamRole::kMlpNorm:
          L.mlp_norm = v;
          break;
        case ParamRole::kGate:
          L.gate = v;
          break;
        case ParamRole::kUp:
          L.up = v;
          break;
        case ParamRole::kDown:
          L.down = v;
          break;
        case ParamRole::kRouter:
          L.router = v;
          break;
        case ParamRole::kExpertGate:
          L.experts[static_cast<std::size_t>(s.expert)].gate = v;
          break;
        case ParamRole::kExpertUp:
          L.experts[static_cast<std::size_t>(s.expert)].up = v;
          break;
        case ParamRole::kExpertDown:
          L.experts[static_cast<std::size_t>(s.expert)].down = v;
          break;
        case ParamRole::kEmbed:
        case ParamRole::kFinalNorm:
        case ParamRole::kLmHead:
          FERRY_CHECK(false, "model: global role {} with layer {}", to_string(s.role), s.layer);
      }
    }
    if (c.tie_word_embeddings) w_.lm_head_ = w_.embed_;
  }

  ModelWeights& w_;
  const LoadOptions& opts_;
  const arch::ArchDescription& desc_;
  std::unordered_set<std::string> used_;
};

Result<ModelWeights> ModelWeights::load(ModelConfig config, Checkpoint checkpoint,
                                        const LoadOptions& opts) {
  if (!is_float(opts.dtype)) {
    return invalid_argument("model: load dtype must be floating point, got {}",
                            to_string(opts.dtype));
  }
  ModelWeights w;
  w.config_ = std::move(config);
  w.checkpoint_ = std::move(checkpoint);
  WeightLoader loader(w, opts);
  FERRY_TRY(loader.run());
  return w;
}

Result<ModelWeights> ModelWeights::load(const std::string& dir, const LoadOptions& opts) {
  FERRY_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  FERRY_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open(dir));
  return load(std::move(config), std::move(ck), opts);
}

}  // namespace ferry::model
