// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/split_sim.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <list>
#include <span>
#include <unordered_map>

#include "core/check.h"
#include "core/timer.h"
#include "serve/wsa/convex_curve.h"

namespace ferry::serve::wsa {
namespace {

// One layer's LRU cache of expert ids at a resizable capacity.
class LruCache {
 public:
  explicit LruCache(int experts) : last_(std::size_t(experts), 0), in_(std::size_t(experts), 0) {}
  void set_capacity(int cap) {
    cap_ = cap;
    while (size_ > cap_) evict();
  }
  // One step's distinct experts as the pager acquires them (StackDistance::access_set's
  // semantics): hits are the experts resident at the step's start; then the set is touched most
  // recently used first, never-used last, each miss evicting the least recently used. Returns
  // the misses.
  int access_set(std::span<const int> set, std::vector<int>& order) {
    int misses = 0;
    for (int e : set) misses += in_[std::size_t(e)] == 0;
    order.assign(set.begin(), set.end());
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      const std::uint64_t la = last_[std::size_t(a)], lb = last_[std::size_t(b)];
      if ((la == 0) != (lb == 0)) return lb == 0;  // never used: last
      return la != lb ? la > lb : a < b;
    });
    for (int e : order) {
      ++tick_;
      if (in_[std::size_t(e)] == 0) {
        if (size_ == cap_) evict();
        in_[std::size_t(e)] = 1;
        ++size_;
      }
      last_[std::size_t(e)] = tick_;
    }
    return misses;
  }

 private:
  void evict() {
    int v = -1;
    for (std::size_t e = 0; e < in_.size(); ++e) {
      if (in_[e] && (v < 0 || last_[e] < last_[std::size_t(v)])) v = static_cast<int>(e);
    }
    in_[std::size_t(v)] = 0;
    --size_;
  }
  std::vector<std::uint64_t> last_;
  std::vector<std::uint8_t> in_;
  int cap_ = 0, size_ = 0;
  std::uint64_t tick_ = 0;
};

struct Seq {
  int session = 0, turn = 0;
  int prompt = 0, output = 0, generated = 0;
  int computed = 0, high_water = 0, blocks = 0;
  int identified = 0;    // leading blocks with a prefix-cache identity
  bool stopped = false;  // a stale cached copy of a block stopped its identification
  double arrival_s = 0;
  bool first = false;
  int tokens() const { return prompt + generated; }
};

}  // namespace

SplitProblem sim_problem(const SimConfig& cfg, int moe_layers, int experts, int top_k) {
  SplitProblem p;
  p.budget_bytes = cfg.budget_bytes;
  p.expert_bytes = cfg.expert_bytes;
  p.kv_block_bytes = cfg.kv_block_bytes();
  p.min_slots = top_k;
  p.kv_floor_blocks = cfg.kv_floor_blocks;
  p.miss_cost_s = double(cfg.expert_bytes) / cfg.link_bytes_per_s;
  p.kv_block_cost_s = cfg.kv_block_cost_s();
  p.expert_misses.assign(std::size_t(moe_layers), std::vector<double>(std::size_t(experts) + 1, 0));
  p.kv_short.assign(std::size_t(cfg.budget_bytes / p.kv_block_bytes) + 1, 0.0);
  return p;
}

