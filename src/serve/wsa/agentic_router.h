// SPDX-License-Identifier: Apache-2.0
// AgenticRouter: the routing hook that drives an engine with an AgenticWorkload's calibrated
// routes (agentic_workload.h): every (request, position, layer) is forced to the route of
// (the request's session, position, layer), whatever the router chose. A route is a pure
// function of (session, position, layer), so the hook forces ahead by default
// (RoutingHook::forces_ahead): the runner asks for a whole step's routing before the forward
// pass, the CUDA runner uploads it in one copy (no host round trip per MoE layer) and paged decode
// steps can resolve their slots on the device (device_resolver.h) as CUDA graphs. ahead = false
// keeps the per-layer hook path (on_route after each MoE layer's router: one host round trip per
// MoE layer on CUDA), for A/B runs; both give the same routes, hence the same bits.
// The engine's layer index is the workload's layer: the built-in MoE's layers are all MoE
// (make_builtin_moe), which is what the engine bench and the tests run.
// Bind every request to its session (bind()) before the step that first computes it; an unbound
// request or a position / layer outside the workload is a status, not a guess.
// Tests: tests/unit/serve/wsa_device_resolve_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <span>

#include "serve/engine.h"
#include "serve/routing_trace.h"
#include "serve/wsa/agentic_workload.h"

namespace ferry::serve::wsa {

class AgenticRouter : public RoutingHook {
 public:
  explicit AgenticRouter(const AgenticWorkload& w, bool ahead = true) : w_(w), ahead_(ahead) {}
  void bind(RequestId id, int session) { session_of_[id] = session; }

  bool forces_ahead() const override { return ahead_; }
  Result<bool> forced_route(const RouteKey& key, std::span<std::int32_t> ids) override {
    FERRY_TRY(write_route(key, ids));
    return true;
  }
  Status on_route(const RouteKey& key, std::span<std::int32_t> ids) override {
    return write_route(key, ids);
  }

 private:
  Status write_route(const RouteKey& key, std::span<std::int32_t> ids) const {
    const auto it = session_of_.find(key.request);
    if (it == session_of_.end()) {
      return not_found("wsa: request {} has no session (AgenticRouter::bind)", key.request);
    }
    const int s = it->second;
    if (key.position < 0 || key.position >= w_.session_tokens(s) || key.layer < 0 ||
        key.layer >= w_.spec().moe_layers || int(ids.size()) != w_.spec().top_k) {
      return out_of_range(
          "wsa: no agentic route for session {} position {} layer {} top-{} (the workload has {} "
          "positions, {} layers, top-{})",
          s, key.position, key.layer, ids.size(), w_.session_tokens(s), w_.spec().moe_layers,
          w_.spec().top_k);
    }
    const auto r = w_.route(s, key.position, key.layer);
    for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = r[k];
    return ok_status();
  }

  const AgenticWorkload& w_;
  bool ahead_ = true;
  std::map<RequestId, int> session_of_;
};

}  // namespace ferry::serve::wsa
