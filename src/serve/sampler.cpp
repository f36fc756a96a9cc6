// SPDX-License-Identifier: Apache-2.0
#include "serve/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>

namespace ferry::serve {

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return invalid_argument("serve: temperature must be >= 0, got {}", p.temperature);
  }
  if (p.top_k < 0) return invalid_argument("serve: top_k must be >= 0, got {}", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return invalid_argument("serve: top_p must be in (0, 1], got {}", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return invalid_argument("serve: min_p must be in [0, 1], got {}", p.min_p);
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
  // Two passes: the max (a branch-free reduction the compiler vectorises), then its first index.
  // A NaN never compares greater, so it is skipped; a NaN first element gives 0, as the one-pass
  // scan this replaced did (find finds no NaN).
  if (logits.empty()) return 0;
  float m = logits[0];
  for (const float x : logits) m = x > m ? x : m;
  const auto it = std::find(logits.begin(), logits.end(), m);
  return it == logits.end() ? 0 : static_cast<std::int32_t>(it - logits.begin());
}

namespace {

using Kept = std::vector<std::pair<std::int32_t, double>>;

// The tokens' weights w_i = exp((logit_i - max) / T) into `out` as (id, w) in id order; returns
// their sum, taken in id order (both twins share this, so their probabilities are the same bits).
double weights(std::span<const float> logits, float temperature, Kept& out) {
  const std::size_t V = logits.size();
  out.resize(V);
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, double(x));
  const double inv_t = 1.0 / double(temperature);
  double sum = 0.0;
  for (std::size_t i = 0; i < V; ++i) {
    const double e = std::exp((double(logits[i]) - m) * inv_t);
    out[i] = {static_cast<std::int32_t>(i), e};
    sum += e;
  }
  return sum;
}

// Rank order: larger weight first, the lower id on ties (a strict total order, so the top n set
// is unique and a partial selection finds the same one as a full sort).
bool ranks_before(const std::pair<std::int32_t, double>& a,
                  const std::pair<std::int32_t, double>& b) {
  return a.second != b.second ? a.second > b.second : a.first < b.first;
}

bool id_before(const std::pair<std::int32_t, double>& a, const std::pair<std::int32_t, double>& b) {
  return a.first < b.first;
}

// How many tokens top_k and min_p leave (each keeps a prefix of the rank order; at least one).
std::size_t cut_by_count_and_min_p(const Kept& w, const SamplingParams& p) {
  std::size_t n = w.size();
  if (p.top_k > 0 && std::size_t(p.top_k) < n) n = std::size_t(p.top_k);
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p);  // the most likely token has w = 1
    std::size_t above = 0;
    for (const auto& [id, x] : w) above += x >= floor ? 1 : 0;
    n = std::min(n, above);
  }
  return std::max<std::size_t>(n, 1);
}

// `kept` holds (id, w) in id order: w -> w / sum (the token's probability), then renormalised
// over the kept set, its mass summed in id order.
void renormalise(Kept& kept, double sum) {
  double mass = 0.0;
  for (auto& pr : kept) {
    pr.second /= sum;
    mass += pr.second;
  }
  for (auto& pr : kept) pr.second /= mass;
}

// The top_p walk over rank-ordered entries [from, to) of `ranked`: adds p = w / sum to `mass`;
// returns the count that reaches top_p, or nothing if none of them does.
std::optional<std::size_t> walk_top_p(const Kept& ranked, std::size_t from, std::size_t to,
                                      double sum, double top_p, double& mass) {
  for (std::size_t k = from; k < to; ++k) {
    mass += ranked[k].second / sum;
    if (mass >= top_p) return k + 1;
  }
  return std::nullopt;
}

// Moves the (mid - first) best of [first, last) to [first, mid): a heap of that many rejects most
// of a row with one comparison when it is small; a linear selection is cheaper when it is not.
void select_prefix(Kept::iterator first, Kept::iterator mid, Kept::iterator last) {
  if (mid == last) return;
  if ((mid - first) * 64 <= (last - first)) {
    std::partial_sort(first, mid, last, ranks_before);
  } else {
    std::nth_element(first, mid, last, ranks_before);
  }
}

// select_prefix, and [first, mid) in rank order.
void rank_prefix(Kept::iterator first, Kept::iterator mid, Kept::iterator last) {
  if (mid != last && (mid - first) * 64 <= (last - first)) {
    std::partial_sort(first, mid, last, ranks_before);
    return;
  }
  if (mid != last) std::nth_element(first, mid, last, ranks_before);
  std::sort(first, mid, ranks_before);
}

