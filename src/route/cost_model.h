// SPDX-License-Identifier: Apache-2.0
// Latency and compute model of the two placements at offload budget ρ, with a network term the
// paper's model lacks:
//   t_net = rtt + frame_bytes·8 / uplink + server_queue            (per offloaded frame)
//   T_cond(ρ) = T_w + T_ec + ρ·(T_s + t_net)
//   T_skip(ρ) = T_e + (1−ρ)·T_w + ρ·(T_s + t_net)
//   saving(ρ) = T_cond − T_skip = ρ·T_w + T_ec − T_e; break-even ρ* = (T_e − T_ec)/T_w
//   edge GFLOPs: cond = G_w, skip = G_e + (1−ρ)·G_w; saving ρ·G_w − G_e
// With T_ec = 0 and t_net = 0 this is the paper's model; the artifact's numbers then give
// 19.15 ms (29.7 %) at ρ = 0.9, 3.888 GFLOPs, break-evens 0.1247 / 0.0341 and a 29.3x lighter
// estimator (tests/unit/route/paper_replay_test.cpp).
#pragma once

#include <string>

#include "core/result.h"
#include "route/csv.h"
#include "route/curves.h"

namespace ferry::route {

struct NetworkModel {
  double rtt_ms = 0;
  double uplink_mbps = 0;  // 0 = infinite (no transfer term)
  double frame_bytes = 0;
  double server_queue_ms = 0;
  double transfer_ms() const;  // rtt + upload + queue
};

struct CostModel {
  double t_weak_ms = 0, t_strong_ms = 0;
  double t_est_skip_ms = 0;  // pixel estimator (before the weak detector)
  double t_est_cond_ms = 0;  // conditioned estimator (after it); 0 in the paper's model
  double g_weak = 0, g_strong = 0, g_est_skip = 0;  // GFLOPs per frame
  NetworkModel net;

  double latency_ms(Placement p, double rho) const;
  double edge_gflops(Placement p, double rho) const;
  double latency_saving_ms(double rho) const;  // T_cond − T_skip
  double latency_break_even() const;           // ρ above which skipping is faster
  double compute_break_even() const;           // ρ above which skipping computes less
  // Largest ρ the uplink sustains at `fps` frames per second (1 if no bandwidth limit).
  double sustainable_rho(double fps) const;
};

// Reads T_w, T_s (detector_time_ms of weak_model / strong_model), G_w, G_s (gflops) and the skip
// estimator's inference_time_ms and gflops from the artifact's estimator_metrics.csv.
Result<CostModel> cost_model_from_metrics(const CsvTable& t, const std::string& skip_estimator);

// Cost-aware placement at ρ: maximise mAP − lambda_per_ms · latency; lambda 0 = the paper rule.
Placement cost_aware_choice(const CostModel& m, double rho, double map_skip, double map_cond,
                            double lambda_per_ms);
// A router table from two curves under the cost model.
Result<Router> cost_aware_router(const CostModel& m, const Curve& skip, const Curve& cond,
                                 double lambda_per_ms);

}  // namespace ferry::route
