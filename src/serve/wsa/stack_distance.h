// SPDX-License-Identifier: Apache-2.0
// Online Mattson stack distances of one layer's expert accesses, exact, with a Fenwick tree over
// access timestamps (serve.md item 6). An access to expert e at time t has LRU stack depth
//   1 + |{experts whose latest access lies in (last[e], t)}|
// and the Fenwick tree holds a 1 at each expert's latest timestamp, so the depth is one prefix
// sum: O(log W) per access. By LRU's inclusion property an access hits a cache of C slots iff its
// depth <= C, so one histogram of depths gives the LRU miss count at every capacity at once:
//   misses(C) = cold + sum_{d > C} hist[d].
// Timestamps live in a window of W slots; when it fills, the E live marks are renumbered in
// order (0..E-1), which keeps every depth exact. scale() ages the histogram for a live, windowed
// view (the depths themselves are never approximated).
// Tests: tests/unit/serve/wsa_stack_distance_test.cpp (vs a brute-force LRU at every capacity,
// for single accesses and for step sets).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ferry::serve::wsa {

class StackDistance {
 public:
  // items: experts of the layer (E); window: timestamps before a renumbering (>= 2E).
  explicit StackDistance(int items, int window = 1 << 16);

  // Records an access; returns its stack depth (1 = most recently used), 0 for a first access.
  int access(int item);
  // Records one step's set of distinct items as the pager acquires it (ExpertPager::acquire:
  // the set at once, residents first): each item's depth is taken in the stack as it was at the
  // step's start (an item is a hit at capacity c iff it was among the c most recent then), and
  // the stack is then updated in order of those depths, shallowest first, first accesses last,
  // so a step larger than c leaves its deepest items on top, as the pager's last-loaded group.
  // The access-order depth of access() would count the step's own earlier items above each one,
  // which makes a prefill step (every expert) look like LRU's cyclic worst case -- all misses at
  // every capacity below E -- where the pager hits every resident expert. `items` must be
  // distinct; `order` is scratch.
  void access_set(std::span<const int> items, std::vector<std::pair<int, int>>& order);

  int items() const { return items_; }
  double accesses() const { return accesses_; }
  double cold() const { return cold_; }
  // hist()[d], d in [1, E]: (weighted) accesses of depth d; hist()[0] is unused.
  const std::vector<double>& hist() const { return hist_; }
  // LRU misses at capacity c, for c = 0..E ([E+1]); non-increasing in c.
  std::vector<double> miss_curve() const;
  double misses_at(int capacity) const;
  // Multiplies every count by f (0 < f <= 1): older accesses weigh less in a live curve.
  void scale(double f);

 private:
  void add(int pos, int delta);
  int prefix(int pos) const;  // marks at timestamps [0, pos]
  void renumber();

  int items_ = 0;
  int window_ = 0;
  int now_ = 0;               // next timestamp
  std::vector<int> tree_;     // [window] Fenwick over timestamps
  std::vector<int> last_;     // [E] latest timestamp, -1 never seen
  std::vector<double> hist_;  // [E+1]
  double cold_ = 0, accesses_ = 0;
};

}  // namespace ferry::serve::wsa