Result<SimResult> simulate(const SimConfig& cfg, const AgenticWorkload& w, const Split& start,
                           bool live) {
  const AgenticSpec& ws = w.spec();
  const int L = ws.moe_layers, E = ws.experts;
  const int bt = cfg.block_tokens;
  auto blocks_for = [bt](int tokens) { return (tokens + bt - 1) / bt; };
  SplitProblem skel = sim_problem(cfg, L, E, ws.top_k);
  if (!feasible(skel, start)) {
    return invalid_argument("wsa sim: the starting split is not feasible for this budget");
  }
  if (blocks_for(w.max_context()) > start.kv_blocks) {
    return invalid_argument("wsa sim: {} kv blocks cannot hold the longest turn ({} tokens)",
                            start.kv_blocks, w.max_context());
  }
  Split split = start;
  std::vector<LruCache> lru(static_cast<std::size_t>(L), LruCache(E));
  for (int l = 0; l < L; ++l) lru[std::size_t(l)].set_capacity(split.slots[std::size_t(l)]);
  std::vector<StackDistance> sd(static_cast<std::size_t>(L), StackDistance(E));  // live, aged
  std::vector<StackDistance> profile_sd(static_cast<std::size_t>(L), StackDistance(E));
  std::vector<double> profile_kv;
  KvDemand kv_demand(4096);
  const bool pc = cfg.prefix_cache;
  const int kv_max = static_cast<int>(cfg.budget_bytes / cfg.kv_block_bytes());
  PrefixStackDistance psd(pc ? kv_max : 0), profile_psd(pc ? kv_max : 0);  // live (aged), whole
  PrefillCost prefill_cost(cfg.max_batch_tokens), profile_prefill_cost(cfg.max_batch_tokens);
  // The profile's cap-dependent block price (demand.h ChunkMisses): the misses of full chunks and
  // decode-only steps at every cap, and the price's part that is not misses.
  ChunkMisses profile_chunks(L, E, cfg.max_batch_tokens);
  PrefillCost profile_base_cost(cfg.max_batch_tokens);
  // ... and the live controller's (aged with its curves; ControllerConfig::price_by_caps).
  const bool live_priced = live && pc && cfg.controller.price_by_caps;
  ChunkMisses chunks(L, E, cfg.max_batch_tokens);
  PrefillCost base_cost(cfg.max_batch_tokens);
  // The prefix pool: cached (unreferenced) blocks, LRU, front = least recently released.
  std::list<std::uint64_t> pool_lru;
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> cached;
  auto key = [](int session, int block) {
    return (std::uint64_t(session) << 32) | std::uint32_t(block);
  };
  const SplitController ctl(cfg.controller);
  CostModel model{.budget_bytes = cfg.budget_bytes,
                  .expert_bytes = cfg.expert_bytes,
                  .kv_block_bytes = cfg.kv_block_bytes(),
                  .min_slots = ws.top_k,
                  .kv_floor_blocks = cfg.kv_floor_blocks,
                  .kv_max_blocks = static_cast<int>(cfg.budget_bytes / cfg.kv_block_bytes()),
                  .link_bytes_per_s = cfg.link_bytes_per_s,
                  .kv_block_cost_s = cfg.kv_block_cost_s()};

  SimResult res;
  double now = 0, ttft_sum = 0, live_steps = 0, profile_steps = 0;
  std::uint64_t turns_done = 0;
  int free_blocks = split.kv_blocks, preempted_last = 0;  // free: no content, not cached
  auto avail = [&]() { return free_blocks + static_cast<int>(pool_lru.size()); };
  auto evict_one = [&]() {
    cached.erase(pool_lru.front());
    pool_lru.pop_front();
    ++res.prefix_evictions;
  };
  auto take = [&](int n) {  // n <= avail(): free blocks first, then the LRU cached ones
    const int f = std::min(n, free_blocks);
    free_blocks -= f;
    for (int i = f; i < n; ++i) evict_one();
  };
  auto release = [&](Seq& q) {  // identified blocks stay cached (tail first), the rest are free
    for (int i = q.identified - 1; i >= 0; --i) {
      const std::uint64_t k = key(q.session, i);
      pool_lru.push_back(k);
      cached[k] = std::prev(pool_lru.end());
      psd.touch(k);
      profile_psd.touch(k);
    }
    free_blocks += q.blocks - q.identified;
    q.blocks = q.identified = 0;
    q.stopped = false;
  };
  std::vector<std::uint64_t> chain;
  std::deque<Seq> waiting;
  std::vector<Seq> running;
  // Next arrivals: (time, session, turn); every session's first turn at t = 0.
  std::vector<std::pair<double, std::pair<int, int>>> arrivals;
  for (int s = 0; s < w.sessions(); ++s) arrivals.push_back({0.0, {s, 0}});
  auto arrive = [&]() {
    std::sort(arrivals.begin(), arrivals.end());
    while (!arrivals.empty() && arrivals.front().first <= now) {
      const auto [t, st] = arrivals.front();
      arrivals.erase(arrivals.begin());
      const AgenticTurn& turn = w.turns(st.first)[std::size_t(st.second)];
      waiting.push_back({.session = st.first,
                         .turn = st.second,
                         .prompt = turn.prompt(),
                         .output = turn.output,
                         .arrival_s = t});
    }
  };
  std::vector<int> distinct, order_scratch;
  std::vector<std::pair<int, int>> depth_scratch;
  std::vector<std::uint8_t> seen(std::size_t(E), 0);
  std::vector<std::pair<int, int>> batch;  // (running index, tokens)
  DecisionCadence cadence(cfg.cadence(E));
  std::uint64_t last_step_accesses = 0;  // over MoE layers, the previous step's
  for (;;) {
    arrive();
    if (waiting.empty() && running.empty()) {
      if (arrivals.empty()) break;
      now = std::max(now, std::min_element(arrivals.begin(), arrivals.end())->first);
      continue;
    }
    // KV demand at the step boundary: used + what the queue needs to run + preempted work.
    int used = split.kv_blocks - avail(), waiting_need = 0, max_need = 0;
    {
      int slots = cfg.max_running - static_cast<int>(running.size());
      for (const Seq& q : waiting) {
        if (slots-- > 0) waiting_need += blocks_for(q.tokens());
        max_need = std::max(max_need, blocks_for(q.prompt + q.output));
      }
      for (const Seq& q : running) max_need = std::max(max_need, blocks_for(q.prompt + q.output));
    }
    // Engine::final_blocks (the reuse prior's working set), asked at decisions only: the running
    // requests' final blocks, and what a waiting one will hold less the prefix it will find
    // cached (those blocks are the prior's pending already): a new session's prompt counts, a
    // next turn's history does not.
    auto final_blocks = [&] {
      int n = 0;
      for (const Seq& q : running) n += blocks_for(q.prompt + q.output);
      for (const Seq& q : waiting) {
        int found = 0;
        if (pc) {
          while (found < (q.tokens() - 1) / bt && cached.contains(key(q.session, found))) ++found;
        }
        n += blocks_for(q.prompt + q.output) - found;
      }
      return n;
    };
    kv_demand.record(double(used + waiting_need + preempted_last));
    profile_kv.push_back(double(used + waiting_need + preempted_last));
    profile_steps += 1;
    live_steps += 1;
    preempted_last = 0;
    const bool due = live && cadence.step(double(last_step_accesses), L);
    last_step_accesses = 0;
    if (due && res.steps >= std::uint64_t(std::max(cfg.warmup_steps, 0))) {
      const Timer decide_clock;
      CostModel m = model;
      m.kv_floor_blocks = std::max({m.kv_floor_blocks, used, max_need});
      m.kv_max_blocks = std::max(m.kv_max_blocks, m.kv_floor_blocks);
      m.prefix_block_cost_s = double(bt) * prefill_cost.per_token_s(cfg.token_s);
      m.prefix_reuse_prior = cfg.reuse_prior;
      SplitProblem p = make_problem(m, sd, live_steps, kv_demand.samples(), pc ? &psd : nullptr,
                                    pc && cfg.reuse_prior ? final_blocks() : 0);
      if (live_priced) {  // as LiveSplit::problem(): r0 = the observed curve at the pool's size
        p.recompute_misses = chunks.per_block(bt);
        if (!p.recompute_misses.empty()) {
          p.prefix_block_base_s = double(bt) * base_cost.per_token_s(cfg.token_s);
          const std::vector<double> observed = psd.miss_curve();
          p.prefix_misses_seen = observed[std::size_t(std::min<int>(
                                     split.kv_blocks, static_cast<int>(observed.size()) - 1))] /
                                 live_steps;
        }
      }
      FERRY_ASSIGN_OR_RETURN(Decision d, ctl.decide(p, split));
      res.decide_s += decide_clock.elapsed_s();
      res.log.push_back({.step = res.steps,
                         .current_s = d.current_s,
                         .target_s = d.target_s,
                         .migration_s = d.migration_s,
                         .threshold = d.band,
                         .move = d.move,
                         .applied = d.move,
                         .target = d.target});
      if (d.move) {
        ++res.moves;
        free_blocks += d.target.kv_blocks - split.kv_blocks;
        // A shrink takes free blocks, then cached ones, least recently released first.
        while (free_blocks < 0 && !pool_lru.empty()) evict_one(), ++free_blocks;
        split = d.target;
        for (int l = 0; l < L; ++l) lru[std::size_t(l)].set_capacity(split.slots[std::size_t(l)]);
        FERRY_CHECK(
            free_blocks >= 0 && feasible(skel, split) && split.kv_blocks >= cfg.kv_floor_blocks,
            "wsa sim: live split broke the budget or the floor");
      }
      const double age = cadence.decided();
      for (StackDistance& s : sd) s.scale(age);
      psd.scale(age);
      prefill_cost.scale(age);
      chunks.scale(age);
      base_cost.scale(age);
      live_steps *= age;
    }
    // Decode growth with youngest-first preemption, then FIFO admission (engine.cpp's order).
    for (std::size_t i = 0; i < running.size(); ++i) {
      Seq& q = running[i];
      if (q.computed < q.prompt || q.tokens() - q.computed != 1) continue;
      const int need = blocks_for(q.computed + 1) - q.blocks;
      bool self = false;
      while (need > avail()) {
        const std::size_t v = running.size() - 1;
        Seq victim = running[v];
        running.pop_back();
        preempted_last += victim.blocks;
        release(victim);
        victim.computed = 0;
        ++res.preemptions;
        waiting.push_front(victim);
        if (v == i) {
          self = true;
          break;
        }
      }
      if (self) break;
      take(need);
      q.blocks += need;
    }
    while (!waiting.empty() && static_cast<int>(running.size()) < cfg.max_running) {
      Seq& q = waiting.front();
      // Prefix cache: the longest cached prefix of whole blocks, the last token left to compute.
      int matched = 0;
      chain.clear();
      if (pc) {
        for (int i = 0; i < (q.tokens() - 1) / bt; ++i) chain.push_back(key(q.session, i));
        while (matched < static_cast<int>(chain.size()) &&
               cached.contains(chain[std::size_t(matched)])) {
          ++matched;
        }
      }
      const int need = blocks_for(q.tokens()) - matched;
      if (need > avail() - matched) break;           // matched blocks leave the evictable set
      const int pinned = split.kv_blocks - avail();  // referenced by the running requests
      for (int i = 0; i < matched; ++i) {
        const auto it = cached.find(chain[std::size_t(i)]);
        pool_lru.erase(it->second);
        cached.erase(it);
      }
      take(need);
      q.blocks = matched + need;
      q.identified = matched;
      q.computed = matched * bt;
      if (pc) {
        res.prefix_query_blocks += chain.size();
        res.prefix_hit_blocks += std::uint64_t(matched);
        res.prefix_model_hit_blocks +=
            std::uint64_t(profile_psd.lookup(chain, pinned, split.kv_blocks));
        psd.lookup(chain, pinned);
      }
      running.push_back(q);
      waiting.pop_front();
    }
    if (running.empty()) {
      // Nothing fits yet: only possible while blocks wait on a resize (never with a feasible
      // split, which holds the longest turn); advance to the next arrival.
      if (arrivals.empty()) return internal_error("wsa sim: stalled with nothing running");
      now = std::max(now, std::min_element(arrivals.begin(), arrivals.end())->first);
      continue;
    }
    batch.clear();
    int budget = cfg.max_batch_tokens, tokens = 0;
    auto decoding = [](const Seq& q) {
      return q.computed >= q.prompt && q.tokens() - q.computed == 1;
    };
    for (std::size_t i = 0; i < running.size(); ++i) {
      if (decoding(running[i])) batch.push_back({int(i), 1}), --budget;
    }
    for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
      if (decoding(running[i])) continue;
      const int n = std::min(budget, running[i].tokens() - running[i].computed);
      batch.push_back({int(i), n});
      budget -= n;
    }
    // Expert accesses: per layer, the step's distinct experts in first-use order.
    std::uint64_t misses = 0;
    for (int l = 0; l < L; ++l) {
      distinct.clear();
      for (const auto& [i, n] : batch) {
        const Seq& q = running[std::size_t(i)];
        for (int p = q.computed; p < q.computed + n; ++p) {
          for (std::uint8_t e : w.route(q.session, p, l)) {
            if (!seen[e]) seen[e] = 1, distinct.push_back(e);
          }
        }
      }
      for (int e : distinct) seen[std::size_t(e)] = 0;
      misses += std::uint64_t(lru[std::size_t(l)].access_set(distinct, order_scratch));
      sd[std::size_t(l)].access_set(distinct, depth_scratch);
      profile_sd[std::size_t(l)].access_set(distinct, depth_scratch);
      profile_chunks.add_layer(l, depth_scratch);
      if (live_priced) chunks.add_layer(l, depth_scratch);
      res.accesses += distinct.size();
      last_step_accesses += distinct.size();
    }
    int prefill = 0;
    for (const auto& [i, n] : batch) {
      Seq& q = running[std::size_t(i)];
      if (!decoding(q)) prefill += n;
      res.recompute_tokens +=
          std::uint64_t(std::max(0, std::min(q.computed + n, q.high_water) - q.computed));
      q.computed += n;
      q.high_water = std::max(q.high_water, q.computed);
      tokens += n;
      // Blocks this step filled get their identity (unless a stale copy is cached).
      for (int b = q.identified; pc && !q.stopped && b < std::min(q.computed / bt, q.blocks); ++b) {
        const std::uint64_t k = key(q.session, b);
        if (cached.contains(k)) {
          q.stopped = true;
          break;
        }
        q.identified = b + 1;
      }
    }
    res.misses += misses;
    res.prefill_tokens += std::uint64_t(prefill);
    ++res.steps;
    const double step_s = cfg.step_base_s + cfg.token_s * tokens +
                          double(misses) * double(cfg.expert_bytes) / cfg.link_bytes_per_s;
    now += step_s;
    prefill_cost.add(step_s, tokens, prefill);
    profile_prefill_cost.add(step_s, tokens, prefill);
    profile_base_cost.add(cfg.step_base_s + cfg.token_s * tokens, tokens, prefill);
    profile_chunks.end_step(tokens, prefill);
    if (live_priced) {
      base_cost.add(cfg.step_base_s + cfg.token_s * tokens, tokens, prefill);
      chunks.end_step(tokens, prefill);
    }
    // Sampling: a sequence whose every token is computed emits one.
    for (Seq& q : running) {
      if (q.computed != q.tokens()) continue;
      ++q.generated;
      ++res.generated;
      if (!q.first) {
        q.first = true;
        ttft_sum += now - q.arrival_s;
        ++turns_done;
      }
    }
    for (std::size_t i = 0; i < running.size();) {
      Seq& q = running[i];
      if (q.generated < q.output) {
        ++i;
        continue;
      }
      release(q);
      if (q.turn + 1 < static_cast<int>(w.turns(q.session).size())) {
        arrivals.push_back({now + ws.think_s, {q.session, q.turn + 1}});
      }
      running.erase(running.begin() + std::ptrdiff_t(i));
    }
  }
  res.total_s = now;
  res.mean_ttft_s = turns_done ? ttft_sum / double(turns_done) : 0.0;
  res.decode_tokens_per_s = now > 0 ? double(res.generated) / now : 0.0;
  res.final_split = split;
  // The whole run's curves (not aged) and demand, per step: the offline configurator's input.
  CostModel whole = model;
  whole.prefix_block_cost_s = double(bt) * profile_prefill_cost.per_token_s(cfg.token_s);
  res.profile =
      make_problem(whole, profile_sd, profile_steps, profile_kv, pc ? &profile_psd : nullptr);
  if (pc && !live) {  // a fixed split's profile: its caps and KV size held the whole run
    SplitProblem& p = res.profile;
    p.recompute_misses = profile_chunks.per_block(bt);
    if (has_cap_prices(p)) {
      p.prefix_block_base_s = double(bt) * profile_base_cost.per_token_s(cfg.token_s);
      p.prefix_misses_seen = p.kv_prefix_misses[std::size_t(
          std::min<int>(split.kv_blocks, static_cast<int>(p.kv_prefix_misses.size()) - 1))];
    } else {
      p.recompute_misses.clear();
    }
  }
  return res;
}

}  // namespace ferry::serve::wsa
