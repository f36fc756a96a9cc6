// SPDX-License-Identifier: Apache-2.0
// A multi-session agentic workload (serve.md MV-WSA; WiSP's AgentInstruct setting): `sessions`
// sessions, each with a private prefix (~1.5k tokens, jittered) and `turns` turns; a turn sends the
// whole session context so far plus a new user message and generates an answer, which joins the
// context. Sessions run concurrently (the engine's max_running bounds how many at once); a
// session's next turn arrives `think_s` after its previous answer (tool time).
// Routing: every session position has its own expert choice per MoE layer, drawn with the
// calibrated locality of trace_synth.h (per-layer Zipf popularity, P(repeat) and reuse within 8
// tokens), prefill locality for prefix and user tokens, decode locality for answers. A position's
// routing is fixed, so a recomputed or re-sent position routes the same way (same token, same
// router). The same workload drives the split simulator (split_sim.h) and, through turn_prompt(),
// the engine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ferry::serve::wsa {

struct AgenticSpec {
  int sessions = 8;
  int turns = 4;
  int prefix_tokens = 1536;               // private prefix of each session (+- 12.5 % jitter)
  int user_min = 64, user_max = 256;      // new user tokens per turn
  int output_min = 64, output_max = 256;  // generated tokens per turn
  double think_s = 0.0;                   // between an answer and the session's next turn
  // Phased variant (0: off, the default): turns come in phases of `phase_turns` turns; turns of
  // even phases are as above (chat: short answers, each re-sending a growing history: what the
  // prefix cache and so KV capacity serve), turns of odd phases generate long answers of
  // long_output_min..long_output_max tokens (decode: what expert slots serve). Sessions run
  // round-robin through the queue, so the phases are (roughly) global: a workload whose best
  // split changes over time, the case a live controller is for (docs/serve_wsa.md). The random
  // draws are the same as without phases (one per turn's output), only the range differs.
  int phase_turns = 0;
  int long_output_min = 512, long_output_max = 1024;
  // Routing geometry and calibration (trace_synth.h's defaults).
  int moe_layers = 4;
  int experts = 128;
  int top_k = 8;
  double zipf_s = 1.0;
  double p_repeat = 0.45, reuse_within8 = 0.80;
  double prefill_p_repeat = 0.15, prefill_reuse_within8 = 0.45;
  std::uint64_t seed = 1;
};

struct AgenticTurn {
  int context = 0;          // session tokens before this turn (prefix + earlier turns)
  int user = 0;             // new user tokens
  int output = 0;           // tokens to generate
  bool long_phase = false;  // phased variant: a turn of a long-answer phase
  int prompt() const { return context + user; }
};

class AgenticWorkload {
 public:
  explicit AgenticWorkload(const AgenticSpec& spec);
  const AgenticSpec& spec() const { return spec_; }
  int sessions() const { return spec_.sessions; }
  const std::vector<AgenticTurn>& turns(int session) const { return turns_[std::size_t(session)]; }
  int session_tokens(int session) const;  // the session's final context length
  int max_context() const;                // over sessions: prompt + output of the last turn
  // [top_k] experts of (session, position, layer), position < session_tokens(session).
  std::span<const std::uint8_t> route(int session, int position, int layer) const;
  // Token ids of a turn's prompt (deterministic per session and position) for driving an engine.
  std::vector<std::int32_t> turn_prompt(int session, int turn, int vocab) const;
  // The prompt of turn + 1 as a client re-sends it: this turn's prompt, the model's reply, then
  // the user's new message (turn_prompt(session, turn + 1) past that length).
  std::vector<std::int32_t> next_turn_prompt(int session, int turn,
                                             std::span<const std::int32_t> prompt,
                                             std::span<const std::int32_t> reply, int vocab) const;

 private:
  AgenticSpec spec_;
  std::vector<std::vector<AgenticTurn>> turns_;
  std::vector<std::vector<std::uint8_t>> routes_;  // [S][pos * layers * K + layer * K + k]
};

}  // namespace ferry::serve::wsa
