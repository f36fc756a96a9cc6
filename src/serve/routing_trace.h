// SPDX-License-Identifier: Apache-2.0
// Routing traces: which experts each (request, token position, MoE layer) was routed to.
//   RoutingTrace     the data, plus a plain text file format (below), save/load
//   RoutingHook      called by the runner after the router, per token and MoE layer: may read the
//                    choice (TraceRecorder) or overwrite it (TraceReplayer: forced routing, e.g. a
//                    calibrated synthetic trace on a random-weight model). A hook that only forces
//                    (forces_ahead()) is asked for a whole step's routing before the forward pass
//                    (forced_route), so the CUDA runner uploads it once per step instead of a
//                    round trip per MoE layer (model_runner.h fill_forced_routing)
// File format (text, one entry per line, '#' comments):
//   ferry-routing-trace 1
//   experts <E> top_k <K>
//   <request> <position> <layer> <e_0> ... <e_{K-1}>
// Requests are numbered by the engine in submission order (RequestId).
// Tests: tests/unit/serve/trace_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/result.h"

namespace ferry::serve {

struct RouteKey {
  std::int64_t request = 0;
  std::int32_t position = 0;
  std::int32_t layer = 0;
  friend auto operator<=>(const RouteKey&, const RouteKey&) = default;
};

struct RoutingTrace {
  int experts = 0, top_k = 0;
  std::map<RouteKey, std::vector<std::int32_t>> routes;  // ordered: files are diff-able

  Status save(const std::string& path) const;
  static Result<RoutingTrace> load(const std::string& path);
  std::string to_text() const;
  static Result<RoutingTrace> parse(std::string_view text, std::string_view what);
};

class RoutingHook {
 public:
  virtual ~RoutingHook() = default;
  // ids: [K] the router's choice (descending weight); a hook may overwrite it.
  virtual Status on_route(const RouteKey& key, std::span<std::int32_t> ids) = 0;
  // True when the hook never reads the router's choice, only replaces it: then the runners ask
  // forced_route() for every (token, MoE layer) of a step before running it, in the order
  // on_route() would have been called (layer, then token), and never call on_route().
  virtual bool forces_ahead() const { return false; }
  // The forced experts of `key` into ids ([K]); false keeps the router's choice for that row.
  virtual Result<bool> forced_route(const RouteKey& key, std::span<std::int32_t> ids) {
    (void)key;
    (void)ids;
    return false;
  }
};

class TraceRecorder : public RoutingHook {
 public:
  TraceRecorder(int experts, int top_k) { trace_.experts = experts, trace_.top_k = top_k; }
  Status on_route(const RouteKey& key, std::span<std::int32_t> ids) override;
  const RoutingTrace& trace() const { return trace_; }

 private:
  RoutingTrace trace_;
};

// Forces the trace's experts; a (request, position, layer) missing from the trace is an error
// (strict) or keeps the router's choice (not strict).
class TraceReplayer : public RoutingHook {
 public:
  explicit TraceReplayer(RoutingTrace trace, bool strict = true)
      : trace_(std::move(trace)), strict_(strict) {}
  Status on_route(const RouteKey& key, std::span<std::int32_t> ids) override;
  bool forces_ahead() const override { return true; }
  Result<bool> forced_route(const RouteKey& key, std::span<std::int32_t> ids) override;
  std::uint64_t forced() const { return forced_; }

 private:
  RoutingTrace trace_;
  bool strict_;
  std::uint64_t forced_ = 0;
};

}  // namespace ferry::serve
