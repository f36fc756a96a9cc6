// SPDX-License-Identifier: Apache-2.0
// The search over the device optimizer tail (PlanProblem::device_update_layers, docs/plan.md "the
// device optimizer tail in the gate"): `--device-update-layers auto` picks the K (0 = the CPU
// updates every layer .. L - resident layers) of the smallest predicted objective (step + move
// penalty, as the resident search; ties: the smaller K, since device updates cost GPU memory and
// H2D traffic).
//
// Why not one solve per K, and why not one solve in all. K enters the problem in four places
// only: the optimizer gate (optimizer_ready_ms U_j, optimizer_phase_ms), the tail's H2D bytes on
// the link in the forward windows (device_tail_h2d_gb), the serial layer-0 update
// (device_tail_serial_ms: the same for every K > 0, none at K = 0) and the staging's GPU memory
// (device_tail_gpu_gb: likewise). For a fixed plan the objective max(gpu + wait(U), phase) + ...
// is non-decreasing in every U_j, in the phase, in every window's link bytes (a window's exposure
// is a maximum of its bytes over rates minus its compute) and in the serial time, so so is each
// K's optimum. Hence if K' has U, phase, bytes and serial time <= K's pointwise ("K' dominates
// K") and K' needs no more memory (K' = 0, or both > 0), K' is at least as good: K needs no
// solve. That is cheap (a simulation per K) but does not pick K alone: the U of two K cross in
// general (the CPU's top layers are ready earlier, the device's bottom ones later, and which
// matters depends on the plan's exposure per forward window), so the K left undominated (K = 0
// and the minimal gates among K > 0) are each solved. With K >= 1 the gates differ only in which
// side updates layers first+K-1 .. (layer j: the device's done time or the CPU's, and the device's
// bytes in f(j-1) or none), and K beyond the meeting point change nothing (one gate); where the
// device is at least as fast per layer and moves no bytes the gates form a chain and two solves
// remain (K = 0 and the meeting point). The tail's bytes grow with K, so with them a larger K
// seldom dominates a smaller one and more K are solved.
// Ties: a K dominated only by larger ones (so possibly tied with the best) is priced with the best
// plan (evaluate, no solve; same memory as any K > 0): if that plan's objective is the best's, K
// ties and the smallest such K is taken. Not covered: a tie through a different plan of equal
// objective (exact equality of two plans' objectives). tests/unit/plan/device_tail_search_test.cpp
// holds the search to solving every K with the exact solver.
#pragma once

#include <vector>

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/search.h"

namespace ferry::plan {

// p with device_update_layers = k (clamped to [0, L]).
PlanProblem at_device_tail(const PlanProblem& p, int k);

// What a tail K changes in the problem besides the staging: the optimizer gate (U_j and the
// phase), the tail's H2D on the link per window and the serial layer-0 update.
struct TailGate {
  int k = 0;
  std::vector<double> ready_ms;  // [L] optimizer_ready_ms
  double phase_ms = 0;           // optimizer_phase_ms
  std::vector<double> h2d_gb;    // [2L+1] device_tail_h2d_gb
  double serial_ms = 0;          // device_tail_serial_ms
};
// The distinct gates of K = 0 .. L - resident layers (K > 0 with the gate of a smaller K > 0 left
// out: the same objective, and the smaller K wins the tie), K ascending.
std::vector<TailGate> distinct_tail_gates(const PlanProblem& p);

struct DeviceTailSearch {
  Plan plan;                         // the best plan; plan.device_update_layers is its K
  std::vector<int> solved;           // the K solved, in order
  std::vector<double> objective_ms;  // [solved] each K's objective (infinity: nothing fits)
  int gates = 0;                     // distinct gates (the K that could differ)
};

// Solves K = 0 and the undominated K > 0 (above) with `solve`. A failure at K = 0 is returned as
// it is (nothing fits at K = 0: nor with the staging); at K > 0 "does not fit" (resource_exhausted,
// deadline_exceeded: the staging does not fit) leaves K = 0; other errors are returned.
Result<DeviceTailSearch> search_device_tail(const PlanProblem& p, const Planner& solve);

// A Planner that runs search_device_tail around `solve` (inside resident_planner, so each
// resident K has its best tail on the layers above the resident ones).
Planner device_tail_planner(Planner solve);

}  // namespace ferry::plan
