// SPDX-License-Identifier: Apache-2.0
// ORIC scoring with the incremental swap-one-frame update (see oric.h).
#include "route/oric.h"

#include <algorithm>
#include <random>
#include <unordered_map>

#include "core/check.h"

namespace ferry::route {

namespace {

std::vector<RankedItem> ranked_from(const std::vector<GroundTruth>& gts,
                                    const std::vector<Detection>& dets, const OricOptions& o) {
  const MatchOptions mo{o.iou_threshold, MatchRule::kVoc, o.class_map};
  const std::vector<MatchFlag> flags = match_pooled(gts, dets, mo);
  std::vector<RankedItem> items;
  items.reserve(dets.size());
  for (std::size_t i = 0; i < dets.size(); ++i) {
    if (flags[i] == MatchFlag::kIgnore) continue;
    items.push_back({dets[i].score, static_cast<std::uint8_t>(flags[i] == MatchFlag::kTp)});
  }
  sort_ranked(items);
  return items;
}

}  // namespace

Result<OricScorer> OricScorer::build(const std::vector<int>& frames,
                                     const std::vector<GroundTruth>& gts,
                                     const std::vector<Detection>& weak,
                                     const std::vector<Detection>& strong,
                                     const OricOptions& opts) {
  OricScorer s;
  s.opts_ = opts;
  s.frames_ = frames;
  std::unordered_map<int, int> slot_of;
  for (int i = 0; i < static_cast<int>(frames.size()); ++i) {
    if (!slot_of.emplace(frames[i], i).second) {
      return invalid_argument("route: oric: frame {} listed twice in the context", frames[i]);
    }
  }
  for (const GroundTruth& g : gts) {
    if (slot_of.count(g.frame)) s.gts_.push_back(g);
  }
  for (const Detection& d : weak) {
    if (slot_of.count(d.frame)) s.weak_.push_back(d), s.weak_.back().source = Source::kWeak;
  }
  for (const Detection& d : strong) {
    if (slot_of.count(d.frame)) s.strong_.push_back(d), s.strong_.back().source = Source::kStrong;
  }
  for (const GroundTruth& g : s.gts_) s.npos_ += !g.difficult;
  if (s.npos_ == 0) {
    return invalid_argument("route: oric: context of {} frames has no ground-truth objects",
                            frames.size());
  }
  if (opts.rank_normalize) {
    rank_normalize_per_source(s.weak_);
    rank_normalize_per_source(s.strong_);
  }
  const MatchOptions mo{opts.iou_threshold, MatchRule::kVoc, opts.class_map};
  s.strong_by_slot_.resize(frames.size());
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<Detection>& dets = pass == 0 ? s.weak_ : s.strong_;
    std::vector<Item>& items = pass == 0 ? s.weak_items_ : s.strong_items_;
    const std::vector<MatchFlag> flags = match_pooled(s.gts_, dets, mo);
    for (std::size_t i = 0; i < dets.size(); ++i) {
      if (flags[i] == MatchFlag::kIgnore) continue;
      const int slot = slot_of.at(dets[i].frame);
      const auto tp = static_cast<std::uint8_t>(flags[i] == MatchFlag::kTp);
      items.push_back({dets[i].score, tp, slot});
      if (pass == 1) s.strong_by_slot_[slot].push_back({dets[i].score, tp});
    }
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.score > b.score; });
  }
  for (auto& v : s.strong_by_slot_) sort_ranked(v);
  s.scratch_.reserve(s.weak_items_.size() + s.strong_items_.size());
  s.scratch_.clear();
  for (const Item& it : s.weak_items_) s.scratch_.push_back({it.score, it.tp});
  s.base_ap_ = ap_sorted(s.scratch_, s.npos_, opts.interp);
  return s;
}

double OricScorer::strong_ap() const {
  return ap_with_offloaded(std::vector<std::uint8_t>(frames_.size(), 1));
}

double OricScorer::swapped_ap(int slot) const {
  FERRY_CHECK(slot >= 0 && slot < num_frames(), "oric: slot {} outside [0, {})", slot,
              num_frames());
  const std::vector<RankedItem>& ins = strong_by_slot_[slot];
  scratch_.clear();
  std::size_t j = 0;
  for (const Item& it : weak_items_) {
    if (it.slot == slot) continue;
    while (j < ins.size() && ins[j].score > it.score) scratch_.push_back(ins[j++]);
    scratch_.push_back({it.score, it.tp});
  }
  while (j < ins.size()) scratch_.push_back(ins[j++]);
  return ap_sorted(scratch_, npos_, opts_.interp);
}

double OricScorer::swapped_ap_full(int slot) const {
  FERRY_CHECK(slot >= 0 && slot < num_frames(), "oric: slot {} outside [0, {})", slot,
              num_frames());
  const int f = frames_[slot];
  std::vector<Detection> dets;
  for (const Detection& d : weak_) {
    if (d.frame != f) dets.push_back(d);
  }
  for (const Detection& d : strong_) {
    if (d.frame == f) dets.push_back(d);
  }
  // Scores are already the context-wide ranks; matching is redone from scratch.
  const std::vector<RankedItem> items = ranked_from(gts_, dets, opts_);
  return ap_sorted(items, npos_, opts_.interp);
}

std::vector<double> OricScorer::oric_all() const {
  std::vector<double> out(frames_.size());
  const double n = static_cast<double>(frames_.size());
  for (int s = 0; s < num_frames(); ++s) out[s] = n * (swapped_ap(s) - base_ap_);
  return out;
}

double OricScorer::ap_with_offloaded(const std::vector<std::uint8_t>& offload) const {
  FERRY_CHECK(offload.size() == frames_.size(), "oric: offload mask has {} entries, context {}",
              offload.size(), frames_.size());
  scratch_.clear();
  std::size_t i = 0, j = 0;
  const std::size_t nw = weak_items_.size(), ns = strong_items_.size();
  while (i < nw || j < ns) {
    const bool take_weak = j >= ns || (i < nw && weak_items_[i].score >= strong_items_[j].score);
    const Item& it = take_weak ? weak_items_[i++] : strong_items_[j++];
    if ((offload[it.slot] != 0) != take_weak) scratch_.push_back({it.score, it.tp});
  }
  return ap_sorted(scratch_, npos_, opts_.interp);
}

Result<std::vector<double>> oric_sampled(const std::vector<int>& frames,
                                         const std::vector<GroundTruth>& gts,
                                         const std::vector<Detection>& weak,
                                         const std::vector<Detection>& strong,
                                         const OricOptions& opts, int context_size, int rounds,
                                         std::uint64_t seed) {
  if (context_size < 2 || rounds < 1) {
    return invalid_argument("route: oric: context_size {} must be >= 2 and rounds {} >= 1",
                            context_size, rounds);
  }
  const int n = static_cast<int>(frames.size());
  std::vector<double> sum(n, 0.0);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    const int contexts = std::max(1, n / context_size);
    for (int c = 0; c < contexts; ++c) {
      const int begin = c * context_size;
      const int end = c + 1 == contexts ? n : begin + context_size;
      std::vector<int> ids;
      for (int k = begin; k < end; ++k) ids.push_back(frames[order[k]]);
      FERRY_ASSIGN_OR_RETURN(OricScorer sc, OricScorer::build(ids, gts, weak, strong, opts));
      const std::vector<double> o = sc.oric_all();
      for (int k = begin; k < end; ++k) sum[order[k]] += o[k - begin];
    }
  }
  for (double& v : sum) v /= rounds;
  return sum;
}

}  // namespace ferry::route
