// SPDX-License-Identifier: Apache-2.0
// The embedded default of `ferry train`: a tiny Qwen3-architecture model and a byte-level
// tokenizer that need no download. The tokenizer is a real tokenizer.json (256 byte tokens in
// GPT-2's byte-to-unicode spelling, no merges, Qwen2's pre-tokenizer, plus <|endoftext|>,
// <|im_start|>, <|im_end|>) and loads through model::Tokenizer like any Hugging Face one; the
// model is written as a Hugging Face folder (config.json + model.safetensors + tokenizer files)
// so the trainer loads it through the same path as a user's model.
// Init: every weight ~ N(0, init_std^2) drawn from a seeded Rng in canonical parameter order
// (model/param_spec.h); RMSNorm weights (incl. q/k norms) are 1.
// Tests: tests/unit/train/builtin_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/param_spec.h"
#include "train/rng.h"

namespace ferry::train {

// Token ids of the built-in tokenizer's special tokens (bytes are 0..255).
inline constexpr int kBuiltinEndOfText = 256;
inline constexpr int kBuiltinImStart = 257;
inline constexpr int kBuiltinImEnd = 258;
inline constexpr int kBuiltinVocab = 259;

struct BuiltinModelSpec {
  int layers = 4;
  int hidden = 128;        // C
  int heads = 4;           // H
  int kv_heads = 2;        // G
  int head_dim = 32;       // D
  int intermediate = 384;  // F
  int max_positions = 512;
  double init_std = 0.02;
  // The embedding rows. A bench model may take a real model's vocabulary (its embedding, lm_head
  // and loss cost what that model's do) with token ids drawn at random: only the built-in
  // tokenizer's 259 ids have a spelling.
  int vocab = kBuiltinVocab;
  bool tie_embeddings = true;  // lm_head is the embedding (Qwen2.5 <= 3B), or its own matrix
  // "qwen3" (q/k rms_norm, no biases: the embedded default) or "qwen2" (q/k/v biases, no q/k
  // norm: the architecture of the Qwen2.5 models `ferry bench train --arch qwen2` compares with
  // HF's Qwen2 in PyTorch).
  std::string model_type = "qwen3";
};

// Whether `model_type` is one builtin_config_json writes.
bool known_builtin_model_type(const std::string& model_type);

std::string builtin_tokenizer_json();
// tokenizer_config.json carrying the ChatML chat template and the special tokens.
std::string builtin_tokenizer_config_json();
std::string builtin_config_json(const BuiltinModelSpec& spec);

// Writes config.json, model.safetensors (seeded init), tokenizer.json and tokenizer_config.json
// into `dir` (created if missing). Models of up to kSequentialInitParams parameters draw every
// value from one seeded stream, in parameter order (the embedded default and every test model);
// larger ones (`ferry bench train` at 3B/7B shapes: one stream would take ~25 ns x 7.6e9) fill
// each tensor in fixed chunks, chunk c of tensor i from its own stream seeded by (seed, i, c),
// in parallel: the same bits for any thread count (fill_normal_chunked), each value Irwin-Hall(4)
// of one draw (core/irwin_hall.h: approximately normal, ~8x cheaper than Box-Muller).
Status write_builtin_model(const std::string& dir, const BuiltinModelSpec& spec,
                           std::uint64_t seed);

inline constexpr std::int64_t kSequentialInitParams = std::int64_t{1} << 26;
inline constexpr std::int64_t kInitChunk = std::int64_t{1} << 20;  // values per chunk stream

// The built-in init of each parameter's values, as write_builtin_model draws them: norms 1, the
// rest N(0, init_std^2) from the streams described above. fill(i, out) writes parameter i
// (specs order); calls must come for i = 0, 1, 2, ... in order (small models share one stream
// across parameters). `ferry bench train` fills its host arena through this directly, without a
// safetensors file in between (the same bits).
class BuiltinInit {
 public:
  BuiltinInit(const BuiltinModelSpec& spec, std::uint64_t seed,
              const std::vector<model::ParamSpec>& specs);
  void fill(std::size_t i, float* out);

 private:
  double std_;
  std::uint64_t seed_;
  const std::vector<model::ParamSpec>& specs_;
  bool chunked_ = false;
  Rng rng_;
  std::size_t next_ = 0;
};

// out[k] ~ std * N(0, 1) for chunk-seeded streams: out[c * kInitChunk + j] is the j-th
// next_u64() of Rng(mix_seed(stream_seed, c)) as Irwin-Hall(4) scaled to std (core/irwin_hall.h).
// Runs on ThreadPool::global().
void fill_normal_chunked(float* out, std::int64_t n, double std, std::uint64_t stream_seed);

}  // namespace ferry::train
