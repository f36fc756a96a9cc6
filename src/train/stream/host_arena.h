// SPDX-License-Identifier: Apache-2.0
// HostArena: the streaming executor's host-resident model state in ONE exact-size, page-aligned
// allocation of the mem layer's pinned host tier (cudaHostAlloc in CUDA builds, mmap'd pages in
// CPU builds), laid out unit by unit — unit l < L is layer l, unit L the globals (embedding,
// final norm, untied lm_head) — and inside a unit section by section:
//   weights   the streaming copy the device reads: with an fp32 master f32, or bf16 (the master
//             rounded by the update) when the state computes with bf16 weights
//             (TrainState::use_bf16_compute); with a bf16 master the bf16 weights themselves (the
//             truth, updated in place). bf16 weights stream as bf16 and are widened on the device
//             side (bf16_widen.h)
//   master    f32 master weights (what AdamW updates; copied into `weights` after the update),
//             the bf16 Kahan compensation (bf16-kahan), or nothing (bf16-sr)
//   states    f32 m, v — or 8-bit m, v codes + one f32 absmax per 2048 (optim/q8_code.h) — per
//             parameter (--8bit-params may select a subset), so the m and v sections are the
//             unit's mixture: 4 bytes per f32-state element, 1 per 8-bit one
//   grads     gradient landing buffer (accumulated over micro-batches): f32, or bf16 with
//             TrainState::bf16_grads (the D2H and the optimizer read half the bytes)
// Each section holds the unit's parameters back to back in param_specs order and starts on a
// 4096-byte page, so a unit's weights are one contiguous copy and its state is adjacent.
// With bf16 masters the arena's bytes/param are host_bytes_per_param(mode, f32 grads) plus page
// padding (the fp32 master keeps an f32 streaming copy on the CPU backend: 2 bytes more).
// Ownership: the arena owns its memory; TrainState stays the checkpoint/eval/export format, with
// load_from / store_to copying bit for bit. Tests: tests/unit/train/stream_executor_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/result.h"
#include "mem/arena.h"
#include "mem/budget.h"
#include "model/param_spec.h"
#include "train/optim/optim_modes.h"
#include "train/stream/arena_layout.h"
#include "train/stream/cpu_tiers.h"
#include "train/train_state.h"

namespace ferry::train::stream {

class HostArena {
 public:
  // Sizes the arena for `s`'s geometry and mode, then copies s's weights and states in.
  // tier: cpu_pinned_tier() for the CPU executor; MemTier::kPinnedHost (cudaHostAlloc) when a
  // GPU streams from it.
  static Result<std::unique_ptr<HostArena>> create(const TrainState& s,
                                                   mem::MemTier tier = cpu_pinned_tier());
  // A fresh model's arena with no TrainState in between (`ferry bench train` at sizes where a
  // TrainState and the arena would not fit host memory together): create()'s layout for
  // `config` and `mode` (8-bit states for every parameter in 8bit mode), each parameter's f32
  // values from init(i, out), called for i = 0, 1, ... in order (bf16 masters round them to bf16
  // as TrainState::from_loaded does); states, Kahan compensation and gradients zero. The same
  // bytes create(TrainState::from_loaded(m, mode)) holds for a model m with those values (tested).
  static Result<std::unique_ptr<HostArena>> create_initialized(
      const model::ModelConfig& config, const OptimMode& mode, mem::MemTier tier,
      const std::function<void(std::size_t, float*)>& init, bool bf16_compute = false,
      bool bf16_grads = false);
  // Back to create_initialized's bytes for `init` on this arena's layout (after training on it):
  // `ferry bench train` reuses one pinned arena for every policy instead of pinning tens of GB
  // again per policy.
  void reinitialize(const std::function<void(std::size_t, float*)>& init);
  // Where create_initialized / the last reinitialize spent their time, in seconds (`ferry bench
  // train` reports them: a 7B arena took ~61 s before the first step on the H200, parts unknown):
  // allocating (pinning) the arena, zeroing states / compensation / gradients, drawing the
  // weights (init), rounding them to the bf16 streaming copy or master.
  struct SetupTimes {
    double allocate_s = 0, zero_s = 0, init_s = 0, round_s = 0;
  };
  const SetupTimes& setup_times() const { return setup_times_; }

  Status load_from(const TrainState& s);  // weights + master + states (grads zeroed)
  Status store_to(TrainState& s) const;   // master + states, bit for bit
  // Where everything sits (arena_layout.h): what device-memory sizes are computed from.
  const ArenaLayout& layout() const { return layout_; }
  int num_units() const { return layout_.num_units(); }
  int globals_unit() const { return layout_.globals_unit(); }
  const std::vector<ParamLoc>& params() const { return layout_.params; }
  const std::vector<int>& unit_params(int u) const { return layout_.units[u].params; }
  std::int64_t unit_elements(int u) const { return layout_.units[u].elements; }
  std::int64_t unit_blocks(int u) const { return layout_.units[u].blocks; }
  std::int64_t max_layer_elements() const;

