// SPDX-License-Identifier: Apache-2.0
#include "train/stream/plan_traffic.h"

#include <array>

#include <fmt/format.h>

#include "mem/nvme_store.h"

namespace ferry::train::stream {
namespace {

struct Counter {
  const char* key;    // JSON key and traffic_diff's name
  const char* label;  // the text table's row
  std::uint64_t TrafficCounts::*field;
};

constexpr std::array<Counter, 8> kCounters{{
    {"act_d2h_bytes", "boundaries out (d2h, host + nvme)", &TrafficCounts::act_d2h_bytes},
    {"act_h2d_bytes", "boundaries back (h2d)", &TrafficCounts::act_h2d_bytes},
    {"nvme_write_bytes", "nvme write", &TrafficCounts::nvme_write_bytes},
    {"nvme_read_bytes", "nvme read", &TrafficCounts::nvme_read_bytes},
    {"layer_forwards", "layer forwards", &TrafficCounts::layer_forwards},
    {"recompute_forwards", "  recomputed in backward", &TrafficCounts::recompute_forwards},
    {"internals_forwards", "  re-forwards (internals)", &TrafficCounts::internals_forwards},
    {"kept_layers", "kept layers (no re-forward)", &TrafficCounts::kept_layers},
}};

Json counts_json(const TrafficCounts& c) {
  Json j = Json::object();
  for (const Counter& k : kCounters) j[k.key] = c.*k.field;
  return j;
}

}  // namespace

TrafficCounts& TrafficCounts::operator+=(const TrafficCounts& o) {
  for (const Counter& k : kCounters) this->*k.field += o.*k.field;
  return *this;
}

TrafficCounts expected_micro_batch(const ActivationPolicy& p, int hidden, std::int64_t tokens,
                                   std::int64_t max_tokens) {
  const auto C = static_cast<std::uint64_t>(hidden);
  const std::uint64_t act = static_cast<std::uint64_t>(tokens) * C * sizeof(float);
  const std::uint64_t record =
      mem::NvmeStore::stride_for(static_cast<std::size_t>(max_tokens) * C * sizeof(float));
  const auto L = static_cast<std::uint64_t>(p.layers());
  const auto offloaded = static_cast<std::uint64_t>(p.count(Home::kHost) + p.count(Home::kNvme));
  const auto nvme = static_cast<std::uint64_t>(p.count(Home::kNvme));
  const auto kept = static_cast<std::uint64_t>(p.kept_count());
  std::uint64_t recompute = 0;  // layers s..e-2 of each span (s, e): one per recomputed boundary
  for (const Span& s : p.spans()) recompute += static_cast<std::uint64_t>(s.end - s.start - 1);
  TrafficCounts c;
  c.act_d2h_bytes = offloaded * act;
  c.act_h2d_bytes = offloaded * act;
  c.nvme_write_bytes = nvme * record;
  c.nvme_read_bytes = nvme * record;
  c.recompute_forwards = recompute;
  c.internals_forwards = L - kept;
  c.kept_layers = kept;
  c.layer_forwards = L + recompute + c.internals_forwards;
  return c;
}

TrafficCounts traffic_counters(const TransferStats& s) {
  TrafficCounts c;
  c.act_d2h_bytes = s.act_d2h;
  c.act_h2d_bytes = s.act_h2d;
  c.nvme_write_bytes = s.nvme_write;
  c.nvme_read_bytes = s.nvme_read;
  c.layer_forwards = s.layer_forwards;
  c.internals_forwards = s.internals_forwards;
  c.kept_layers = s.kept_layers;
  return c;
}

TrafficCounts measured_between(const TrafficCounts& before, const TrafficCounts& after, int layers,
                               std::int64_t micro_batches) {
  TrafficCounts d;
  for (const Counter& k : kCounters) d.*k.field = after.*k.field - before.*k.field;
  // Unsigned wrap-around when the forwards are fewer than the forward passes themselves: a
  // mismatch either way (the expectation is never that large).
  const std::uint64_t forward_pass =
      static_cast<std::uint64_t>(layers) * static_cast<std::uint64_t>(micro_batches);
  d.recompute_forwards = d.layer_forwards - d.internals_forwards - forward_pass;
  return d;
}

PlanTrafficReport make_plan_traffic_report(const ActivationPolicy& p) {
  PlanTrafficReport r;
  r.policy = p.describe();
  r.device = p.count(Home::kDevice);
  r.host = p.count(Home::kHost);
  r.nvme = p.count(Home::kNvme);
  r.recompute = p.count(Home::kRecompute);
  r.kept = p.kept_count();
  return r;
}

void add_step(PlanTrafficReport& r, std::int64_t step, std::int64_t micro_batches,
              std::int64_t tokens, const TrafficCounts& expected, const TrafficCounts& measured) {
  ++r.steps;
  r.micro_batches += micro_batches;
  r.tokens += tokens;
  r.expected += expected;
  r.measured += measured;
  if (expected == measured) return;
  if (r.mismatched_steps == 0) {
    r.first_mismatch_step = step;
    r.first_mismatch_expected = expected;
    r.first_mismatch_measured = measured;
  }
  ++r.mismatched_steps;
  if (r.mismatched_step_ids.size() < PlanTrafficReport::kMaxListed) {
    r.mismatched_step_ids.push_back(step);
  }
}

std::string traffic_diff(const TrafficCounts& expected, const TrafficCounts& measured) {
  std::string out;
  for (const Counter& k : kCounters) {
    if (expected.*k.field == measured.*k.field) continue;
    out += fmt::format("{}{} {} != {}", out.empty() ? "" : ", ", k.key, expected.*k.field,
                       measured.*k.field);
  }
  return out;
}

std::string format_plan_traffic(const PlanTrafficReport& r) {
  std::string out = fmt::format(
      "plan traffic, policy {}: homes device {}, host {}, nvme {}, recompute {}; kept {} | {} "
      "steps, {} micro-batches, {} tokens\n",
      r.policy, r.device, r.host, r.nvme, r.recompute, r.kept, r.steps, r.micro_batches, r.tokens);
  out += fmt::format("{:<34} {:>14} {:>14} {:>14} {:>14}\n", "counter (run total)", "plan",
                     "measured", "plan/step", "measured/step");
  const double per = r.steps > 0 ? 1.0 / double(r.steps) : 0.0;
  for (const Counter& k : kCounters) {
    const std::uint64_t e = r.expected.*k.field, m = r.measured.*k.field;
    out += fmt::format("{:<34} {:>14} {:>14} {:>14.1f} {:>14.1f}{}\n", k.label, e, m,
                       double(e) * per, double(m) * per, e == m ? "" : "  <- MISMATCH");
  }
  if (r.match()) {
    out += fmt::format("plan traffic: match (every counter of all {} steps)\n", r.steps);
  } else {
    out += fmt::format("plan traffic: MISMATCH in {} of {} steps; first step {}: {}\n",
                       r.mismatched_steps, r.steps, r.first_mismatch_step,
                       traffic_diff(r.first_mismatch_expected, r.first_mismatch_measured));
  }
  return out;
}

Json plan_traffic_json(const PlanTrafficReport& r) {
  Json j{{"type", "plan_traffic"},
         {"policy", r.policy},
         {"homes",
          {{"device", r.device}, {"host", r.host}, {"nvme", r.nvme}, {"recompute", r.recompute}}},
         {"kept", r.kept},
         {"steps", r.steps},
         {"micro_batches", r.micro_batches},
         {"tokens", r.tokens},
         {"expected", counts_json(r.expected)},
         {"measured", counts_json(r.measured)},
         {"match", r.match()},
         {"mismatched_steps", r.mismatched_steps},
         {"mismatched_step_ids", r.mismatched_step_ids}};
  if (!r.match()) {
    j["first_mismatch"] = {{"step", r.first_mismatch_step},
                           {"expected", counts_json(r.first_mismatch_expected)},
                           {"measured", counts_json(r.first_mismatch_measured)}};
  }
  return j;
}

}  // namespace ferry::train::stream
