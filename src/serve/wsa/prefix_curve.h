// SPDX-License-Identifier: Apache-2.0
// The prefix cache's miss curve over KV capacity (MV-WSA's second KV curve, next to the shortage
// curve of demand.h): how many prompt blocks a request would find missing at admission if the
// pool held k blocks, for every k at once -- Mattson stack distances over KV block identities,
// as stack_distance.h does for experts.
// Model of the pool: referenced blocks are pinned, and the rest of a k-block pool is an LRU of
// released blocks. So the stack holds released block identities (uint64 keys: the prefix cache's
// chained hash in the engine, (session, block index) in the simulator); touch() is a release
// (the engine queues a table's blocks tail first, so callers touch them in that order). lookup()
// is an admission with `pinned` blocks referenced by others at that moment (its chain then leaves
// the stack until released again): block i of the prompt
// is found at capacity k iff blocks 0..i all lie within depth k - pinned of the released stack (a
// prefix match stops at its first missing block), so it records pinned + the running maximum of
// the depths.
//   misses(k) = lookups' blocks whose pinned + running depth > k   (never released: infinite)
// What the model leaves out: the pool evicts at the tightest moment between a release and the
// lookup (more pinned blocks then than now makes it miss where the model hits), and a block still
// referenced by another request (a shared prefix in use) hits in the pool but is cold here. The
// curve computation is tested against a brute-force LRU list of the same events
// (wsa_prefix_test.cpp); the model against the simulator's real pool (serve_split_bench prints
// the pool's hits and the model's at the pool's size).
// Memory: a renumbering (every `window` touches) keeps the window / 2 most recent keys and
// forgets older ones, so the map holds O(window) keys. Exact while no forgotten key would have
// climbed back within max_depth (lookups take their chains out of the stack; window >=
// 4 * max_depth + 4 leaves 2 * max_depth + 2 of slack).
// Reuse prior (reuse_prior()): the curve above only knows lookups that happened, so before any
// chain has come back (a session's first turns) it shows no value in keeping cached blocks, and
// a live controller gives away the KV the next turns would reuse (docs/serve_wsa.md). The prior
// adds the expected next lookups of the chains the pool holds now, from what a server sees: the
// released blocks in the stack not looked up since (pending), plus the blocks that running and
// queued requests hold or need (`held`, the engine's KV demand sample: they are released as
// identified chains later). Its working-set model: sessions come back in turn, so between two
// lookups of one chain every other live chain is released or pinned once, and a chain is found
// iff the pool holds the whole working set W = pending + held. Each of those W blocks is counted
// as one lookup at depth W, weighted by the observed probability that a chain comes back,
// Laplace's rule over chain lookups, p = (1 + returns) / (2 + returns + new): a lookup is a
// return when its chain's first block is in the stack (released before, not forgotten), new
// otherwise -- counted only while released chains are in the stack (one of them could have come
// back instead; before the first release, as a run's first admissions arrive, a new chain says
// nothing about reuse: counting those held p at 1/6 at the 48-layer run's first decision, session
// 37). The counts age with scale(). Without reuse p falls as 1 / new chains; with reuse the
// prior is worth about one cycle of returns, next to the aged counts of the ones observed.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace ferry::serve::wsa {

class PrefixStackDistance {
 public:
  // max_depth: the largest capacity of interest (the KV curve's end); window: timestamps between
  // renumberings (at least 4 * max_depth + 4).
  explicit PrefixStackDistance(int max_depth, int window = 1 << 16);

  void touch(std::uint64_t key);  // a release
  // A prompt's full blocks, in order, looked up at admission while `pinned` blocks are
  // referenced; returns how many of them the model finds at capacity `k_now` (for comparing with
  // a real pool). Then takes them out of the stack: they are referenced now, pinned for later
  // lookups, until their release touches them again.
  int lookup(std::span<const std::uint64_t> chain, int pinned = 0, int k_now = 0);

  int max_depth() const { return max_depth_; }
  double lookups() const { return blocks_; }
  // [max_depth + 1]: missing blocks at capacity k = 0..max_depth (non-increasing).
  std::vector<double> miss_curve() const;
  void scale(double f);  // ages the counts (live use)

  // Released blocks in the stack, not looked up since (at most max_depth).
  int pending_blocks() const;
  // Chain lookups whose first block was in the stack (returns) and was not (new); aged.
  double returns() const { return returns_; }
  double new_chains() const { return new_chains_; }
  double reuse_probability() const { return (1.0 + returns_) / (2.0 + returns_ + new_chains_); }
  // [max_depth + 1], in lookups like miss_curve()'s counts: p * W at k < W, 0 from W on, with
  // W = pending_blocks() + held (all zero when W is 0 or beyond max_depth: no capacity of the
  // curve holds the working set, so the prior cannot tell capacities apart). See the file comment.
  std::vector<double> reuse_prior(int held) const;

 private:
  int depth(std::uint64_t key) const;  // 0: not in the stack
  void renumber();
  void add(int pos, int delta);
  int prefix(int pos) const;

  int max_depth_ = 0, window_ = 0, now_ = 0;
  std::vector<int> tree_;                        // [window] Fenwick over timestamps
  std::unordered_map<std::uint64_t, int> last_;  // key -> latest timestamp
  std::vector<double> hist_;                     // [max_depth + 2]; last: beyond / cold
  double blocks_ = 0;
  double returns_ = 0, new_chains_ = 0;
};

}  // namespace ferry::serve::wsa
