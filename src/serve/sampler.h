// SPDX-License-Identifier: Apache-2.0
// Token sampling from one row of logits.
//   greedy (temperature 0): argmax, lowest id on ties.
//   sampled: w_i = exp((logit_i - max) / temperature) (f64, so the most likely token has w = 1),
//   p_i = w_i / sum(w) (summed in id order). Rank the tokens by (w desc, id asc); keep the top_k
//   first (0 = all), only those with w >= min_p (min_p x the most likely token's probability),
//   and the shortest prefix whose mass (p summed in rank order) reaches top_p (at least one
//   token). Renormalise the kept set in id order and draw u ~ U[0, 1) by walking it in id order.
// Walking in id order (not rank order) lets a row with nothing cut (top_k 0, top_p 1, min_p 0:
// plain temperature sampling, the OpenAI default) be drawn without sorting the vocabulary.
// sampling_distribution() is the fast path: it ranks only as far as the cuts reach (a partial
// selection grown geometrically, then a sort of that prefix). sampling_distribution_sorted() is
// its slow twin (rank the whole row); the two give the same list bit for bit (tested), so the
// draw is the same too. The Rng lives in the request, so a seed reproduces the request's tokens
// whatever else shares the batch.
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
  float min_p = 0.0f;        // [0, 1]; 0: no cut
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

// The kept tokens and their renormalised probabilities, in ascending id. `out` is reused across
// calls (the engine keeps one), so steady-state sampling does not allocate.
void sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                           std::vector<std::pair<std::int32_t, double>>& out);

// sampling_distribution with the top_p walk's first ranked prefix given: 0 is
// sampling_distribution's own start (one bucketing pass bounds the nucleus), anything else a size
// grown x4 until the walk reaches top_p. The same result for every value; the test of the growth
// path, which the bound makes rare, gives small ones.
void sampling_distribution_from(std::span<const float> logits, const SamplingParams& p,
                                std::size_t first_ranked,
                                std::vector<std::pair<std::int32_t, double>>& out);

// The slow twin: ranks the whole row with one sort. Same result as sampling_distribution, bit for
// bit; for tests and the sampling benchmark.
void sampling_distribution_sorted(std::span<const float> logits, const SamplingParams& p,
                                  std::vector<std::pair<std::int32_t, double>>& out);

// One draw from a kept list (either function's output): u ~ U[0, 1), walked in list order.
std::int32_t draw(std::span<const std::pair<std::int32_t, double>> kept, Rng& rng);

std::int32_t sample(std::span<const float> logits, const SamplingParams& p, Rng& rng,
                    std::vector<std::pair<std::int32_t, double>>& scratch);

}  // namespace ferry::serve
