// SPDX-License-Identifier: Apache-2.0
// Token sampling from one row of logits.
//   greedy (temperature 0): argmax, lowest id on ties.
//   sampled: p = softmax(logits / temperature) (f64); keep the top_k most likely (0 = all; ties
//   by lower id); then the smallest prefix, in descending probability, whose mass reaches top_p
//   (at least one token); renormalise; draw u ~ U[0, 1) and walk the kept tokens in that order.
// sampling_distribution() exposes the kept (id, prob) list so tests can check it against a plain
// reference; sample() is that list plus one draw. The Rng lives in the request, so a seed
// reproduces the request's tokens whatever else shares the batch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"
#include "serve/logit_penalties.h"

namespace ferry::serve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // (0, 1]
  // Seeds the request's Rng. Unset: the engine derives one from its own seed and the request
  // id (distinct per request, reproducible per engine run).
  std::optional<std::uint64_t> seed;
  // Applied to the row before any of the above (logit_penalties.h); the engine keeps the raw row
  // for logprobs.
  PenaltyParams penalties;
};

Status validate(const SamplingParams& p);

// xoshiro256** seeded through splitmix64: small, fast, and the same stream on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0);
  std::uint64_t next();
  double uniform();  // [0, 1), 53 bits

 private:
  std::uint64_t s_[4];
};

std::int32_t argmax(std::span<const float> logits);

// The kept tokens and their renormalised probabilities, in descending probability (ties by id).
// `out` is reused across calls (the engine keeps one), so steady-state sampling does not allocate.
void sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                           std::vector<std::pair<std::int32_t, double>>& out);

std::int32_t sample(std::span<const float> logits, const SamplingParams& p, Rng& rng,
                    std::vector<std::pair<std::int32_t, double>>& scratch);

}  // namespace ferry::serve
