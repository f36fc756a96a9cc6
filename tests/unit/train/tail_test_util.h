// SPDX-License-Identifier: Apache-2.0
// Shared by the device optimizer tail's CPU tests (stream_executor_tail_test.cpp,
// stream_executor_prestage_test.cpp): the bytes a tail unit moves, the consistency check of a
// streamed run with the tail against the in-memory reference, and the optimizer modes they use.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "train/stream/device_optimizer_tail.h"
#include "train/stream/host_arena.h"
#include "train_stream_util.h"

namespace ferry::train::stream::tail_test {

using Section = HostArena::Section;

// Bytes the tail moves per update of a unit (up: what the kernels read, the gradients included;
// down: what they wrote).
struct UnitBytes {
  std::uint64_t up = 0, down = 0, grads = 0;
};

// The same for every layer u, from an arena of the run's layout; [L].
inline std::vector<UnitBytes> tail_unit_bytes(const model::LoadedModel& m, const RunSpec& spec) {
  auto s = make_state(m, spec);
  auto arena = HostArena::create(*s);
  EXPECT_TRUE(arena.ok()) << arena.status().to_string();
  std::vector<UnitBytes> out;
  for (int u = 0; u < (*arena)->globals_unit(); ++u) {
    UnitBytes b;
    for (Section sec : {Section::kWeights, Section::kMaster, Section::kM, Section::kV,
                        Section::kMAbsmax, Section::kVAbsmax, Section::kGrads}) {
      const std::size_t n = (*arena)->section(u, sec).size;
      if (sec != Section::kWeights || (*arena)->bf16_master()) b.up += n;
      if (sec != Section::kGrads) b.down += n;
      if (sec == Section::kGrads) b.grads = n;
    }
    out.push_back(b);
  }
  return out;
}

inline std::uint64_t applied_steps(const RunResult& r) {
  std::uint64_t n = 0;
  for (const StepOutcome& o : r.outcomes) n += o.applied ? 1 : 0;
  return n;
}

// The streamed run equals the reference bit for bit, and the split the tail reports is
// consistent: at most K units per step, only layers 0..K-1, every layer taken by one side, the
// bytes those units move.
inline void check_run(const model::LoadedModel& m, const RunSpec& spec, const RunResult& ref,
                      const RunResult& st, const std::string& what) {
  const int L = m.geometry.layers;
  const int K = spec.device_update_layers == kDeviceUpdateAllLayers ? L : spec.device_update_layers;
  ASSERT_EQ(st.losses.size(), ref.losses.size()) << what;
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(st.losses[i], ref.losses[i]) << what << " step " << i;
    EXPECT_EQ(st.outcomes[i].grad_norm, ref.outcomes[i].grad_norm) << what << " step " << i;
  }
  expect_same_state(*ref.state, *st.state, what);
  const std::uint64_t applied = applied_steps(ref);
  EXPECT_EQ(st.tail.steps, applied) << what;
  EXPECT_LE(st.tail.units_updated, applied * static_cast<std::uint64_t>(K)) << what;
  EXPECT_EQ(st.tail.units_updated + st.tail.cpu_units, applied * static_cast<std::uint64_t>(L))
      << what;
  const auto bytes = tail_unit_bytes(m, spec);
  ASSERT_EQ(st.tail.unit_updates.size(), bytes.size()) << what;
  std::uint64_t up = 0, down = 0, units = 0;
  for (std::size_t u = 0; u < bytes.size(); ++u) {
    const std::uint64_t n = st.tail.unit_updates[u];
    if (static_cast<int>(u) >= K) {
      EXPECT_EQ(n, 0u) << what << " layer " << u;
    }
    EXPECT_LE(n, applied) << what << " layer " << u;
    units += n;
    up += n * bytes[u].up;
    down += n * bytes[u].down;
  }
  EXPECT_EQ(units, st.tail.units_updated) << what;
  EXPECT_EQ(st.tail.h2d_bytes, up) << what;
  EXPECT_EQ(st.tail.d2h_bytes, down) << what;
  EXPECT_LE(st.peak, st.planned) << what;
  EXPECT_EQ(st.tail.slots, spec.device_update_slots) << what;
  // Pre-staging: at every step's last micro-batch the first min(S, K) layers' sections but the
  // gradients, whether the device then took them or not; a hit is a unit the device took.
  const int staged = spec.device_update_prestage ? std::min(spec.device_update_slots, K) : 0;
  const auto steps = static_cast<std::uint64_t>(st.outcomes.size());
  std::uint64_t staged_bytes = 0;
  for (int u = 0; u < staged; ++u)
    staged_bytes +=
        bytes[static_cast<std::size_t>(u)].up - bytes[static_cast<std::size_t>(u)].grads;
  EXPECT_EQ(st.tail.prestaged_units, steps * static_cast<std::uint64_t>(staged)) << what;
  EXPECT_EQ(st.tail.prestaged_bytes, steps * staged_bytes) << what;
  EXPECT_LE(st.tail.prestage_hits, st.tail.prestaged_units) << what;
  EXPECT_LE(st.tail.prestage_hits, st.tail.units_updated) << what;
  // Per-unit times (host timers on the emulated tier): each unit's span holds its three phases.
  if (st.tail.units_updated > 0) {
    EXPECT_GT(st.tail.unit_s, 0.0) << what;
    EXPECT_GE(st.tail.unit_s, st.tail.unit_h2d_s + st.tail.unit_kernel_s + st.tail.unit_d2h_s)
        << what;
  } else {
    EXPECT_EQ(st.tail.unit_s, 0.0) << what;
  }
}

// Whatever the split the timing gives (no delays injected here); K = 1, 2, all by default, each
// with 1, 2 and 3 staging slots.
inline void check_tail(const model::LoadedModel& m, const std::vector<std::string>& policies,
                       RunSpec spec, const std::vector<int>& ks = {1, 2, kDeviceUpdateAllLayers},
                       const std::vector<int>& slots = {1, 2, 3}) {
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult ref = run_reference(m, spec, data);
  ASSERT_GT(applied_steps(ref), 0u);
  for (int K : ks) {
    spec.device_update_layers = K;
    for (int S : slots) {
      spec.device_update_slots = S;
      for (const std::string& p : policies) {
        const std::string what =
            p + " K=" + (K < 0 ? "all" : std::to_string(K)) + " slots=" + std::to_string(S);
        check_run(m, spec, ref, run_stream(m, spec, data, p), what);
      }
    }
  }
}

inline const OptimMode kKahan8{.master = MasterWeights::kBf16Kahan,
                               .states = OptimizerStates::k8Bit};
inline const OptimMode kSr8{.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
inline const OptimMode kF32x8{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit};

}  // namespace ferry::train::stream::tail_test