// How many rank-ordered entries the top_p walk should need, from one pass over the row instead
// of a prefix grown by guesses (a flat row's nucleus of ~12k tokens took five selections over the
// row that way). The weights go into buckets by their float's top bits (exponent and 4 mantissa
// bits: buckets ~4.4 % wide); since float(w) is monotone in w, every entry of a higher bucket
// ranks before every entry of a lower one, so the entries of the highest buckets are exactly the
// top that many in rank order. The count returned covers the buckets down to the one where their
// mass (summed here per bucket, another order than the walk's) reaches top_p, and one more
// non-empty bucket as a margin for that rounding. Only a starting size: if the walk does not
// reach top_p within it (a margin bucket with next to no mass), the caller grows it x4 until it
// does, so the result never depends on this estimate.
std::size_t nucleus_bound(const Kept& w, double sum, double top_p) {
  constexpr int kShift = 19;  // float bits >> 19: sign 0, exponent, 4 mantissa
  constexpr int kBuckets = 1 << (32 - kShift - 1);  // w >= 0: the sign bit is 0
  std::array<double, kBuckets> mass{};
  std::array<std::uint32_t, kBuckets> count{};
  for (const auto& pr : w) {
    const auto b = std::bit_cast<std::uint32_t>(static_cast<float>(pr.second)) >> kShift;
    mass[b] += pr.second;
    ++count[b];
  }
  const double target = top_p * sum;
  double m = 0.0;
  std::size_t c = 0;
  bool reached = false;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (count[static_cast<std::size_t>(b)] == 0) continue;
    c += count[static_cast<std::size_t>(b)];
    if (reached) return c;
    m += mass[static_cast<std::size_t>(b)];
    reached = m >= target;
  }
  return c;
}

// Where top_k / min_p already leave at most this many tokens, the top_p walk ranks them all at
// once: cheaper than nucleus_bound's pass over the row.
constexpr std::size_t kRankAllBelow = 64;

}  // namespace

void sampling_distribution_sorted(std::span<const float> logits, const SamplingParams& p,
                                  std::vector<std::pair<std::int32_t, double>>& out) {
  const double sum = weights(logits, p.temperature, out);
  std::size_t n = cut_by_count_and_min_p(out, p);
  std::sort(out.begin(), out.end(), ranks_before);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    n = walk_top_p(out, 0, n, sum, double(p.top_p), mass).value_or(n);
  }
  out.resize(n);
  std::sort(out.begin(), out.end(), id_before);
  renormalise(out, sum);
}

void sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                           std::vector<std::pair<std::int32_t, double>>& out) {
  sampling_distribution_from(logits, p, 0, out);
}

void sampling_distribution_from(std::span<const float> logits, const SamplingParams& p,
                                std::size_t first_ranked,
                                std::vector<std::pair<std::int32_t, double>>& out) {
  const double sum = weights(logits, p.temperature, out);
  const std::size_t V = out.size();
  std::size_t n = cut_by_count_and_min_p(out, p);
  if (p.top_p < 1.0f) {
    // Rank a prefix, walk it, and rank further only if the nucleus is not inside it:
    // out[0, ranked) is the top `ranked` in rank order, the rest unordered.
    std::size_t ranked = 0;
    if (first_ranked == 0) {
      first_ranked = n <= kRankAllBelow ? n : nucleus_bound(out, sum, double(p.top_p));
    }
    std::size_t want = std::min(n, std::max<std::size_t>(1, first_ranked));
    double mass = 0.0;
    for (;;) {
      const auto first = out.begin() + std::ptrdiff_t(ranked);
      const auto nth = out.begin() + std::ptrdiff_t(want);
      rank_prefix(first, nth, out.end());
      const std::optional<std::size_t> reached =
          walk_top_p(out, ranked, want, sum, double(p.top_p), mass);
      ranked = want;
      if (reached || want == n) {
        n = reached.value_or(n);
        break;
      }
      want = std::min(n, want * 4);
    }
  } else if (n < V) {
    // No walk: only the set of the n best matters, not their order.
    select_prefix(out.begin(), out.begin() + std::ptrdiff_t(n), out.end());
  }
  if (n < V || p.top_p < 1.0f) {  // ranking moved entries: back to id order
    out.resize(n);
    std::sort(out.begin(), out.end(), id_before);
  }  // else nothing was cut and nothing moved: still in id order
  renormalise(out, sum);
}

std::int32_t draw(std::span<const std::pair<std::int32_t, double>> kept, Rng& rng) {
  const double u = rng.uniform();
  double c = 0.0;
  for (const auto& [id, prob] : kept) {
    c += prob;
    if (u < c) return id;
  }
  return kept.back().first;  // u within rounding of 1
}

std::int32_t sample(std::span<const float> logits, const SamplingParams& p, Rng& rng,
                    std::vector<std::pair<std::int32_t, double>>& scratch) {
  if (p.temperature == 0.0f) return argmax(logits);
  sampling_distribution(logits, p, scratch);
  return draw(scratch, rng);
}

}  // namespace ferry::serve
