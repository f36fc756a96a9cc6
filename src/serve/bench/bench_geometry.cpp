// SPDX-License-Identifier: Apache-2.0
#include "serve/bench/bench_geometry.h"

#include "model/config.h"
#include "model/param_spec.h"

namespace ferry::serve::bench {

const std::vector<BenchGeometry>& bench_geometries() {
  static const std::vector<BenchGeometry> table = {
      {"qwen3-30b-a3b",
       {.vocab = 151936,
        .layers = 48,
        .hidden = 2048,
        .heads = 32,
        .kv_heads = 4,
        .head_dim = 128,
        .experts = 128,
        .top_k = 8,
        .expert_width = 768,
        .max_positions = 40960,
        .parallel_init = true},
       "Qwen3-30B-A3B geometry (the GPU target), unscaled"},
      {"qwen3-30b-a3b-2l",
       {.vocab = 18992,
        .layers = 2,
        .hidden = 2048,
        .heads = 32,
        .kv_heads = 4,
        .head_dim = 128,
        .experts = 128,
        .top_k = 8,
        .expert_width = 768,
        .max_positions = 40960},
       "Qwen3-30B-A3B layer widths unscaled (C 2048, F 768, E 128, top-8, 32x128 q, 4x128 kv: "
       "an expert is 18.9 MB in f32, 9.4 MB in bf16) on 2 of 48 layers, vocab /8 (18992); for the "
       "GPU machine: per-token expert traffic and compute are 2/48 of the target's"},
      {"qwen3-30b-a3b-mini",
       {.vocab = 18992,
        .layers = 4,
        .hidden = 256,
        .heads = 8,
        .kv_heads = 1,
        .head_dim = 64,
        .experts = 128,
        .top_k = 8,
        .expert_width = 96,
        .max_positions = 4096},
       "Qwen3-30B-A3B scaled: E=128 and top-8 kept; C, F, q/kv widths and vocab /8 (C 2048->256, "
       "F 768->96, heads 32->8 x 64, kv heads 4->1 x 64, vocab 151936->18992); layers 48->4; "
       "per-layer expert/attention bytes ratio kept; default budget = the same share of experts "
       "as 24 GiB holds on the target"},
      {"serve-builtin", {}, "ferry generate's built-in random MoE (4 layers, C 128, E 16, top-4)"},
      {"tiny",
       {.vocab = 259,
        .layers = 2,
        .hidden = 64,
        .heads = 4,
        .kv_heads = 2,
        .head_dim = 16,
        .experts = 16,
        .top_k = 4,
        .expert_width = 32,
        .max_positions = 512},
       "test geometry (2 layers, C 64, E 16, top-4)"},
  };
  return table;
}

Result<BenchGeometry> find_bench_geometry(std::string_view name) {
  std::string names;
  for (const BenchGeometry& g : bench_geometries()) {
    if (g.name == name) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  return invalid_argument("bench serve: unknown geometry '{}' (known: {})", name, names);
}

ParamBytes count_params(const model::ModelConfig& config) {
  ParamBytes p;
  for (const model::ParamSpec& ps : model::param_specs(config)) {
    const auto n = static_cast<std::size_t>(ps.numel());
    p.total += n;
    if (model::is_expert_role(ps.role)) p.experts += n;
  }
  return p;
}

Result<ParamBytes> count_params(const BuiltinMoeSpec& spec) {
  FERRY_ASSIGN_OR_RETURN(model::ModelConfig cfg,
                         model::parse_model_config_text(builtin_moe_config_json(spec), "geometry"));
  return count_params(cfg);
}

double target_expert_fraction() {
  static const double f = [] {
    const ParamBytes p = count_params(bench_geometries()[0].spec).value();
    return (double(24ull << 30) - 2.0 * double(p.dense())) / (2.0 * double(p.experts));
  }();
  return f;
}

Result<HostBytes> bench_host_bytes(const BenchGeometry& g, DType expert_dtype) {
  FERRY_ASSIGN_OR_RETURN(const ParamBytes p, count_params(g.spec));
  HostBytes h;
  h.packed = g.spec.parallel_init;
  h.f32_weights = (h.packed ? p.dense() : p.total) * sizeof(float);
  h.expert_store = p.experts * dtype_size(expert_dtype);
  return h;
}

}  // namespace ferry::serve::bench
