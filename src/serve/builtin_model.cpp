// SPDX-License-Identifier: Apache-2.0
#include "serve/builtin_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include <fmt/format.h>

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

Result<std::unique_ptr<BuiltinModel>> make_builtin_moe(const BuiltinMoeSpec& spec,
                                                       std::uint64_t seed) {
  auto m = std::make_unique<BuiltinModel>();
  FERRY_ASSIGN_OR_RETURN(m->config,
                         model::parse_model_config_text(builtin_moe_config_json(spec), "builtin"));
  FERRY_ASSIGN_OR_RETURN(m->geometry, model::make_geometry(m->config));
  m->params.layers.resize(m->geometry.layers);
  Rng rng(seed);
  auto normal = [](Rng& r) {  // Box-Muller
    const double u1 = 1.0 - r.uniform(), u2 = r.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  };
  const std::vector<model::ParamSpec> specs = model::param_specs(m->config);
  m->storage.reserve(specs.size());
  struct Chunk {
    float* data;
    std::size_t n;
    double std_dev;
    std::uint64_t seed;
  };
  std::vector<Chunk> chunks;  // parallel_init: filled after the loop
  constexpr std::size_t kChunk = std::size_t(1) << 22;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const model::ParamSpec& ps = specs[i];
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
                          std_dev, seed ^ (0x9e3779b97f4a7c15ull * (i + 1)) ^ (c << 32)});
      }
    }
    ConstTensorView v =
        ps.shape.size() == 1
            ? ConstTensorView::contiguous(buf.data(), DType::kF32, Device::kCpu, {ps.shape[0]})
            : ConstTensorView::contiguous(buf.data(), DType::kF32, Device::kCpu,
                                          {ps.shape[0], ps.shape[1]});
    *model::param_slot(m->params, ps, m->geometry) = v;
  }
  if (!chunks.empty()) {
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t j; (j = next.fetch_add(1)) < chunks.size();) {
        Rng r(chunks[j].seed);
        for (std::size_t k = 0; k < chunks[j].n; ++k) {
          chunks[j].data[k] = static_cast<float>(chunks[j].std_dev * normal(r));
        }
      }
    };
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < n; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }
  return m;
}

}  // namespace ferry::serve
