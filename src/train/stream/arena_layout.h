// SPDX-License-Identifier: Apache-2.0
// ArenaLayout: the streaming executor's host arena as data, computed from the parameter specs
// alone (nothing allocated): which parameters each unit holds (unit l < L is layer l, unit L the
// globals), where each parameter sits in its unit's sections, and every section's size.
// HostArena::allocate lays its memory out from it, and everything that sizes device memory from
// the arena's sections (GPU-resident layers, the device optimizer tail's staging) reads it, so
// `ferry plan`, which must know those bytes before any arena exists, computes them with the
// executor's own code from arena_layout_for() (cmd_plan_executor_fit.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/result.h"
#include "model/config.h"
#include "model/param_spec.h"
#include "train/optim/optim_modes.h"

namespace ferry::train::stream {

struct ParamLoc {
  int index = 0;                  // position in TrainState::master->named (param_specs order)
  int unit = 0;                   // layer, or L for the globals
  std::int64_t n = 0;             // elements
  std::int64_t offset = 0;        // elements from the start of its unit's sections
  std::int64_t block0 = 0;        // first 8-bit block (absmax entry) within the unit (8-bit only)
  std::int64_t state_offset = 0;  // bytes from the start of its unit's m (and v) section
  bool q8 = false;                // 8-bit states (else f32 m, v): --8bit-params
  bool decay = false;
  // Read by ModelCompute only as a GEMM weight operand (model::is_gemm_weight_role): on a GPU
  // with bf16 weight views its slot copy is read as bf16 in place (bf16_widen.h).
  bool gemm_weight = false;
};

// A unit's sections (host_arena.h describes each); an absent one has size 0.
enum class ArenaSection : std::uint8_t { kWeights, kMaster, kM, kV, kMAbsmax, kVAbsmax, kGrads };

struct ArenaLayout {
  struct Unit {
    std::vector<int> params;  // indices into `params`, in param_specs order
    std::int64_t elements = 0, blocks = 0, state_bytes = 0;
  };
  OptimMode mode;
  bool bf16_weights = false;  // the streaming copy is bf16 (bf16 masters, or bf16 compute)
  bool bf16_grads = false;
  std::vector<ParamLoc> params;
  std::vector<Unit> units;  // [L + 1]
  std::int64_t elements = 0;

  int num_units() const { return static_cast<int>(units.size()); }
  int globals_unit() const { return num_units() - 1; }
  bool bf16_master() const { return mode.master != MasterWeights::kF32; }
  std::size_t grad_size() const { return bf16_grads ? 2 : 4; }  // bytes per gradient element
  // Bytes of unit u's section s (its payload, before the arena's page padding).
  std::size_t section_bytes(int u, ArenaSection s) const;
};

// The layout of these parameters. bf16_compute: an fp32 master streams a bf16 copy (bf16
// masters always stream bf16). decay / q8: per parameter, in specs order.
ArenaLayout arena_layout(const std::vector<model::ParamSpec>& specs, int layers,
                         const OptimMode& mode, bool bf16_compute, bool bf16_grads,
                         const std::vector<bool>& decay, const std::vector<bool>& q8);

// HostArena::create_initialized's layout for `config`: weight decay by name, every parameter's
// states 8-bit in 8bit mode (no --8bit-params subset).
Result<ArenaLayout> arena_layout_for(const model::ModelConfig& config, const OptimMode& mode,
                                     bool bf16_compute, bool bf16_grads);

}  // namespace ferry::train::stream
