// SPDX-License-Identifier: Apache-2.0
// The per-layer "keep internals" choice (issue #7, docs/plan.md): on a 2-layer problem priced by
// hand, which layer the solvers keep as the GPU budget grows, the evaluator's memory and backward
// time for a kept layer, the tie-breaker when keeping saves nothing, the problem's validation and
// the bytes the cost model gives a kept layer. Random instances: milp_exact_test.cpp
// (SameOptimumWithKeptInternals), schedule_lp_test.cpp, json_cost_test.cpp.
#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/model_compute.h"
#include "plan/cost_model.h"
#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/geometry.h"
#include "plan/milp.h"

namespace ferry::plan {
namespace {

// Two layers, every boundary empty (homes cost nothing) and max span 1 (no recompute), so the
// keep choice is the only one that matters. Layer 0: forward 2, backward 8 (re-forward 2 inside);
// layer 1: forward 3, backward 9 (re-forward 3). Loss 3 ms. Step without keeps: 2 + 3 + 3 + 9 + 8
// = 25 ms. Kept internals: layer 0 1.0 GB, held in windows f0..b0 (0..4); layer 1 1.5 GB, held in
// f1..b1 (1..3). Fixed GPU memory 1 GB, no working memory. Weights and gradients of 1 MB at
// 100 GB/s take 0.01 ms per window: always hidden (the shortest window, b0 kept, computes 6 ms).
PlanProblem two_layers(double gpu_cap_gb, double optimizer_ms = 0) {
  PlanProblem p;
  p.num_layers = 2;
  p.boundary_gb = {0, 0, 0};
  p.layers = {LayerCost{.fwd_ms = 2,
                        .bwd_ms = 8,
                        .rec_ms = 2,
                        .weight_gb = 0.001,
                        .grad_gb = 0.001,
                        .internals_gb = 1.0,
                        .keep_saved_ms = 2},
              LayerCost{.fwd_ms = 3,
                        .bwd_ms = 9,
                        .rec_ms = 3,
                        .weight_gb = 0.001,
                        .grad_gb = 0.001,
                        .internals_gb = 1.5,
                        .keep_saved_ms = 3}};
  p.loss_ms = 3;
  p.head_weight_gb = 0.001;
  p.head_grad_gb = 0.001;
  p.cpu_optimizer_ms = optimizer_ms;
  p.link = LinkRates{100, 100, 200, 200, 0, 0};
  p.gpu_cap_gb = gpu_cap_gb;
  p.gpu_fixed_gb = 1;
  p.host_cap_gb = 100;
  p.max_span = 1;
  p.batch_size = 1;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "hand";
  return p;
}

Plan all_gpu_plan(std::vector<bool> keep) {
  Plan plan;
  plan.num_layers = 2;
  plan.homes = {Home::kGpu, Home::kGpu, Home::kGpu};
  plan.spans = {{0, 1, false}, {1, 2, false}};
  plan.keep_internals = std::move(keep);
  return plan;
}

TEST(KeepInternals, EvaluatorPricesAKeptLayerByHand) {
  const PlanProblem p = two_layers(10);
  // Layer 0 kept: b0 (window 4) computes 8 - 2 = 6 ms; 1 GB more in every window.
  auto r0 = evaluate(p, all_gpu_plan({true, false}));
  ASSERT_TRUE(r0.ok()) << r0.status().to_string();
  EXPECT_NEAR(r0->window_compute_ms[4], 6, 1e-12);
  EXPECT_NEAR(r0->window_compute_ms[3], 9, 1e-12);
  EXPECT_NEAR(r0->step_ms, 23, 1e-9);
  EXPECT_NEAR(r0->exposed_ms, 0, 1e-12);
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(r0->window_gpu_gb[t], 2.0, 1e-12) << "window " << t;
  EXPECT_NEAR(r0->kept_internals_gb, 1.0, 1e-12);
  EXPECT_NEAR(r0->objective_ms, 23 + 1.0 * p.move_penalty_ms_per_gb, 1e-12);
  // Layer 1 kept: b1 computes 6; 1.5 GB held in f1, loss and b1 only (windows 1..3).
  auto r1 = evaluate(p, all_gpu_plan({false, true}));
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  EXPECT_NEAR(r1->window_compute_ms[3], 6, 1e-12);
  EXPECT_NEAR(r1->step_ms, 22, 1e-9);
  const double want_gb[] = {1.0, 2.5, 2.5, 2.5, 1.0};
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(r1->window_gpu_gb[t], want_gb[t], 1e-12) << t;
  EXPECT_NEAR(r1->gpu_peak_gb, 2.5, 1e-12);
  // Both: 25 - 5 = 20 ms, 3.5 GB in windows 1..3.
  auto r2 = evaluate(p, all_gpu_plan({true, true}));
  ASSERT_TRUE(r2.ok());
  EXPECT_NEAR(r2->step_ms, 20, 1e-9);
  EXPECT_NEAR(r2->gpu_peak_gb, 3.5, 1e-12);
  // Empty and all-false are the same plan: nothing kept, 25 ms.
  auto none = evaluate(p, all_gpu_plan({}));
  auto none2 = evaluate(p, all_gpu_plan({false, false}));
  ASSERT_TRUE(none.ok() && none2.ok());
  EXPECT_NEAR(none->step_ms, 25, 1e-9);
  EXPECT_EQ(*none, *none2);
  // Malformed: a flag per layer, and only where the problem offers the choice.
  EXPECT_FALSE(evaluate(p, all_gpu_plan({true})).ok());
  PlanProblem off = p;
  off.allow_keep_internals = false;
  EXPECT_FALSE(evaluate(off, all_gpu_plan({true, false})).ok());
  PlanProblem no_saving = p;
  no_saving.layers[1].keep_saved_ms = 0;
  EXPECT_FALSE(evaluate(no_saving, all_gpu_plan({false, true})).ok());
}

// A keep saves the internals-only re-forward (keep_saved_ms), while a span through the kept layer
// still re-runs its full forward (rec_ms) to regenerate the boundary above it. Layer 0 saves 1.4
// of its 2 ms forward (share 0.7); span 0 -> 2 (boundary 1 recomputed), layer 0 kept:
// b1 = 9 + rec_0 2 = 11, b0 = 8 - 1.4 = 6.6; step 2 + 3 + 3 + 11 + 6.6 = 25.6 ms (the span's
// 1 MB of weights in b1 is hidden). Using rec_ms for the saving would give b0 = 6 (25.0 ms); using
// the saving for the recompute would give b1 = 10.4 (25.0 ms).
TEST(KeepInternals, KeptLayerInsideASpanSavesTheReforwardAndRecomputesInFull) {
  PlanProblem p = two_layers(10);
  p.max_span = 2;
  p.layers[0].keep_saved_ms = 1.4;
  Plan plan;
  plan.num_layers = 2;
  plan.homes = {Home::kGpu, Home::kRecompute, Home::kGpu};
  plan.spans = {{0, 2, false}};
  plan.keep_internals = {true, false};
  auto r = evaluate(p, plan);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->window_compute_ms[3], 11, 1e-12);
  EXPECT_NEAR(r->window_compute_ms[4], 6.6, 1e-12);
  EXPECT_NEAR(r->exposed_ms, 0, 1e-12);
  EXPECT_NEAR(r->step_ms, 25.6, 1e-9);
}

// Which layers the solvers keep as the budget grows: 1.5 GB holds none (25 ms); 2.2 GB holds
// layer 0's 1 GB, not layer 1's 1.5 (23 ms); 3.0 GB holds layer 1 alone (22 ms, better than
// layer 0) but not both (3.5); 4 GB holds both (20 ms). With the switch off: 25 ms at any budget.
TEST(KeepInternals, SolversKeepWhatFitsAndSavesMost) {
  struct Case {
    double cap_gb;
    std::vector<bool> keep;
    double step_ms;
  };
  const Case cases[] = {
      {1.5, {}, 25}, {2.2, {true, false}, 23}, {3.0, {false, true}, 22}, {4.0, {true, true}, 20}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "gpu cap " << c.cap_gb << " GB");
    const PlanProblem p = two_layers(c.cap_gb);
    auto milp = solve_milp(p);
    ASSERT_TRUE(milp.ok()) << milp.status().to_string();
    EXPECT_EQ(milp->keep_internals, c.keep);
    EXPECT_NEAR(milp->predicted.step_ms, c.step_ms, 1e-6);
    EXPECT_TRUE(check_fits(p, milp->predicted).ok());
    auto exact = solve_exact(p);
    ASSERT_TRUE(exact.ok()) << exact.status().to_string();
    EXPECT_EQ(exact->best.keep_internals, c.keep);
    EXPECT_NEAR(exact->best.solver.objective_ms, milp->solver.objective_ms, 1e-6);
    PlanProblem off = p;
    off.allow_keep_internals = false;
    auto milp_off = solve_milp(off);
    ASSERT_TRUE(milp_off.ok());
    EXPECT_TRUE(milp_off->keep_internals.empty());
    EXPECT_NEAR(milp_off->predicted.step_ms, 25, 1e-6);
  }
}

