// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/trace_plan.h"

#include <algorithm>
#include <map>

#include "serve/wsa/demand.h"
#include "serve/wsa/stack_distance.h"

namespace ferry::serve::wsa {

Result<TracePlan> plan_from_trace(const RoutingTrace& trace, const model::DecoderGeometry& geo,
                                  const TracePlanSpec& spec) {
  if (geo.experts == 0) return invalid_argument("wsa: plan needs a MoE model");
  if (trace.experts != geo.experts || trace.top_k != geo.top_k) {
    return invalid_argument("wsa: trace has E={} K={}, the model E={} K={}", trace.experts,
                            trace.top_k, geo.experts, geo.top_k);
  }
  TracePlan plan;
  std::vector<int> index(std::size_t(geo.layers), -1);
  for (int l = 0; l < geo.layers; ++l) {
    if (!geo.layer_is_moe[std::size_t(l)]) continue;
    index[std::size_t(l)] = static_cast<int>(plan.moe_layers.size());
    plan.moe_layers.push_back(l);
  }
  std::vector<StackDistance> sd(plan.moe_layers.size(), StackDistance(geo.experts));
  std::map<std::int64_t, int> length;  // request -> positions
  std::int64_t positions = 0;
  for (const auto& [key, ids] : trace.routes) {  // ordered by (request, position, layer)
    if (key.layer < 0 || key.layer >= geo.layers || index[std::size_t(key.layer)] < 0) {
      return invalid_argument("wsa: trace layer {} is not a MoE layer of the model", key.layer);
    }
    for (std::int32_t e : ids) {
      if (e < 0 || e >= geo.experts)
        return invalid_argument("wsa: trace expert {} out of range", e);
      sd[std::size_t(index[std::size_t(key.layer)])].access(e);
    }
    int& len = length[key.request];
    if (key.position + 1 > len) {
      positions += key.position + 1 - len;
      len = key.position + 1;
    }
  }
  if (positions == 0) return invalid_argument("wsa: the trace is empty");
  const std::size_t pbytes = std::size_t(spec.bytes_per_param);
  CostModel m;
  m.budget_bytes = spec.budget_bytes;
  m.expert_bytes = 3 * std::size_t(geo.hidden) * std::size_t(geo.expert_width) * pbytes;
  m.kv_block_bytes = std::size_t(geo.layers) * 2 * std::size_t(spec.block_tokens) *
                     std::size_t(geo.kv_heads) * std::size_t(geo.head_dim) *
                     (spec.kv_bytes_per_elt > 0 ? std::size_t(spec.kv_bytes_per_elt) : pbytes);
  m.min_slots = geo.top_k;
  auto blocks = [&](int tokens) { return (tokens + spec.block_tokens - 1) / spec.block_tokens; };
  int longest = 0;
  std::vector<int> req_blocks;
  for (const auto& [r, len] : length) {
    longest = std::max(longest, len);
    req_blocks.push_back(blocks(len));
  }
  const int ctx = spec.max_context > 0 ? spec.max_context : longest;
  m.kv_floor_blocks = spec.concurrency * blocks(ctx);
  m.kv_max_blocks = static_cast<int>(spec.budget_bytes / m.kv_block_bytes);
  m.link_bytes_per_s = spec.link_bytes_per_s;
  m.kv_block_cost_s = double(spec.block_tokens) * spec.prefill_token_s;
  std::vector<double> kv_samples;
  for (std::size_t i = 0; i < req_blocks.size(); ++i) {
    double d = 0;
    for (std::size_t j = i; j < std::min(req_blocks.size(), i + std::size_t(spec.concurrency));
         ++j) {
      d += req_blocks[j];
    }
    kv_samples.push_back(d);
  }
  const double steps = double(positions) / double(std::max(spec.concurrency, 1));
  plan.problem = make_problem(m, sd, steps, kv_samples);
  FERRY_ASSIGN_OR_RETURN(Split chosen, offline_split(plan.problem, spec.price_by_caps));
  auto step_s = [&](const Split& s) {  // the T the configurator minimised
    return spec.price_by_caps ? modelled_step_priced_by_caps_s(plan.problem, s)
                              : modelled_step_s(plan.problem, s);
  };
  plan.chosen = {"mv-wsa", chosen, step_s(chosen)};
  const std::vector<Split> uniform = all_uniform_splits(plan.problem);
  if (auto half = fraction_split(plan.problem, 0.5); half.ok()) {
    plan.fixed.push_back({"fixed 50/50", *half, step_s(*half)});
  }
  if (!uniform.empty()) {
    plan.fixed.push_back({"expert-heavy", uniform.back(), step_s(uniform.back())});
    plan.fixed.push_back({"kv-heavy", uniform.front(), step_s(uniform.front())});
    PlanRow best{"best uniform", uniform.front(), 1e300};
    for (const Split& u : uniform) {
      const double t = step_s(u);
      if (t < best.step_s) best = {"best uniform", u, t};
    }
    plan.fixed.push_back(best);
  }
  return plan;
}

}  // namespace ferry::serve::wsa
