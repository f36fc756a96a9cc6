// SPDX-License-Identifier: Apache-2.0
#include "serve/builtin_model.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/irwin_hall.h"
#include "core/thread_pool.h"
#include "model/model_binding.h"
#include "model/param_spec.h"
#include "serve/sampler.h"

namespace ferry::serve {

std::string builtin_moe_config_json(const BuiltinMoeSpec& s) {
  return fmt::format(
      R"({{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": {}, "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {},
  "num_attention_heads": {}, "num_key_value_heads": {}, "head_dim": {},
  "max_position_embeddings": {}, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "num_experts": {}, "num_experts_per_tok": {}, "moe_intermediate_size": {},
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "rope_parameters": {{"rope_type": "default", "rope_theta": 1000000.0}}, "hidden_act": "silu"}})",
      s.vocab, s.hidden, 2 * s.expert_width, s.layers, s.heads, s.kv_heads, s.head_dim,
      s.max_positions, s.experts, s.top_k, s.expert_width);
}

namespace {

constexpr std::size_t kChunk = std::size_t(1) << 22;  // parallel_init's values per chunk

double normal(Rng& r) {  // Box-Muller
  const double u1 = 1.0 - r.uniform(), u2 = r.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// parallel_init: chunk c of parameter tensor i (canonical order) draws from Rng(chunk_seed(...)).
std::uint64_t chunk_seed(std::uint64_t seed, std::size_t tensor, std::size_t chunk) {
  return seed ^ (0x9e3779b97f4a7c15ull * (tensor + 1)) ^ (chunk << 32);
}

// parallel_init's chunks draw each value as Irwin-Hall(4) of one Rng::next(), scaled to std_dev
// (core/irwin_hall.h: drawing the 48-layer bench geometry's ~31 G values by Box-Muller took ~100-
// 120 s per process on the H200's 16 cores). The sequential stream (`normal`, small models) is
// unchanged: their weights stay as they were.
void fill_chunk(float* dst, std::size_t n, double std_dev, std::uint64_t seed) {
  Rng r(seed);
  const float scale = static_cast<float>(std_dev / std::sqrt(kIrwinHall4Variance));
  for (std::size_t k = 0; k < n; ++k) {
    dst[k] = static_cast<float>(irwin_hall4_centred(r.next())) * scale;
  }
}

// Both builders. packed: the routed experts go into a packed store of that dtype, drawn per block.
Result<std::unique_ptr<BuiltinModel>> build(const BuiltinMoeSpec& spec, std::uint64_t seed,
                                            std::optional<DType> packed, int threads) {
  auto m = std::make_unique<BuiltinModel>();
  FERRY_ASSIGN_OR_RETURN(m->config,
                         model::parse_model_config_text(builtin_moe_config_json(spec), "builtin"));
  FERRY_ASSIGN_OR_RETURN(m->geometry, model::make_geometry(m->config));
  const model::DecoderGeometry& geo = m->geometry;
  m->params.layers.resize(geo.layers);
  Rng rng(seed);
  const std::vector<model::ParamSpec> specs = model::param_specs(m->config);
  m->storage.reserve(specs.size());
  struct Chunk {
    float* data;
    std::size_t n;
    double std_dev;
    std::uint64_t seed;
  };
  std::vector<Chunk> chunks;  // parallel_init: filled after the loop
  // packed: the canonical index of each expert tensor, [L][E][gate, up, down].
  std::vector<std::size_t> expert_tensor;
  if (packed) expert_tensor.assign(std::size_t(geo.layers) * geo.experts * 3, 0);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const model::ParamSpec& ps = specs[i];
    if (packed && model::is_expert_role(ps.role)) {
      const int part = ps.role == model::ParamRole::kExpertGate ? 0
                       : ps.role == model::ParamRole::kExpertUp ? 1
                                                                : 2;
      expert_tensor[(std::size_t(ps.layer) * geo.experts + ps.expert) * 3 + part] = i;
      continue;  // bound to the store's blocks below
    }
    std::vector<float>& buf = m->storage.emplace_back(static_cast<std::size_t>(ps.numel()));
    const bool norm = model::is_norm_role(ps.role);
    const double std_dev = ps.role == model::ParamRole::kRouter ? spec.router_std : spec.init_std;
    if (norm) {
      std::fill(buf.begin(), buf.end(), 1.0f);
    } else if (!spec.parallel_init) {
      for (float& w : buf) w = static_cast<float>(std_dev * normal(rng));
    } else {
      for (std::size_t c = 0; c * kChunk < buf.size(); ++c) {
        chunks.push_back({buf.data() + c * kChunk, std::min(kChunk, buf.size() - c * kChunk),
                          std_dev, chunk_seed(seed, i, c)});
      }
    }
    ConstTensorView v =
        ps.shape.size() == 1
            ? ConstTensorView::contiguous(buf.data(), DType::kF32, Device::kCpu, {ps.shape[0]})
            : ConstTensorView::contiguous(buf.data(), DType::kF32, Device::kCpu,
                                          {ps.shape[0], ps.shape[1]});
    *model::param_slot(m->params, ps, geo) = v;
  }
  parallel_items(chunks.size(), threads, [&](std::size_t j) {
    fill_chunk(chunks[j].data, chunks[j].n, chunks[j].std_dev, chunks[j].seed);
  });
  if (!packed) return m;

  // Each block: its three tensors drawn chunk by chunk (the chunks parallel_init would draw for
  // them) and converted into place; bf16 goes through one chunk of f32 scratch per thread.
  const std::size_t mat = std::size_t(geo.expert_width) * std::size_t(geo.hidden);
  const DType dt = *packed;
  const std::size_t part_bytes = mat * dtype_size(dt);
  auto fill = [&](int l, int e, std::byte* block) {
    thread_local std::vector<float> scratch;
    if (dt != DType::kF32) scratch.resize(std::min(mat, kChunk));
    for (int part = 0; part < 3; ++part) {
      const std::size_t i = expert_tensor[(std::size_t(l) * geo.experts + e) * 3 + part];
      std::byte* dst = block + part * part_bytes;
      for (std::size_t c = 0; c * kChunk < mat; ++c) {
        const std::size_t n = std::min(kChunk, mat - c * kChunk);
        float* f = dt == DType::kF32 ? reinterpret_cast<float*>(dst) + c * kChunk : scratch.data();
        fill_chunk(f, n, spec.init_std, chunk_seed(seed, i, c));
        if (dt != DType::kF32) {
          FERRY_CHECK(convert_elements(f, DType::kF32, dst + c * kChunk * dtype_size(dt), dt, n),
                      "serve: f32 -> {} conversion", to_string(dt));
        }
      }
    }
  };
  FERRY_ASSIGN_OR_RETURN(m->experts, ExpertStore::create_filled(geo, dt, fill, threads));
  for (const model::ParamSpec& ps : specs) {
    if (!model::is_expert_role(ps.role)) continue;
    const ExpertRef r = m->experts->ref(ps.layer, ps.expert);
    const void* p = ps.role == model::ParamRole::kExpertGate ? r.gate
                    : ps.role == model::ParamRole::kExpertUp ? r.up
                                                             : r.down;
    *model::param_slot(m->params, ps, geo) =
        ConstTensorView::contiguous(p, dt, Device::kCpu, {ps.shape[0], ps.shape[1]});
  }
  return m;
}

}  // namespace

Result<std::unique_ptr<BuiltinModel>> make_builtin_moe(const BuiltinMoeSpec& spec,
                                                       std::uint64_t seed, int threads) {
  return build(spec, seed, std::nullopt, threads);
}

Result<std::unique_ptr<BuiltinModel>> make_builtin_moe_packed(const BuiltinMoeSpec& spec,
                                                              std::uint64_t seed,
                                                              DType expert_dtype, int threads) {
  if (!spec.parallel_init) {
    return invalid_argument(
        "serve: a packed built-in model draws experts per chunk: it needs parallel_init (the "
        "sequential stream cannot be split)");
  }
  if (expert_dtype != DType::kF32 && expert_dtype != DType::kBF16) {
    return invalid_argument("serve: experts can be stored in f32 or bf16, not {}",
                            to_string(expert_dtype));
  }
  return build(spec, seed, expert_dtype, threads);
}

}  // namespace ferry::serve