// When the CPU optimizer outlasts the GPU (60 ms against a 20..25 ms step), keeping saves nothing:
// every plan's step is 60 ms and the penalty on kept bytes picks the plan that keeps nothing.
TEST(KeepInternals, EqualStepsKeepNothing) {
  const PlanProblem p = two_layers(4.0, 60);
  auto milp = solve_milp(p);
  ASSERT_TRUE(milp.ok()) << milp.status().to_string();
  EXPECT_NEAR(milp->predicted.step_ms, 60, 1e-6);
  EXPECT_EQ(milp->num_kept(), 0);
  auto exact = solve_exact(p);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->best.num_kept(), 0);
}

TEST(KeepInternals, ProblemValidationAndJsonDefaults) {
  PlanProblem p = two_layers(4.0);
  ASSERT_TRUE(validate(p).ok());
  p.layers[0].keep_saved_ms = 8.5;  // more than the backward it is part of
  EXPECT_FALSE(validate(p).ok());
  p.layers[0].keep_saved_ms = 2;
  p.layers[0].internals_gb = -1;
  EXPECT_FALSE(validate(p).ok());
  p.layers[0].internals_gb = 1;
  // Round trip keeps the fields and the switch.
  p.allow_keep_internals = false;
  auto back = problem_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_FALSE(back->allow_keep_internals);
  EXPECT_EQ(back->layers[1].internals_gb, 1.5);
  EXPECT_EQ(back->layers[1].keep_saved_ms, 3);
  EXPECT_EQ(to_json(*back), to_json(p));
  // A document written before the choice existed: no switch, no per-layer fields -> keeps nothing.
  Json old = to_json(two_layers(4.0));
  old.erase("allow_keep_internals");
  for (Json& l : old["layers"]) {
    l.erase("internals_gb");
    l.erase("keep_saved_ms");
  }
  auto old_p = problem_from_json(old);
  ASSERT_TRUE(old_p.ok()) << old_p.status().to_string();
  EXPECT_FALSE(old_p->allow_keep_internals);
  EXPECT_EQ(old_p->layers[0].keep_saved_ms, 0);
  auto old_plan = solve_milp(*old_p);
  ASSERT_TRUE(old_plan.ok());
  EXPECT_EQ(old_plan->num_kept(), 0);
}