  // fp32 master: the master; its streaming copy is weights() (f32) or w16() (bf16_weights()).
  float* weights(int u) const { return arena_.as<float>(units_[u].weights); }
  float* master(int u) const { return arena_.as<float>(units_[u].master); }
  // bf16 streaming weights (bf16 masters: the weights themselves) and the Kahan compensation.
  std::uint16_t* w16(int u) const { return arena_.as<std::uint16_t>(units_[u].weights); }
  std::uint16_t* comp16(int u) const { return arena_.as<std::uint16_t>(units_[u].master); }
  bool bf16_master() const { return layout_.bf16_master(); }
  // The streaming copy is bf16 (bf16 masters, or an fp32 master computing with bf16 weights).
  bool bf16_weights() const { return layout_.bf16_weights; }
  // Bytes of unit u's streaming weights (what one H2D copy of the unit moves).
  std::size_t unit_weight_bytes(int u) const;
  // One parameter's states: f32 m, v (!p.q8) or the 8-bit codes and block scales (p.q8).
  float* m32(const ParamLoc& p) const {
    return reinterpret_cast<float*>(state(units_[p.unit].m, p));
  }
  float* v32(const ParamLoc& p) const {
    return reinterpret_cast<float*>(state(units_[p.unit].v, p));
  }
  std::uint8_t* m8(const ParamLoc& p) const { return state(units_[p.unit].m, p); }
  std::uint8_t* v8(const ParamLoc& p) const { return state(units_[p.unit].v, p); }
  float* m_absmax(const ParamLoc& p) const {
    return arena_.as<float>(units_[p.unit].m_absmax) + p.block0;
  }
  float* v_absmax(const ParamLoc& p) const {
    return arena_.as<float>(units_[p.unit].v_absmax) + p.block0;
  }
  // The unit's gradient landing buffer: f32, or bf16 with bf16 gradients (grads16).
  float* grads(int u) const {
    FERRY_CHECK(!layout_.bf16_grads, "train: the arena's gradients are bf16");
    return arena_.as<float>(units_[u].grads);
  }
  std::uint16_t* grads16(int u) const {
    FERRY_CHECK(layout_.bf16_grads, "train: the arena's gradients are f32");
    return arena_.as<std::uint16_t>(units_[u].grads);
  }
  bool bf16_grads() const { return layout_.bf16_grads; }
  std::size_t grad_size() const { return layout_.grad_size(); }  // bytes per gradient element
  std::uint8_t* grad_bytes(int u) const { return arena_.as<std::uint8_t>(units_[u].grads); }

  // Unit u's sections as raw bytes, for moving a unit's optimizer state whole (the device
  // optimizer tail, device_optimizer_tail.h); an absent section (no master with bf16-sr, no
  // block scales without 8-bit parameters) is {nullptr, 0}.
  using Section = ArenaSection;
  struct Bytes {
    std::uint8_t* data = nullptr;
    std::size_t size = 0;
  };
  Bytes section(int u, Section s) const;

  const OptimMode& mode() const { return layout_.mode; }
  std::size_t total_bytes() const { return arena_.plan().allocation_bytes(); }
  std::int64_t num_elements() const { return layout_.elements; }
  double bytes_per_param() const { return double(total_bytes()) / double(layout_.elements); }

 private:
  struct Unit {  // the unit's sections in arena_ (sizes: layout_)
    mem::SlotId weights, master, m, v, m_absmax, v_absmax, grads;
  };
  explicit HostArena(mem::MemTier tier) : budget_(tier) {}
  SetupTimes setup_times_;
  // Allocates (contents undefined) the arena of this layout, each section on its own page.
  static Result<std::unique_ptr<HostArena>> allocate(ArenaLayout layout, mem::MemTier tier);
  Status check_layout(const TrainState& s) const;  // same mode and 8-bit selection
  // fp32 master: its streaming copy (f32, or bf16 rounded to nearest even) from the master.
  void write_streaming_copy(const ParamLoc& p) const;
  std::uint8_t* state(mem::SlotId section, const ParamLoc& p) const {
    return arena_.as<std::uint8_t>(section) + p.state_offset;
  }

  ArenaLayout layout_;
  std::vector<Unit> units_;
  mem::MemoryBudget budget_;
  mem::Arena arena_;
};

}  // namespace ferry::train::stream
