// SPDX-License-Identifier: Apache-2.0
// The embedded default of `ferry generate` (and later `ferry serve`): a small random-weight MoE in
// the Qwen3-MoE architecture (per-head q/k RMSNorm, softmax -> top-k -> renormalise routing),
// built in memory from a seed, so the engine and the pager run on a CPU-only machine with no
// download. Its vocabulary is 259 = 256 bytes + 3 specials, the size of `ferry train`'s built-in
// byte-level tokenizer, which the CLI uses to turn text into ids.
// Init: weights ~ N(0, init_std^2) in canonical parameter order (model/param_spec.h) from
// serve::Rng(seed); RMSNorm weights are 1; the router gets router_std so routing is spread.
// parallel_init (benchmarks of full-width geometries, ~1e9 values): each tensor is drawn in chunks
// of 2^22 values, chunk c of tensor i from its own Rng(seed, i, c), on all hardware threads --
// the same values for any thread count, but not the sequential stream's values nor its
// distribution: a chunk draws Irwin-Hall(4) values (four 16-bit uniforms summed, scaled to
// init_std; approximately normal, bounded at 3.46 sigma), ~8x cheaper than Box-Muller.
// make_builtin_moe_packed (parallel_init only): the same values, but the routed experts are drawn
// one expert tensor at a time in f32 scratch and written straight into a packed host ExpertStore
// in the engine's expert dtype (bf16: rounded to nearest even, ExpertStore::create's conversion),
// so all experts never exist in f32: Qwen3-30B-A3B's 29e9 expert values take 58 GB in bf16
// instead of 116 GB of f32 plus the store. Tests: tests/unit/serve/packed_builtin_test.cpp (the
// packed store equals ExpertStore::create over make_builtin_moe's f32 model, for any thread
// count; dense weights equal).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "model/config.h"
#include "model/model_compute.h"
#include "serve/expert_store.h"

namespace ferry::serve {

struct BuiltinMoeSpec {
  int vocab = 259;
  int layers = 4;
  int hidden = 128;       // C
  int heads = 4;          // H
  int kv_heads = 2;       // G
  int head_dim = 32;      // D
  int experts = 16;       // E
  int top_k = 4;          // K
  int expert_width = 64;  // F of each expert
  int max_positions = 512;
  double init_std = 0.05;
  double router_std = 0.5;
  bool parallel_init = false;
};

struct BuiltinModel {
  model::ModelConfig config;
  model::DecoderGeometry geometry;
  model::ModelParams params;  // views into storage (and, packed, into experts' blocks)
  std::vector<std::vector<float>> storage;  // f32 tensors (packed: the dense ones only)
  // make_builtin_moe_packed: every routed expert, in its dtype; params' expert views point into
  // its blocks (gate, up, down of block(l, e)). Pass it to the engine as PagerConfig::host_store
  // so no engine packs a second copy. Null from make_builtin_moe.
  std::unique_ptr<ExpertStore> experts;
};

std::string builtin_moe_config_json(const BuiltinMoeSpec& spec);
// threads: parallel_init's thread count (0: hardware concurrency); the values do not depend on it.
Result<std::unique_ptr<BuiltinModel>> make_builtin_moe(const BuiltinMoeSpec& spec,
                                                       std::uint64_t seed, int threads = 0);
// Routed experts straight into a packed store of `expert_dtype` (kF32 or kBF16), dense weights
// f32 (see the file comment). invalid_argument unless spec.parallel_init. Host bytes: dense
// params * 4 + expert params * dtype_size(expert_dtype), plus one chunk of f32 scratch per thread.
Result<std::unique_ptr<BuiltinModel>> make_builtin_moe_packed(const BuiltinMoeSpec& spec,
                                                              std::uint64_t seed,
                                                              DType expert_dtype, int threads = 0);

}  // namespace ferry::serve