// Kept bytes: ModelCompute's f32 LayerActs per token, without x_in (the boundary). Qwen2.5-7B (C
// 3584, H 28, G 4, D 128: Q 3584, K 512, F 18944, no q/k norm): h1, x_mid, h2 (3C) + rstd1, rstd2
// (2) + q, attn (2Q) + k, v (2K) + lse (H) + gate, up (2F) = 56862 floats per token (not the
// SwiGLU output act, 18944 more: a kept layer's backward recomputes it); at 8192 tokens every
// buffer is a multiple of 256 bytes. Each count must equal the executor's own
// (ModelCompute::kept_layer_bytes, what the stream executor allocates per kept layer).
TEST(KeepInternals, CostModelBytesAreTheExecutorsLayerActs) {
  auto cfg = builtin_geometry("qwen2.5-7b");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  kernels::Backend& cpu = kernels::cpu_backend();
  const auto executor_bytes = [&](const model::ModelConfig& c, int layer, std::int64_t tokens) {
    auto geo = model::make_geometry(c);
    EXPECT_TRUE(geo.ok()) << geo.status().to_string();
    auto b = model::ModelCompute::kept_layer_bytes(*geo, layer, tokens, cpu);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    return b.ok() ? static_cast<double>(*b) : -1.0;
  };
  EXPECT_DOUBLE_EQ(kept_internals_bytes(*cfg, 0, 8192), 4.0 * 8192 * 56862);
  EXPECT_DOUBLE_EQ(kept_internals_bytes(*cfg, 0, 8192), executor_bytes(*cfg, 0, 8192));
  // One token: 12 buffers, each rounded up to 256 bytes (14336 B for C, 2048 for K, 112 -> 256
  // for lse, 4 -> 256 for each rstd, 75776 for F).
  const double one = 3 * 14336 + 2 * 256 + 2 * 14336 + 2 * 2048 + 256 + 2 * 75776;
  EXPECT_DOUBLE_EQ(kept_internals_bytes(*cfg, 0, 1), one);
  EXPECT_DOUBLE_EQ(kept_internals_bytes(*cfg, 0, 1), executor_bytes(*cfg, 0, 1));
  EXPECT_DOUBLE_EQ(kept_internals_bytes(*cfg, 5, 777), executor_bytes(*cfg, 5, 777));
  // A per-head q/k norm adds q_pre, k_pre and their rstds: Q + K + H + G floats per token.
  model::ModelConfig qk = *cfg;
  qk.qk_norm = model::QkNorm::kPerHead;
  EXPECT_DOUBLE_EQ(kept_internals_bytes(qk, 0, 8192), 4.0 * 8192 * (56862 + 3584 + 512 + 28 + 4));
  EXPECT_DOUBLE_EQ(kept_internals_bytes(qk, 0, 8192), executor_bytes(qk, 0, 8192));
  // An MoE layer trades gate/up for the routing and expert buffers (all kept, the experts' eact
  // too): E = 64, top 8, Fe 1024: 2E + 3K (weights, ids, slot_of) + 2KC (gathered, eout) + 3K Fe
  // per token, plus E + 1 offsets.
  model::ModelConfig moe = *cfg;
  moe.num_experts = 64;
  moe.num_experts_per_tok = 8;
  moe.moe_intermediate_size = 1024;
  ASSERT_TRUE(moe.is_moe_layer(0));
  const double attn = 56862 - 2 * 18944;
  const double per_token = attn + 2 * 64 + 3 * 8 + 2 * 8 * 3584 + 3 * 8 * 1024;
  EXPECT_DOUBLE_EQ(kept_internals_bytes(moe, 0, 8192), 4.0 * 8192 * per_token + 512);
  EXPECT_DOUBLE_EQ(kept_internals_bytes(moe, 0, 8192), executor_bytes(moe, 0, 8192));
  // The analytic problem: each layer's internals and the re-forward it saves, the internals-only
  // share of the (full) forward that a span recompute still costs.
  auto p = analytic_problem(*cfg, MachineSpec{}, TrainShape{.batch_size = 8, .seq_len = 1024},
                            Capacities{.gpu_gb = 80, .host_gb = 256});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_DOUBLE_EQ(p->layers[3].internals_gb, 4.0 * 8192 * 56862 / 1e9);
  EXPECT_DOUBLE_EQ(p->layers[3].rec_ms, p->layers[3].fwd_ms);
  EXPECT_NEAR(p->layers[3].keep_saved_ms, p->layers[3].rec_ms * reforward_flop_share(*cfg, 3, 1024),
              1e-12);
  EXPECT_LT(p->layers[3].keep_saved_ms, 0.72 * p->layers[3].rec_ms);
  EXPECT_TRUE(p->allow_keep_internals);
}

