// SPDX-License-Identifier: Apache-2.0
// The staging/expert slot state machine (style.md "Reuse only after the consumer's event
// completes"). Legal transitions, and nothing else:
//
//   kFree ──acquire──▶ kLoading ──loaded──▶ kReady ──begin_use──▶ kInUse ──consumer event done──▶
//   kFree
//                                              │
//                                              └──discard (prefetched, never used)──▶ kFree
//
//   kFree     no producer or consumer touches the bytes; the only state a slot may be acquired in
//   kLoading  a producer (CPU write, NVMe read, D2H copy) is filling it
//   kReady    filled; no consumer yet
//   kInUse    a consumer (H2D copy, kernel) reads it; it returns to kFree only after the event
//             recorded after the consumer's last use has completed
//
// An illegal transition is a bug in the scheduler that drives the slot: transition() aborts
// through FERRY_CHECK naming the slot and both states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/check.h"

namespace ferry::mem {

enum class SlotState : std::uint8_t { kFree, kLoading, kReady, kInUse };

constexpr std::string_view to_string(SlotState s) {
  switch (s) {
    case SlotState::kFree:
      return "free";
    case SlotState::kLoading:
      return "loading";
    case SlotState::kReady:
      return "ready";
    case SlotState::kInUse:
      return "in-use";
  }
  return "?";
}

constexpr bool is_legal_transition(SlotState from, SlotState to) {
  switch (from) {
    case SlotState::kFree:
      return to == SlotState::kLoading;
    case SlotState::kLoading:
      return to == SlotState::kReady;
    case SlotState::kReady:
      return to == SlotState::kInUse || to == SlotState::kFree;
    case SlotState::kInUse:
      return to == SlotState::kFree;
  }
  return false;
}

// Moves `state` to `to` or aborts. `slot` only labels the message.
inline void transition(SlotState& state, SlotState to, std::size_t slot) {
  FERRY_CHECK(is_legal_transition(state, to), "mem: illegal slot transition {} -> {} (slot {})",
              to_string(state), to_string(to), slot);
  state = to;
}

}  // namespace ferry::mem
