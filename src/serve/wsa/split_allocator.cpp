// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/split_allocator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/check.h"
#include "mem/budget.h"
#include "serve/wsa/convex_curve.h"

namespace ferry::serve::wsa {
namespace {

int layers(const SplitProblem& p) { return static_cast<int>(p.expert_misses.size()); }

double expert_cost(const SplitProblem& p, int l, int c) {
  return p.miss_cost_s * p.expert_misses[std::size_t(l)][std::size_t(c)];
}
double kv_cost(const SplitProblem& p, int k) { return kv_side_s(p, k); }

Status check_problem(const SplitProblem& p) {
  if (p.expert_bytes == 0 || p.kv_block_bytes == 0 || p.kv_short.empty() || layers(p) == 0) {
    return invalid_argument("wsa: split problem needs expert and kv block sizes and curves");
  }
  for (const auto& m : p.expert_misses) {
    if (static_cast<int>(m.size()) != p.experts() + 1) {
      return invalid_argument("wsa: every layer's miss curve needs E + 1 = {} points",
                              p.experts() + 1);
    }
  }
  if (p.min_slots < 1 || p.min_slots > p.experts()) {
    return invalid_argument("wsa: min slots {} outside [1, {}]", p.min_slots, p.experts());
  }
  if (p.kv_floor_blocks > p.kv_max_blocks()) {
    return invalid_argument("wsa: kv floor of {} blocks beyond the kv curve's {} blocks",
                            p.kv_floor_blocks, p.kv_max_blocks());
  }
  const std::size_t base = std::size_t(layers(p)) * std::size_t(p.min_slots) * p.expert_bytes +
                           std::size_t(p.kv_floor_blocks) * p.kv_block_bytes;
  if (base > p.budget_bytes) {
    return resource_exhausted(
        "wsa: budget {} holds less than the minimum split ({} layers x {} slots of {} + kv "
        "floor of {} blocks of {} = {})",
        mem::format_bytes(p.budget_bytes), layers(p), p.min_slots,
        mem::format_bytes(p.expert_bytes), p.kv_floor_blocks, mem::format_bytes(p.kv_block_bytes),
        mem::format_bytes(base));
  }
  return ok_status();
}

// Spends leftover bytes where they cannot hurt (every curve is non-increasing): KV first (the
// convention of the fixed splits, "KV gets the rest"), then one slot at a time round-robin.
void fill_leftover(const SplitProblem& p, Split& s) {
  std::size_t left = p.budget_bytes - s.bytes(p);
  const int add_kv = static_cast<int>(
      std::min<std::size_t>(left / p.kv_block_bytes, std::size_t(p.kv_max_blocks() - s.kv_blocks)));
  s.kv_blocks += add_kv;
  left -= std::size_t(add_kv) * p.kv_block_bytes;
  for (bool grew = true; grew && left >= p.expert_bytes;) {
    grew = false;
    for (int& c : s.slots) {
      if (c < p.experts() && left >= p.expert_bytes) {
        ++c;
        left -= p.expert_bytes;
        grew = true;
      }
    }
  }
}

}  // namespace

double kv_side_s(const SplitProblem& p, int k) { return kv_side_s(p, k, p.prefix_block_cost_s); }

double kv_side_s(const SplitProblem& p, int k, double prefix_block_cost_s) {
  double t = p.kv_block_cost_s * p.kv_short[std::size_t(std::min(k, p.kv_max_blocks()))];
  if (!p.kv_prefix_misses.empty()) {
    const int last = static_cast<int>(p.kv_prefix_misses.size()) - 1;
    t += prefix_block_cost_s * p.kv_prefix_misses[std::size_t(std::clamp(k, 0, last))];
  }
  return t;
}

std::size_t Split::bytes(const SplitProblem& p) const {
  const std::size_t slots_total = std::accumulate(slots.begin(), slots.end(), std::size_t(0));
  return slots_total * p.expert_bytes + std::size_t(kv_blocks) * p.kv_block_bytes;
}

double modelled_step_s(const SplitProblem& p, const Split& s) {
  return modelled_step_s(p, s, p.prefix_block_cost_s);
}

double modelled_step_s(const SplitProblem& p, const Split& s, double prefix_block_cost_s) {
  double t = kv_side_s(p, s.kv_blocks, prefix_block_cost_s);
  for (int l = 0; l < layers(p); ++l) t += expert_cost(p, l, s.slots[std::size_t(l)]);
  return t;
}

bool feasible(const SplitProblem& p, const Split& s) {
  if (static_cast<int>(s.slots.size()) != layers(p)) return false;
  for (int c : s.slots) {
    if (c < p.min_slots || c > p.experts()) return false;
  }
  return s.kv_blocks >= p.kv_floor_blocks && s.bytes(p) <= p.budget_bytes;
}

Result<Split> uniform_split(const SplitProblem& p, int cap) {
  FERRY_TRY(check_problem(p));
  Split s{.slots = std::vector<int>(std::size_t(layers(p)), cap), .kv_blocks = 0};
  const std::size_t experts = s.bytes(p);
  if (cap < p.min_slots || cap > p.experts() || experts > p.budget_bytes) {
    return resource_exhausted("wsa: uniform cap {} does not fit", cap);
  }
  s.kv_blocks = static_cast<int>(std::min<std::size_t>(
      (p.budget_bytes - experts) / p.kv_block_bytes, std::size_t(p.kv_max_blocks())));
  if (s.kv_blocks < p.kv_floor_blocks) {
    return resource_exhausted("wsa: uniform cap {} leaves {} kv blocks, below the floor of {}", cap,
                              s.kv_blocks, p.kv_floor_blocks);
  }
  return s;
}

std::vector<Split> all_uniform_splits(const SplitProblem& p) {
  std::vector<Split> out;
  for (int c = p.min_slots; c <= p.experts(); ++c) {
    auto s = uniform_split(p, c);
    if (s.ok()) out.push_back(std::move(*s));
  }
  return out;
}

Result<Split> fraction_split(const SplitProblem& p, double expert_fraction) {
  FERRY_TRY(check_problem(p));
  const double bytes = std::clamp(expert_fraction, 0.0, 1.0) * double(p.budget_bytes);
  int cap = static_cast<int>(bytes / (double(p.expert_bytes) * layers(p)));
  cap = std::clamp(cap, p.min_slots, p.experts());
  // Lower the cap until the KV floor fits (the minimum split fits: checked above).
  for (; cap >= p.min_slots; --cap) {
    auto s = uniform_split(p, cap);
    if (s.ok()) return s;
  }
  return resource_exhausted("wsa: no uniform split fits the kv floor");
}

Result<Split> greedy_on_hulls(const SplitProblem& p, const AllocatorOptions& opt) {
  FERRY_TRY(check_problem(p));
  const int L = layers(p);
  // Curve i < L: layer i over x = min_slots..E; curve L: KV over x = floor..max.
  struct Curve {
    int x0 = 0;
    std::size_t unit = 0;
    std::vector<double> y;
    std::vector<int> hull;  // vertex offsets from x0
    std::size_t next = 0;   // current segment: hull[next] -> hull[next + 1]
    int at = 0;             // offset from x0 taken so far (inside the current segment)
    bool closed = false;    // a segment that did not fit was taken partly: nothing more
    bool open() const { return !closed && next + 1 < hull.size(); }
    // Saving per byte of the current segment (linear along it, so also of its untaken rest).
    double rate() const {
      const int a = hull[next], b = hull[next + 1];
      return (y[std::size_t(a)] - y[std::size_t(b)]) / (double(b - a) * double(unit));
    }
  };
  std::vector<Curve> cv(std::size_t(L) + 1);
  for (int i = 0; i <= L; ++i) {
    Curve& c = cv[std::size_t(i)];
    const bool kv = i == L;
    c.x0 = kv ? p.kv_floor_blocks : p.min_slots;
    c.unit = kv ? p.kv_block_bytes : p.expert_bytes;
    const int x1 = kv ? p.kv_max_blocks() : p.experts();
    for (int x = c.x0; x <= x1; ++x) c.y.push_back(kv ? kv_cost(p, x) : expert_cost(p, i, x));
    c.hull = lower_convex_hull(c.y);
  }
  Split s{.slots = std::vector<int>(std::size_t(L), p.min_slots), .kv_blocks = p.kv_floor_blocks};
  std::size_t left = p.budget_bytes - s.bytes(p);
  // Takes up to `units` of curve i's current segment (fewer if they do not fit: then the curve is
  // closed, its later segments save less per byte); moves to the next segment at its end.
  auto take = [&](int i, int units) {
    Curve& c = cv[std::size_t(i)];
    const int part = static_cast<int>(std::min<std::size_t>(std::size_t(units), left / c.unit));
    if (i == L) {
      s.kv_blocks += part;
    } else {
      s.slots[std::size_t(i)] += part;
    }
    left -= std::size_t(part) * c.unit;
    c.at += part;
    if (part < units) c.closed = true;
    if (c.at == c.hull[c.next + 1]) ++c.next;
  };
  // Each round scans the L + 1 current segments: O((L + 1) x rounds), rounds <= the hull
  // segments plus the slots taken one at a time (<= L x E).
  const double tie = std::max(opt.balance_tie, 0.0);
  for (;;) {
    // The best segment: highest rate, exact ties to the highest index (the plain greedy's order).
    int best = -1;
    double best_rate = 0;
    for (int i = 0; i <= L; ++i) {
      const Curve& c = cv[std::size_t(i)];
      if (!c.open()) continue;
      const double r = c.rate();
      if (best < 0 || r >= best_rate) best = i, best_rate = r;
    }
    if (best < 0 || best_rate <= 0) break;  // nothing left saves anything
    // A MoE layer's segment is best: the layers within `tie` of it are a tie; the one with the
    // fewest slots gets one slot. A lone best (or KV) takes its whole segment.
    int pick = best, tied = 0;
    if (best < L && tie > 0) {
      for (int l = 0; l < L; ++l) {
        const Curve& c = cv[std::size_t(l)];
        if (!c.open() || c.rate() < best_rate * (1 - tie)) continue;
        ++tied;
        if (s.slots[std::size_t(l)] < s.slots[std::size_t(pick)]) pick = l;
      }
    }
    const Curve& c = cv[std::size_t(pick)];
    take(pick, tied > 1 ? 1 : c.hull[c.next + 1] - c.at);
    if (tied > 1 && cv[std::size_t(pick)].closed) {
      for (int l = 0; l < L; ++l) cv[std::size_t(l)].closed = true;  // no slot fits any layer
    }
  }
  fill_leftover(p, s);
  return s;
}

Result<Split> allocate(const SplitProblem& p, const AllocatorOptions& opt) {
  FERRY_ASSIGN_OR_RETURN(Split best, greedy_on_hulls(p, opt));
  double best_t = modelled_step_s(p, best);
  for (Split& u : all_uniform_splits(p)) {
    const double t = modelled_step_s(p, u);
    if (t < best_t) best = std::move(u), best_t = t;
  }
  // Polish on the real curves: move one slot between layers, or trade one slot for the KV blocks
  // its bytes buy (and back), taking the best move while it lowers T. Moves are scored by their
  // cost deltas (O(L) per round); each accepted move lowers T strictly, so the loop ends.
  const int L = layers(p);
  const double tie = std::max(opt.balance_tie, 0.0);
  constexpr double kInf = 1e300;
  for (int round = 0; round < 1'000'000; ++round) {
    const std::size_t left = p.budget_bytes - best.bytes(p);
    // loss[a]: T added by one slot fewer in layer a; gain[b]: T saved by one slot more in b.
    int a1 = -1, a2 = -1, b1 = -1, b2 = -1;
    double l1 = kInf, l2 = kInf, g1 = -kInf, g2 = -kInf;
    for (int l = 0; l < L; ++l) {
      const int c = best.slots[std::size_t(l)];
      if (c > p.min_slots) {
        const double loss = expert_cost(p, l, c - 1) - expert_cost(p, l, c);
        if (loss < l1)
          a2 = a1, l2 = l1, a1 = l, l1 = loss;
        else if (loss < l2)
          a2 = l, l2 = loss;
      }
      if (c < p.experts()) {
        const double gain = expert_cost(p, l, c) - expert_cost(p, l, c + 1);
        if (gain > g1)
          b2 = b1, g2 = g1, b1 = l, g1 = gain;
        else if (gain > g2)
          b2 = l, g2 = gain;
      }
    }
    double best_net = 1e-12 * std::max(best_t, 1e-300);
    int kind = 0, from = -1, to = -1, blocks = 0;
    // slot a -> slot b, only when b saves more than (1 + tie) x what a loses: a near-tie between
    // layers stays where the greedy balanced it. (The best pair, most gain and least loss, is
    // the only one to check: if it is a near-tie, so is every other pair.)
    auto pays = [&](double gain, double loss) { return gain > loss + tie * std::abs(loss); };
    if (a1 >= 0 && b1 >= 0) {
      const bool same = a1 == b1;
      const double n1 =
          same ? (b2 >= 0 && pays(g2, l1) ? g2 - l1 : -kInf) : (pays(g1, l1) ? g1 - l1 : -kInf);
      const double n2 = same && a2 >= 0 && pays(g1, l2) ? g1 - l2 : -kInf;
      if (n1 > best_net) best_net = n1, kind = 1, from = a1, to = same ? b2 : b1;
      if (n2 > best_net) best_net = n2, kind = 1, from = a2, to = b1;
    }
    // slot a -> KV blocks (the freed bytes plus any leftover)
    if (a1 >= 0) {
      const int add =
          static_cast<int>(std::min<std::size_t>((left + p.expert_bytes) / p.kv_block_bytes,
                                                 std::size_t(p.kv_max_blocks() - best.kv_blocks)));
      const double net = kv_cost(p, best.kv_blocks) - kv_cost(p, best.kv_blocks + add) - l1;
      if (add > 0 && net > best_net) best_net = net, kind = 2, from = a1, blocks = add;
    }
    // KV blocks -> slot b (as few blocks as make the slot fit)
    if (b1 >= 0) {
      const std::size_t need = left >= p.expert_bytes ? 0 : p.expert_bytes - left;
      const int drop = static_cast<int>((need + p.kv_block_bytes - 1) / p.kv_block_bytes);
      if (best.kv_blocks - drop >= p.kv_floor_blocks) {
        const double net = g1 - (kv_cost(p, best.kv_blocks - drop) - kv_cost(p, best.kv_blocks));
        if (net > best_net) best_net = net, kind = 3, to = b1, blocks = drop;
      }
    }
    if (kind == 0) break;
    if (kind == 1) --best.slots[std::size_t(from)], ++best.slots[std::size_t(to)];
    if (kind == 2) --best.slots[std::size_t(from)], best.kv_blocks += blocks;
    if (kind == 3) best.kv_blocks -= blocks, ++best.slots[std::size_t(to)];
    FERRY_CHECK(feasible(p, best), "wsa: polish left the feasible set (move kind {})", kind);
    best_t = modelled_step_s(p, best);
  }
  fill_leftover(p, best);
  return best;
}

std::string to_string(const Split& s) {
  int lo = s.slots.empty() ? 0 : 1 << 30, hi = 0;
  long total = 0;
  for (int c : s.slots) lo = std::min(lo, c), hi = std::max(hi, c), total += c;
  return fmt::format("slots/layer {}..{} (mean {:.1f}), kv {} blocks", lo, hi,
                     double(total) / double(std::max<std::size_t>(1, s.slots.size())), s.kv_blocks);
}

double prefix_block_cost_at(const SplitProblem& p, const Split& s) {
  if (p.recompute_misses.empty()) return p.prefix_block_cost_s;
  FERRY_CHECK(p.recompute_misses.size() == s.slots.size(),
              "wsa: {} recompute curves for a split of {} layers", p.recompute_misses.size(),
              s.slots.size());
  double m = 0;
  for (std::size_t l = 0; l < s.slots.size(); ++l) {
    const std::vector<double>& c = p.recompute_misses[l];
    m += c[std::size_t(std::clamp(s.slots[l], 0, static_cast<int>(c.size()) - 1))];
  }
  return p.prefix_block_base_s + p.miss_cost_s * m;
}

double modelled_step_priced_by_caps_s(const SplitProblem& p, const Split& s) {
  if (!has_cap_prices(p)) return modelled_step_s(p, s);
  const double price = prefix_block_cost_at(p, s);
  return modelled_step_s(p, s, price) - p.prefix_misses_seen * (price - p.prefix_block_cost_s);
}

Result<Split> allocate_priced_by_caps(const SplitProblem& p, const AllocatorOptions& opt,
                                      const PricedByCapsOptions& starts) {
  FERRY_ASSIGN_OR_RETURN(Split best, allocate(p, opt));
  if (!has_cap_prices(p)) return best;
  double best_t = modelled_step_priced_by_caps_s(p, best);
  auto consider = [&](const Split& s) {
    const double t = modelled_step_priced_by_caps_s(p, s);
    if (t < best_t) best = s, best_t = t;
  };
  SplitProblem q = p;
  // The fixed point from allocate(p)'s split (price at the split's caps -> allocate -> ...), a
  // few rounds, so the result is never worse than that iteration either.
  Split cur = best;
  for (int round = 0; round < starts.fixed_point_rounds; ++round) {
    q.prefix_block_cost_s = prefix_block_cost_at(p, cur);
    auto s = allocate(q, opt);
    if (!s.ok() || *s == cur) break;
    cur = *s;
    consider(cur);
  }
  // Starts at uniform splits' prices: every one, or the one best by the cap-priced T.
  const std::vector<Split> uniform = all_uniform_splits(p);
  std::vector<const Split*> from;
  double from_t = 0;  // the cap-priced T of from[0], when only the best one is kept
  for (const Split& u : uniform) {
    if (starts.every_uniform_start) {
      from.push_back(&u);
      continue;
    }
    const double t = modelled_step_priced_by_caps_s(p, u);
    if (from.empty() || t < from_t) from.assign(1, &u), from_t = t;
  }
  for (const Split* u : from) {
    consider(*u);
    q.prefix_block_cost_s = prefix_block_cost_at(p, *u);
    auto s = allocate(q, opt);
    if (s.ok()) consider(*s);
  }
  return best;
}

Result<Split> offline_split(const SplitProblem& p, bool price_by_caps,
                            const AllocatorOptions& opt) {
  return price_by_caps ? allocate_priced_by_caps(p, opt) : allocate(p, opt);
}

}  // namespace ferry::serve::wsa
