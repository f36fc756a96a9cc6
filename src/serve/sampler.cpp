// SPDX-License-Identifier: Apache-2.0
#include "serve/sampler.h"

#include <algorithm>
#include <cmath>

namespace ferry::serve {

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return invalid_argument("serve: temperature must be >= 0, got {}", p.temperature);
  }
  if (p.top_k < 0) return invalid_argument("serve: top_k must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return invalid_argument("serve: top_p must be in (0, 1], got {}", p.top_p);
  }
  return ok_status();
}

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(std::uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::int32_t argmax(std::span<const float> logits) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<std::int32_t>(i);
  }
  return best;
}

void sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                           std::vector<std::pair<std::int32_t, double>>& out) {
  const std::size_t V = logits.size();
  out.resize(V);
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, double(x));
  const double inv_t = 1.0 / double(p.temperature);
  double sum = 0.0;
  for (std::size_t i = 0; i < V; ++i) {
    const double e = std::exp((double(logits[i]) - m) * inv_t);
    out[i] = {static_cast<std::int32_t>(i), e};
    sum += e;
  }
  for (auto& [id, prob] : out) prob /= sum;
  const auto by_prob = [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  std::size_t keep = V;
  if (p.top_k > 0 && std::size_t(p.top_k) < V) {
    keep = std::size_t(p.top_k);
    std::partial_sort(out.begin(), out.begin() + keep, out.end(), by_prob);
  } else {
    std::sort(out.begin(), out.end(), by_prob);
  }
  out.resize(keep);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t n = 0;
    while (n < out.size()) {
      mass += out[n].second;
      ++n;
      if (mass >= double(p.top_p)) break;
    }
    out.resize(n);
  }
  double kept = 0.0;
  for (const auto& pr : out) kept += pr.second;
  for (auto& pr : out) pr.second /= kept;
}

std::int32_t sample(std::span<const float> logits, const SamplingParams& p, Rng& rng,
                    std::vector<std::pair<std::int32_t, double>>& scratch) {
  if (p.temperature == 0.0f) return argmax(logits);
  sampling_distribution(logits, p, scratch);
  const double u = rng.uniform();
  double c = 0.0;
  for (const auto& [id, prob] : scratch) {
    c += prob;
    if (u < c) return id;
  }
  return scratch.back().first;  // u within rounding of 1
}

}  // namespace ferry::serve