// The FLOP share of the backward's internals-only re-forward in the full forward. Dense layer
// without biases: C 64, H 4, Hkv 2, D 16 (Q 64, K 32), F 160, S 32. Per token (x2 = FLOPs):
// q/o 2 x 64 x 64 = 8192, k/v 2 x 64 x 32 = 4096 -> attention weights 12288; MLP 3 x 160 x 64 =
// 30720, of it down 160 x 64 = 10240. GEMMs 2 x (12288 + 30720) = 86016; causal attention
// 2 x 2 x S x S x H x D / 2 per sequence = 2 x S x 64 = 4096 per token; full 90112. Without the
// down projection (2 x 10240 = 20480): 69632 / 90112 = 17/22 = 0.772727...
TEST(ReforwardShare, HandComputedDenseGeometryMoeAndQwenShapes) {
  auto base = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  model::ModelConfig c = *base;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 160;
  c.qkv_bias = false;
  c.o_bias = false;
  EXPECT_NEAR(reforward_flop_share(c, 0, 32), 17.0 / 22.0, 1e-12);
  EXPECT_NEAR(reforward_flop_share(c, 5, 32), 17.0 / 22.0, 1e-12);  // every dense layer alike
  // Longer sequences: attention grows, the skipped down projection's share shrinks. At S = 1024:
  // attention 2 x 1024 x 64 = 131072 per token, full 217088: 1 - 20480 / 217088.
  EXPECT_NEAR(reforward_flop_share(c, 0, 1024), 1.0 - 20480.0 / 217088.0, 1e-12);
  // MoE layers skip only the combine and the residual add (no GEMM): share 1.
  model::ModelConfig moe = c;
  moe.num_experts = 8;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 32;
  ASSERT_TRUE(moe.is_moe_layer(0));
  EXPECT_EQ(reforward_flop_share(moe, 0, 32), 1.0);
  // Qwen2.5-3B and 7B at seq 1024 (q/k/v biases included): ~0.71 (0.715, 0.713).
  for (const char* name : {"qwen2.5-3b", "qwen2.5-7b"}) {
    auto q = builtin_geometry(name);
    ASSERT_TRUE(q.ok());
    const double share = reforward_flop_share(*q, 0, 1024);
    EXPECT_GT(share, 0.70) << name;
    EXPECT_LT(share, 0.72) << name;
  }
}

}  // namespace
}  // namespace ferry::plan
