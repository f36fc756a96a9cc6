// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/prefix_curve.h"

#include <algorithm>

#include "core/check.h"

namespace ferry::serve::wsa {

PrefixStackDistance::PrefixStackDistance(int max_depth, int window)
    : max_depth_(max_depth),
      window_(std::max(window, 4 * max_depth + 4)),
      tree_(std::size_t(window_), 0),
      hist_(std::size_t(max_depth) + 2, 0.0) {
  FERRY_CHECK(max_depth >= 0, "wsa: prefix stack depth {}", max_depth);
}

void PrefixStackDistance::add(int pos, int delta) {
  for (int i = pos + 1; i <= window_; i += i & -i) tree_[std::size_t(i - 1)] += delta;
}

int PrefixStackDistance::prefix(int pos) const {
  int s = 0;
  for (int i = pos + 1; i > 0; i -= i & -i) s += tree_[std::size_t(i - 1)];
  return s;
}

void PrefixStackDistance::renumber() {
  std::vector<std::pair<int, std::uint64_t>> order;
  order.reserve(last_.size());
  for (const auto& [k, t] : last_) order.push_back({t, k});
  std::sort(order.begin(), order.end());
  // Keep the window_ / 2 most recent keys (at least 2 * max_depth + 2). A key older than that
  // is deeper than max_depth unless lookups take out more than window_ / 2 - max_depth keys
  // above it before it is touched again: forgetting it is then the one approximation.
  const std::size_t keep = std::min(order.size(), std::size_t(window_ / 2));
  order.erase(order.begin(), order.end() - std::ptrdiff_t(keep));
  std::fill(tree_.begin(), tree_.end(), 0);
  last_.clear();
  now_ = 0;
  for (const auto& [t, k] : order) {
    last_[k] = now_;
    add(now_++, 1);
  }
}

int PrefixStackDistance::depth(std::uint64_t key) const {
  const auto it = last_.find(key);
  if (it == last_.end()) return 0;
  return 1 + prefix(now_ - 1) - prefix(it->second);
}

void PrefixStackDistance::touch(std::uint64_t key) {
  if (now_ == window_) renumber();
  const auto it = last_.find(key);
  if (it != last_.end()) {
    add(it->second, -1);
    it->second = now_;
  } else {
    last_.emplace(key, now_);
  }
  add(now_++, 1);
}

int PrefixStackDistance::lookup(std::span<const std::uint64_t> chain, int pinned, int k_now) {
  int running = 0, hits_now = 0;
  bool cold = false;
  // A return, or a new chain that came while released chains could have come back instead
  // (with nothing released, a new chain says nothing about reuse: the first admissions of a run).
  if (!chain.empty()) {
    if (depth(chain.front()) > 0) {
      returns_ += 1;
    } else if (!last_.empty()) {
      new_chains_ += 1;
    }
  }
  for (std::uint64_t key : chain) {
    const int d = depth(key);
    if (d == 0) cold = true;
    running = std::max(running, d);
    const long need = long(running) + long(std::max(pinned, 0));
    const bool beyond = cold || need > max_depth_;
    hist_[beyond ? std::size_t(max_depth_) + 1 : std::size_t(need)] += 1;
    if (!beyond && need <= k_now) ++hits_now;
  }
  blocks_ += double(chain.size());
  // They are referenced now (counted as pinned by later lookups) until their release.
  for (std::uint64_t key : chain) {
    const auto it = last_.find(key);
    if (it == last_.end()) continue;
    add(it->second, -1);
    last_.erase(it);
  }
  return hits_now;
}

std::vector<double> PrefixStackDistance::miss_curve() const {
  std::vector<double> m(std::size_t(max_depth_) + 1);
  double tail = hist_[std::size_t(max_depth_) + 1];  // running depth > k
  for (int k = max_depth_; k >= 0; --k) {
    m[std::size_t(k)] = tail;
    if (k >= 1) tail += hist_[std::size_t(k)];
  }
  return m;
}

void PrefixStackDistance::scale(double f) {
  for (double& h : hist_) h *= f;
  blocks_ *= f;
  returns_ *= f;
  new_chains_ *= f;
}

int PrefixStackDistance::pending_blocks() const {
  return static_cast<int>(std::min<std::size_t>(last_.size(), std::size_t(max_depth_)));
}

std::vector<double> PrefixStackDistance::reuse_prior(int held) const {
  std::vector<double> m(std::size_t(max_depth_) + 1, 0.0);
  const long w = long(pending_blocks()) + long(std::max(held, 0));
  if (w == 0 || w > max_depth_) return m;
  const double mass = reuse_probability() * double(w);
  for (long k = 0; k < w; ++k) m[std::size_t(k)] = mass;
  return m;
}

}  // namespace ferry::serve::wsa
