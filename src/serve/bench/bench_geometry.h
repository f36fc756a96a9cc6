// SPDX-License-Identifier: Apache-2.0
// Built-in model geometries of `ferry bench serve`: random-weight Qwen3-MoE models built from a
// seed (serve/builtin_model.h), never downloaded.
//   qwen3-30b-a3b       the benchmark geometry (48 layers, C 2048, 128 experts, top-8,
//                       expert width 768, vocab 151936); for the GPU machine with --expert-dtype
//                       bf16: its experts are drawn straight into the packed bf16 host store
//                       (parallel_init, make_builtin_moe_packed), ~60 GiB of host memory in all;
//                       with f32 experts it needs ~114 GiB and is refused on a 128 GiB host.
//   qwen3-30b-a3b-2l    the target's layer widths unscaled on 2 layers, vocab / 8: real expert
//                       sizes (18.9 MB f32) for the GPU machine; ~10 GiB of host memory.
//   qwen3-30b-a3b-mini  the same E = 128, K = 8 and the same ratios between widths (F/C = 0.375,
//                       q width 2C, kv width C/4, heads/kv-heads 8), every width / 8, vocab / 8,
//                       4 layers instead of 48: per-layer expert bytes / per-layer attention bytes
//                       is the full model's, and the default budget gives the same share of
//                       experts slots as 24 GiB does on Qwen3-30B-A3B bf16.
//   serve-builtin       `ferry generate`'s built-in model (4 layers, C 128, 16 experts, top-4)
//   tiny                2 layers, C 64, 16 experts, top-4 (tests)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "model/config.h"
#include "serve/builtin_model.h"

namespace ferry::serve::bench {

struct BenchGeometry {
  std::string name;
  BuiltinMoeSpec spec;
  std::string scaling;  // how it relates to the target geometry (printed and in the JSON)
};

const std::vector<BenchGeometry>& bench_geometries();
Result<BenchGeometry> find_bench_geometry(std::string_view name);

// Parameter counts of a geometry (no weights are built).
struct ParamBytes {
  std::size_t total = 0, experts = 0;  // elements
  std::size_t dense() const { return total - experts; }
};
Result<ParamBytes> count_params(const BuiltinMoeSpec& spec);
ParamBytes count_params(const model::ModelConfig& config);

// The budget on its model: the share of Qwen3-30B-A3B's bf16 expert bytes that 24 GiB
// holds after its bf16 dense (non-expert) weights. A geometry's default budget is its dense bytes
// + the KV pool + this share of its own expert bytes (in the engine's dtype), so a scaled
// geometry keeps the target's slots per layer / E.
double target_expert_fraction();

// The host memory bench serve's model takes for geometry g with experts in expert_dtype:
//   packed (g.spec.parallel_init: make_builtin_moe_packed): the dense weights in f32 + every
//     expert once in expert_dtype, the one store every engine of the run reads;
//   else (make_builtin_moe): every weight in f32 + one engine's packed store of the experts
//     (each mode's engine packs its own, one engine at a time).
// Not counted (< 1 GiB): the engines' activations, logits and upload staging (256 MiB), and one
// chunk of f32 scratch per generating thread (16 MiB at most).
struct HostBytes {
  bool packed = false;
  std::size_t f32_weights = 0;  // dense only when packed
  std::size_t expert_store = 0;
  std::size_t total() const { return f32_weights + expert_store; }
};
Result<HostBytes> bench_host_bytes(const BenchGeometry& g, DType expert_dtype);

}  // namespace ferry::serve::bench
