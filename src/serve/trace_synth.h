// SPDX-License-Identifier: Apache-2.0
// A synthetic routing trace generator calibrated to published decode locality (serve.md item 7),
// for replay on random-weight models where the router's own choices carry no locality.
// Per MoE layer: expert popularity is Zipf(s) over a random permutation of the experts. Each of
// a token's K picks is, with probability
//   p_repeat                  one of the previous token's experts          (P(repeat) ~ 0.45)
//   reuse_within8 - p_repeat  one of the last 8 tokens' other experts     (80 % reuse within 8)
//   the rest                  a fresh Zipf draw outside the last 8 tokens
// so the two targets hold by construction whenever the candidate sets are non-empty (E >> 8K).
// Each session starts with a prefill burst (prefill_tokens, weaker locality: its own two
// probabilities) followed by decode_tokens. The spread profile (stress) draws every pick iid from
// a uniform popularity, the case where LRU is known to fail.
// measure_locality() recomputes both statistics from a trace (tests check the calibration).
#pragma once

#include <cstdint>
#include <vector>

#include "serve/routing_trace.h"

namespace ferry::serve {

struct SyntheticTraceSpec {
  int experts = 128;
  int top_k = 8;
  std::vector<int> moe_layers = {0};  // layer indices to emit
  int sessions = 1;                   // request ids 0..sessions-1
  int prefill_tokens = 32;
  int decode_tokens = 128;
  double zipf_s = 1.0;
  double p_repeat = 0.45;
  double reuse_within8 = 0.80;
  double prefill_p_repeat = 0.15;
  double prefill_reuse_within8 = 0.45;
  bool spread = false;  // stress profile: uniform iid routing, no locality
  std::uint64_t seed = 1;
};

RoutingTrace make_synthetic_trace(const SyntheticTraceSpec& spec);

struct LocalityStats {
  double repeat_next = 0;    // share of picks that the previous token also used
  double reuse_within8 = 0;  // share of picks used by any of the previous 8 tokens
  std::int64_t picks = 0;
};

// Over positions [first_position, last_position] of every request in `layer` (positions with
// fewer than 8 predecessors are skipped so the window is full).
LocalityStats measure_locality(const RoutingTrace& trace, int layer, int first_position,
                               int last_position);

}  // namespace ferry::serve
