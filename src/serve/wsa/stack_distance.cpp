// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/stack_distance.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace ferry::serve::wsa {

StackDistance::StackDistance(int items, int window)
    : items_(items),
      window_(std::max(window, 2 * items + 2)),
      tree_(std::size_t(window_), 0),
      last_(std::size_t(items), -1),
      hist_(std::size_t(items) + 1, 0.0) {
  FERRY_CHECK(items > 0, "wsa: stack distance over {} items", items);
}

void StackDistance::add(int pos, int delta) {
  for (int i = pos + 1; i <= window_; i += i & -i) tree_[std::size_t(i - 1)] += delta;
}

int StackDistance::prefix(int pos) const {
  int s = 0;
  for (int i = pos + 1; i > 0; i -= i & -i) s += tree_[std::size_t(i - 1)];
  return s;
}

void StackDistance::renumber() {
  // Keep the recency order of the live marks, packed into timestamps 0..k-1.
  std::vector<int> order;
  for (int e = 0; e < items_; ++e) {
    if (last_[std::size_t(e)] >= 0) order.push_back(e);
  }
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return last_[std::size_t(a)] < last_[std::size_t(b)]; });
  std::fill(tree_.begin(), tree_.end(), 0);
  now_ = 0;
  for (int e : order) {
    last_[std::size_t(e)] = now_;
    add(now_++, 1);
  }
}

int StackDistance::access(int item) {
  FERRY_CHECK(item >= 0 && item < items_, "wsa: item {} outside [0, {})", item, items_);
  if (now_ == window_) renumber();
  accesses_ += 1;
  int depth = 0;
  const int last = last_[std::size_t(item)];
  if (last < 0) {
    cold_ += 1;
  } else {
    // Distinct items touched after `last` (each has its latest mark there), plus the item itself.
    depth = 1 + prefix(now_ - 1) - prefix(last);
    hist_[std::size_t(depth)] += 1;
    add(last, -1);
  }
  last_[std::size_t(item)] = now_;
  add(now_++, 1);
  return depth;
}

void StackDistance::access_set(std::span<const int> items,
                               std::vector<std::pair<int, int>>& order) {
  const int n = static_cast<int>(items.size());
  FERRY_CHECK(n <= items_, "wsa: a step set of {} items over {}", n, items_);
  if (now_ + n > window_) renumber();  // window >= 2E + 2 holds E live marks plus one set
  order.clear();
  const int top = now_ > 0 ? prefix(now_ - 1) : 0;
  for (int item : items) {
    FERRY_CHECK(item >= 0 && item < items_, "wsa: item {} outside [0, {})", item, items_);
    const int last = last_[std::size_t(item)];
    int depth = 0;  // first access
    if (last >= 0) depth = 1 + top - prefix(last);
    accesses_ += 1;
    if (depth == 0) {
      cold_ += 1;
    } else {
      hist_[std::size_t(depth)] += 1;
    }
    order.push_back({depth == 0 ? items_ + 1 : depth, item});
  }
  std::sort(order.begin(), order.end());
  for (const auto& [depth, item] : order) {
    const int last = last_[std::size_t(item)];
    if (last >= 0) add(last, -1);
    last_[std::size_t(item)] = now_;
    add(now_++, 1);
  }
}

std::vector<double> StackDistance::miss_curve() const {
  std::vector<double> m(std::size_t(items_) + 1);
  double tail = 0;  // accesses of depth > c
  for (int c = items_; c >= 0; --c) {
    m[std::size_t(c)] = cold_ + tail;
    if (c >= 1) tail += hist_[std::size_t(c)];
  }
  return m;
}

double StackDistance::misses_at(int capacity) const {
  double m = cold_;
  for (int d = std::max(capacity, 0) + 1; d <= items_; ++d) m += hist_[std::size_t(d)];
  return m;
}

void StackDistance::scale(double f) {
  for (double& h : hist_) h *= f;
  cold_ *= f;
  accesses_ *= f;
}

}  // namespace ferry::serve::wsa
