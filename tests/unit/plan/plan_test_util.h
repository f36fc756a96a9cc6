// SPDX-License-Identifier: Apache-2.0
// Random small PlanProblems for the planner's property tests: costs, sizes, link rates and
// capacities drawn so that exposure, recompute and offloading all matter (slow links, tight GPU).
#pragma once

#include <algorithm>
#include <random>

#include "plan/problem.h"

namespace ferry::plan::testing {

inline double uniform(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

// L layers; NVMe tier when `nvme`. gpu_fraction in [0, 1] places the GPU capacity between the
// fixed need (0) and roughly "everything on the GPU" (1).
inline PlanProblem random_problem(std::mt19937_64& rng, int L, bool nvme, double gpu_fraction) {
  PlanProblem p;
  p.num_layers = L;
  p.boundary_gb.resize(L + 1);
  for (double& a : p.boundary_gb) a = uniform(rng, 0.1, 1.0);
  p.layers.resize(L);
  double max_work = 0;
  for (LayerCost& c : p.layers) {
    c.fwd_ms = uniform(rng, 1, 5);
    c.bwd_ms = c.fwd_ms * uniform(rng, 2, 3);
    c.rec_ms = c.fwd_ms * uniform(rng, 0.9, 1.1);
    c.weight_gb = uniform(rng, 0.02, 0.2);
    c.grad_gb = c.weight_gb * uniform(rng, 0.5, 1.0);
    c.work_fwd_gb = uniform(rng, 0.1, 0.5);
    c.work_bwd_gb = uniform(rng, 0.2, 1.0);
    max_work = std::max(max_work, c.work_bwd_gb);
  }
  p.loss_ms = uniform(rng, 1, 4);
  p.loss_work_gb = uniform(rng, 0.2, 1.0);
  p.head_weight_gb = uniform(rng, 0.02, 0.2);
  p.head_grad_gb = p.head_weight_gb;
  p.step_fixed_ms = uniform(rng, 0, 2);
  p.cpu_optimizer_ms = uniform(rng, 0, 30);
  p.link.h2d_gbps = uniform(rng, 20, 200);
  p.link.d2h_gbps = uniform(rng, 20, 200);
  p.link.duplex_gbps =
      uniform(rng, std::max(p.link.h2d_gbps, p.link.d2h_gbps), p.link.h2d_gbps + p.link.d2h_gbps);
  p.link.duplex_loaded_gbps = p.link.duplex_gbps * uniform(rng, 0.7, 1.0);
  if (nvme) {
    p.link.nvme_read_gbps = uniform(rng, 20, 100);
    p.link.nvme_write_gbps = uniform(rng, 20, 100);
    p.nvme_cap_gb = uniform(rng, 0.5, 3.0);
  }
  p.gpu_fixed_gb = uniform(rng, 0.5, 1.0);
  double all_act = 0;
  for (double a : p.boundary_gb) all_act += a;
  p.gpu_cap_gb = p.gpu_fixed_gb + max_work + 1.0 + gpu_fraction * all_act;
  p.host_fixed_gb = uniform(rng, 1, 2);
  p.host_cap_gb = p.host_fixed_gb + uniform(rng, 0, 0.7) * all_act;
  p.max_span = std::uniform_int_distribution<int>(1, std::min(L, 4))(rng);
  p.batch_size = 1;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "random";
  return p;
}

// Gives every layer a keep-internals choice (a separate draw, so random_problem's own stream, and
// the instances other tests draw from it, stay as they were): the re-forward saved is the
// backward's internals-only re-forward, a random share in [0.6, 1] of the recompute time (dense
// layers ~0.71, MoE ~1; never equal to rec_ms, so a solver that confuses the two disagrees with
// the others), and the kept bytes lie between `lo_gb` and `hi_gb`, so that with the GPU slack of
// random_problem (about 1 GB + a fraction of the activations) some layers fit and some do not.
inline void add_keep_costs(std::mt19937_64& rng, PlanProblem& p, double lo_gb, double hi_gb) {
  p.allow_keep_internals = true;
  for (LayerCost& c : p.layers) {
    c.internals_gb = uniform(rng, lo_gb, hi_gb);
    c.keep_saved_ms = std::min(c.rec_ms * uniform(rng, 0.6, 1.0), c.bwd_ms);
  }
}

// Four layers, the CPU 60 ms per layer (measured) after 100 ms of globals (cpu_optimizer_ms 340 =
// 100 + 4 * 60), the device 43 ms per layer. From the phase start:
//   K = all: the device takes 0 (done 43), 1 (86), 2 (129: at 86 it is free before the CPU,
//   which is busy with the globals until 100); at 100 the CPU takes 3 (done 160); they have met.
//   Ready relative to layer 0: (0, 43, 86, 117).
//   K = 2: the device stops after 0 (43) and 1 (86); the CPU takes 3 (160) and 2 (220):
//   (0, 43, 177, 117).
//   K = 1: the device takes 0 (43); the CPU 3 (160), 2 (220), 1 (280): (0, 237, 177, 117).
inline PlanProblem tail_four_layers() {
  std::mt19937_64 rng(1);
  PlanProblem p = random_problem(rng, 4, false, 0.5);
  for (LayerCost& c : p.layers) c.optimizer_ms = 60;
  p.cpu_optimizer_ms = 340;
  p.device_update_ms_per_layer = 43;
  return p;
}

// (nvme_bounce_test.cpp, reprice_test.cpp)
// Three layers, every boundary 1 GB, no working memory, no recompute (max span 1). Windows f0 f1
// f2 loss b2 b1 b0 (t = 0..6). With boundaries 0, 1 and 2 off the GPU (each sent in the window
// that reads it, back in the last window allowed, 2L - i - 1) every window holds 2 GB (t0: 0 and
// 1 being written / read, t1: 1 and 2, t2: 2 and 3, t3: 3 and 2 back, t4: 2 and 1, t5: 1 and 0,
// t6: 0). Boundary 2 on the GPU adds nothing (t1..t4 hold it anyway); boundary 1 on the GPU is
// also there in t2 (1 + 2 + 3 = 3 GB), boundary 0 in t1 (0 + 1 + 2 = 3 GB). So at 2.5 GB of GPU
// memory boundaries 0 and 1 must leave the GPU. Host memory: 1 GB of model state, 1.5 GB of
// capacity, so neither fits in host memory (2 GB each, 3 GB both); on NVMe they need 1 GB of host
// memory without the bounce buffer and 2 GB with it (one 1 GB buffer for both, not one each).
inline PlanProblem two_boundaries_must_leave_the_gpu() {
  PlanProblem p;
  p.num_layers = 3;
  p.boundary_gb = {1.0, 1.0, 1.0, 1.0};
  p.layers.resize(3);
  for (LayerCost& c : p.layers) {
    c.fwd_ms = 10;
    c.bwd_ms = 20;
    c.rec_ms = 10;
    c.weight_gb = 0.1;
    c.grad_gb = 0.1;
  }
  p.loss_ms = 5;
  p.head_weight_gb = p.head_grad_gb = 0.1;
  p.link = LinkRates{.h2d_gbps = 50,
                     .d2h_gbps = 50,
                     .duplex_gbps = 90,
                     .duplex_loaded_gbps = 80,
                     .nvme_read_gbps = 5,
                     .nvme_write_gbps = 4};
  p.gpu_cap_gb = 2.5;
  p.host_fixed_gb = 1.0;
  p.host_cap_gb = 1.5;
  p.nvme_cap_gb = 10;
  p.max_span = 1;
  p.allow_keep_internals = false;
  p.batch_size = 1;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "test";
  return p;
}

}  // namespace ferry::plan::testing
