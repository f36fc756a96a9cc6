// SPDX-License-Identifier: Apache-2.0
// The layer-streaming executor against the in-memory reference (ModelCompute whole-model forward
// + backward, optimizer_step): after several steps with gradient accumulation and active
// clipping, losses and every master weight / AdamW state are bit-identical for each fixed
// activation policy (device, host, NVMe, checkpoint-every-K, mixes), on the dense builtin model
// and on a MoE model (the qwen3_moe fixture: random init, MoE and dense layers, untied head);
// the bytes moved match what the policy predicts; the device budget refuses batch b+1 and
// accepts batch b, naming b; the per-layer ModelCompute API plans exactly what it allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "model/model_binding.h"
#include "test_util.h"
#include "train/builtin_model.h"
#include "train/optim/param_selection.h"
#include "train/optimizer.h"
#include "train/rng.h"
#include "train/stream/device_plan.h"
#include "train/stream/layer_optimizer.h"
#include "train/stream/plan_policy.h"
#include "train/stream/stream_executor.h"
#include "train/train_state.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

std::string nvme_dir() { return testing::temp_dir("stream_nvme"); }

void check_policies(const model::LoadedModel& m, const std::vector<std::string>& policies,
                    const RunSpec& spec) {
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult ref = run_reference(m, spec, data);
  bool clipped = false;
  for (const StepOutcome& o : ref.outcomes) clipped |= o.applied && o.clip < 1.0;
  EXPECT_TRUE(clipped) << "the test should exercise clipping";
  for (const std::string& p : policies) {
    const RunResult st = run_stream(m, spec, data, p);
    ASSERT_EQ(st.losses.size(), ref.losses.size()) << p;
    for (std::size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_EQ(st.losses[i], ref.losses[i]) << p << " step " << i;
      EXPECT_EQ(st.outcomes[i].grad_norm, ref.outcomes[i].grad_norm) << p << " step " << i;
    }
    expect_same_state(*ref.state, *st.state, p);
    EXPECT_LE(st.peak, st.planned) << p;
    // Without keeps every layer's backward follows an internals-only re-forward
    // (ModelCompute::layer_forward_internals), never a full one.
    const auto micro = static_cast<std::uint64_t>(spec.steps * spec.accum);
    EXPECT_EQ(st.stats.internals_forwards, micro * static_cast<std::uint64_t>(m.geometry.layers))
        << p;
    EXPECT_EQ(st.compute_internals_forwards, st.stats.internals_forwards) << p;
  }
}

TEST(StreamExecutor, DenseMatchesInMemoryBitForBitForEveryPolicy) {
  const std::string dir = testing::temp_dir("stream_dense");
  auto m = dense_model(dir + "/model");
  const std::string nv = nvme_dir();
  check_policies(*m,
                 {"device", "host", "nvme:" + nv, "every:2", "every:3:host", "every:4",
                  "every:2:nvme:" + nv, "mix:dhrn:" + nv, "mix:hrrd"},
                 {});
}

TEST(StreamExecutor, MoeMatchesInMemoryBitForBitForEveryPolicy) {
  auto m = moe_model();
  ASSERT_GT(m->geometry.experts, 0);
  const std::string nv = nvme_dir();
  check_policies(*m, {"device", "host", "nvme:" + nv, "every:2", "every:3", "mix:nrh:" + nv}, {});
}

// bf16 GEMMs (the CPU twin of the GPU's bf16 tensor-core path: operands rounded to bf16) keep the
// executor's property: every policy, recompute included, gives the in-memory run's bits.
TEST(StreamExecutor, Bf16GemmsMatchInMemoryBitForBit) {
  const std::string dir = testing::temp_dir("stream_bf16");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  const std::string nv = nvme_dir();
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  check_policies(*dense, {"device", "every:2", "mix:hrrd"}, spec);
  check_policies(*moe, {"host", "every:2:nvme:" + nv}, spec);
}

// The optimizer split over threads (parameters cut into chunks) gives the same bits, fp32 and
// 8-bit states alike, with a layer large enough to span several chunks.
TEST(StreamExecutor, ThreadedOptimizerMatchesInMemory) {
  const std::string dir = testing::temp_dir("stream_threads");
  const BuiltinModelSpec spec{.layers = 2,
                              .hidden = 256,
                              .heads = 8,
                              .kv_heads = 4,
                              .head_dim = 32,
                              .intermediate = 320,
                              .max_positions = 64,
                              .init_std = 0.05};
  ASSERT_TRUE(write_builtin_model(dir + "/model", spec, 7).ok());
  auto m = model::load_model_f32(dir + "/model");
  ASSERT_TRUE(m.ok());
  ASSERT_GT(320 * 256, LayerOptimizer::kChunk);  // the MLP matrices span two chunks
  RunSpec f32;
  f32.optimizer_threads = 3;
  f32.steps = 2;
  check_policies(**m, {"every:2"}, f32);
  RunSpec q8 = f32;
  q8.mode.states = OptimizerStates::k8Bit;
  check_policies(**m, {"device"}, q8);
}

TEST(StreamExecutor, EightBitStatesMatchInMemory) {
  const std::string dir = testing::temp_dir("stream_q8");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode.states = OptimizerStates::k8Bit;
  check_policies(*m, {"every:2"}, spec);
}

// --8bit-params: a subset of 8-bit states, the rest fp32 (mixed sections in the arena).
TEST(StreamExecutor, EightBitSubsetMatchesInMemory) {
  const std::string dir = testing::temp_dir("stream_q8_subset");
  auto dense = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode.states = OptimizerStates::k8Bit;
  spec.q8_params = "mlp";
  check_policies(*dense, {"every:2", "host"}, spec);
  spec.mode.master = MasterWeights::kBf16Sr;
  spec.q8_params = "self_attn|embed";
  check_policies(*dense, {"every:2"}, spec);
  auto moe = moe_model();
  spec.mode.master = MasterWeights::kF32;
  spec.q8_params = "experts";
  check_policies(*moe, {"every:2", "device"}, spec);
}

const std::vector<OptimMode> kBf16Modes = {
    {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::kF32},
    {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit},
    {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::kF32},
    {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit}};

TEST(StreamExecutor, Bf16MastersMatchInMemory) {
  const std::string dir = testing::temp_dir("stream_bf16");
  auto m = dense_model(dir + "/model");
  const std::string nv = nvme_dir();
  for (const OptimMode& mode : kBf16Modes) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_policies(*m, {"every:2", "host", "mix:dhrn:" + nv}, spec);
  }
}

TEST(StreamExecutor, Bf16MastersMatchInMemoryOnMoe) {
  auto m = moe_model();
  for (const OptimMode& mode : {kBf16Modes[0], kBf16Modes[3]}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_policies(*m, {"every:2", "device"}, spec);
  }
}

// The arena of a bf16-master run is exactly the mode's figure (f32 gradients on the CPU backend)
// plus page padding, and its weights cross as bf16: half the bytes of an fp32-master run.
TEST(StreamExecutor, Bf16ArenaIsTheModesBytesPerParamAndStreamsHalfTheBytes) {
  const std::string dir = testing::temp_dir("stream_bf16_bytes");
  auto m = dense_model(dir + "/model");
  const std::vector<Batch> data = make_batches(2, m->geometry.vocab, 5);
  RunSpec spec;
  spec.steps = 1;
  const RunResult f32 = run_stream(*m, spec, data, "every:2");
  for (const OptimMode& mode : kBf16Modes) {
    SCOPED_TRACE(describe(mode));
    RunSpec rs;
    rs.mode = mode;
    std::unique_ptr<TrainState> s = make_state(*m, rs);
    auto arena = HostArena::create(*s);
    ASSERT_TRUE(arena.ok()) << arena.status().to_string();
    const double per_param = host_bytes_per_param(mode, DType::kF32).total();
    const auto exact = static_cast<std::size_t>(per_param * double((*arena)->num_elements()));
    // At most one partial page per section: weights, kahan, m, v, 2 absmax, grads.
    const std::size_t padding = static_cast<std::size_t>((*arena)->num_units()) * 7 * 4096;
    EXPECT_GE((*arena)->total_bytes() + 8, exact);  // 8: rounding of the absmax share
    EXPECT_LE((*arena)->total_bytes(), exact + padding);
    spec.mode = mode;
    const RunResult b = run_stream(*m, spec, data, "every:2");
    EXPECT_EQ(2 * b.stats.weight_h2d, f32.stats.weight_h2d);
    EXPECT_EQ(2 * b.stats.globals_h2d, f32.stats.globals_h2d);
    EXPECT_GT(b.stats.weight_h2d, 0u);
  }
}

// An fp32 master computing with bf16 weights (--weights-dtype bf16, the GPU default): the arena's
// streaming copy is bf16, written by the update (round to nearest even), and the in-memory
// reference computes with the master's bf16 rounding — the same bits for every policy.
TEST(StreamExecutor, Fp32MasterWithBf16WeightsMatchesInMemory) {
  const std::string dir = testing::temp_dir("stream_bf16w");
  auto m = dense_model(dir + "/model");
  const std::string nv = nvme_dir();
  for (const OptimMode& mode :
       {OptimMode{}, OptimMode{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit}}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    spec.bf16_compute = true;
    check_policies(*m, {"every:2", "host", "mix:dhrn:" + nv}, spec);
  }
  auto moe = moe_model();
  RunSpec spec;
  spec.bf16_compute = true;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  check_policies(*moe, {"every:2", "device"}, spec);
}

// What the mode changes: the weights computed with are the master's bf16 rounding (so the losses
// differ from an f32-weights run), the master stays f32, the streaming copy and the link carry
// half the bytes, and the arena is 2 bytes/param smaller.
TEST(StreamExecutor, Bf16WeightsAreTheMastersRoundingAndHalveTheStreamedBytes) {
  const std::string dir = testing::temp_dir("stream_bf16w_bytes");
  auto m = dense_model(dir + "/model");
  const std::vector<Batch> data = make_batches(4, m->geometry.vocab, 5);
  RunSpec f32;
  f32.steps = 2;
  RunSpec b16 = f32;
  b16.bf16_compute = true;
  const RunResult a = run_stream(*m, f32, data, "every:2");
  const RunResult b = run_stream(*m, b16, data, "every:2");
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_NE(a.losses[0], b.losses[0]) << "bf16 weights should change the arithmetic";
  EXPECT_NEAR(a.losses[0], b.losses[0], 1e-2 * std::fabs(a.losses[0]));
  EXPECT_EQ(2 * b.stats.weight_h2d, a.stats.weight_h2d);
  EXPECT_EQ(2 * b.stats.globals_h2d, a.stats.globals_h2d);
  // The state computes with bf16(master) and its master kept bits below bf16's precision.
  const TrainState& s = *b.state;
  ASSERT_NE(s.compute, nullptr);
  bool finer = false;
  for (std::size_t i = 0; i < s.num_params(); ++i) {
    const float* mw = s.master->named[i].second.as<float>();
    const float* cw = s.compute->named[i].second.as<float>();
    for (std::int64_t k = 0; k < s.master->named[i].second.numel(); ++k) {
      ASSERT_EQ(cw[k], bf16_to_f32(f32_to_bf16(mw[k]))) << s.master->named[i].first << " " << k;
      finer |= mw[k] != cw[k];
    }
  }
  EXPECT_TRUE(finer) << "the fp32 master should hold values bf16 cannot";
  std::unique_ptr<TrainState> sa = make_state(*m, f32), sb = make_state(*m, b16);
  auto arena_a = HostArena::create(*sa);
  auto arena_b = HostArena::create(*sb);
  ASSERT_TRUE(arena_a.ok() && arena_b.ok());
  EXPECT_TRUE((*arena_b)->bf16_weights());
  const double saved = double((*arena_a)->total_bytes()) - double((*arena_b)->total_bytes());
  const double n = double((*arena_a)->num_elements());
  EXPECT_NEAR(saved / n, 2.0, 0.1);
  // A state computing with f32 weights does not load into a bf16-weights arena.
  EXPECT_FALSE((*arena_b)->load_from(*sa).ok());
}

// bf16 gradients (--grad-dtype bf16): the host arena keeps, and the D2H / refill move, the
// running sum's bf16 rounding; the in-memory executor rounds its gradients after every
// micro-batch the same way, so every policy (NVMe, recompute and accumulation included) stays
// bit-identical to it, in the fp32 and the bf16-master / 8-bit modes and on a MoE model.
TEST(StreamExecutor, Bf16GradientsMatchInMemory) {
  const std::string dir = testing::temp_dir("stream_bf16g");
  auto m = dense_model(dir + "/model");
  const std::string nv = nvme_dir();
  for (const OptimMode& mode : {OptimMode{}, OptimMode{.master = MasterWeights::kBf16Kahan,
                                             .states = OptimizerStates::k8Bit}}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    spec.bf16_grads = true;
    check_policies(*m, {"device", "host", "every:2", "mix:dhrn:" + nv}, spec);
  }
  auto moe = moe_model();
  RunSpec spec;
  spec.bf16_grads = true;
  spec.bf16_compute = true;
  check_policies(*moe, {"every:2", "device"}, spec);
}

// What bf16 gradients change: the run (the update reads rounded gradients), half the gradient
// bytes on the D2H and the refill, 2 host bytes/param less; an f32-gradient state does not load
// into a bf16-gradient arena.
TEST(StreamExecutor, Bf16GradientsHalveTheGradientBytes) {
  const std::string dir = testing::temp_dir("stream_bf16g_bytes");
  auto m = dense_model(dir + "/model");
  const std::vector<Batch> data = make_batches(6, m->geometry.vocab, 5);
  RunSpec f32;
  RunSpec b16 = f32;
  b16.bf16_grads = true;
  const RunResult a = run_stream(*m, f32, data, "host");
  const RunResult b = run_stream(*m, b16, data, "host");
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(a.losses[0], b.losses[0]) << "the first forward sees the same weights";
  EXPECT_NE(a.outcomes[0].grad_norm, b.outcomes[0].grad_norm) << "the norm reads rounded values";
  bool differ = false;
  for (std::size_t i = 0; i < a.state->num_params(); ++i) {
    const TensorView& wa = a.state->master->named[i].second;
    differ |= std::memcmp(wa.data, b.state->master->named[i].second.data, wa.bytes()) != 0;
  }
  EXPECT_TRUE(differ) << "bf16 gradients should change the update";
  EXPECT_GT(a.stats.grad_d2h, 0u);
  EXPECT_EQ(2 * b.stats.grad_d2h, a.stats.grad_d2h);
  EXPECT_GT(a.stats.grad_h2d, 0u);  // accumulation refills
  EXPECT_EQ(2 * b.stats.grad_h2d, a.stats.grad_h2d);
  std::unique_ptr<TrainState> sa = make_state(*m, f32), sb = make_state(*m, b16);
  auto arena_a = HostArena::create(*sa);
  auto arena_b = HostArena::create(*sb);
  ASSERT_TRUE(arena_a.ok() && arena_b.ok());
  EXPECT_TRUE((*arena_b)->bf16_grads());
  // The globals pass through a layer slot's twin in chunks: this model needs more than one.
  EXPECT_GT((*arena_b)->unit_elements((*arena_b)->globals_unit()),
            (*arena_b)->max_layer_elements());
  const double saved = double((*arena_a)->total_bytes()) - double((*arena_b)->total_bytes());
  EXPECT_NEAR(saved / double((*arena_a)->num_elements()), 2.0, 0.1);
  EXPECT_FALSE((*arena_b)->load_from(*sa).ok());
}

TEST(StreamExecutor, BytesMovedAreWhatThePolicyPredicts) {
  const std::string dir = testing::temp_dir("stream_bytes");
  auto m = dense_model(dir + "/model");
  const RunSpec spec{.steps = 2, .accum = 3};
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 11);
  const std::string nv = nvme_dir();
  const int L = m->geometry.layers;
  const std::uint64_t C = static_cast<std::uint64_t>(m->geometry.hidden);
  for (const std::string& p : {std::string("device"), std::string("every:2"),
                               std::string("every:3:host"), "mix:dnrh:" + nv}) {
    for (int prefetch : {1, 3}) {
      const RunResult st = run_stream(*m, spec, data, p, prefetch);
      auto pol = parse_policy(p, L);
      ASSERT_TRUE(pol.ok());
      auto arena = HostArena::create(*st.state);
      ASSERT_TRUE(arena.ok());
      // Layer l's weights cross once in forward, once in backward, and once more when the
      // boundary above it is recomputed (layer l regenerates it).
      std::uint64_t per_micro = 0, layer_total = 0;
      for (int l = 0; l < L; ++l) {
        const std::uint64_t w = static_cast<std::uint64_t>((*arena)->unit_elements(l)) * 4;
        const bool recomputes = l + 1 < L && pol->homes[l + 1] == Home::kRecompute;
        per_micro += w * (recomputes ? 3 : 2);
        layer_total += w;
      }
      const std::uint64_t micro = spec.steps * spec.accum;
      const std::uint64_t g =
          static_cast<std::uint64_t>((*arena)->unit_elements((*arena)->globals_unit())) * 4;
      EXPECT_EQ(st.stats.weight_h2d, micro * per_micro) << p;
      EXPECT_EQ(st.stats.globals_h2d, spec.steps * g) << p;
      EXPECT_EQ(st.stats.grad_d2h, micro * layer_total + spec.steps * g) << p;
      EXPECT_EQ(st.stats.grad_h2d, spec.steps * (spec.accum - 1) * layer_total) << p;
      const std::uint64_t offloaded =
          static_cast<std::uint64_t>(pol->count(Home::kHost) + pol->count(Home::kNvme));
      const std::uint64_t act_bytes = static_cast<std::uint64_t>(st.tokens) * C * 4;
      EXPECT_EQ(st.stats.act_d2h, offloaded * act_bytes) << p;
      EXPECT_EQ(st.stats.act_h2d, offloaded * act_bytes) << p;
      const std::uint64_t record = (kBatch * kSeq * C * 4 + 4095) / 4096 * 4096;
      EXPECT_EQ(st.stats.nvme_write, micro * pol->count(Home::kNvme) * record) << p;
      EXPECT_EQ(st.stats.nvme_read, st.stats.nvme_write) << p;
      // The disk calls are timed exactly where they moved bytes.
      EXPECT_EQ(st.stats.nvme_write_s > 0.0, st.stats.nvme_write > 0) << p;
      EXPECT_EQ(st.stats.nvme_read_s > 0.0, st.stats.nvme_read > 0) << p;
      EXPECT_EQ(st.peak, st.planned) << p;
    }
  }
}

TEST(StreamExecutor, BudgetRefusesTheBatchAboveTheLargestThatFits) {
  const std::string dir = testing::temp_dir("stream_budget");
  auto m = dense_model(dir + "/model");
  auto s = TrainState::from_loaded(*m, {}, 1);
  ASSERT_TRUE(s.ok());
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  auto arena = HostArena::create(**s);
  ASSERT_TRUE(arena.ok());
  const ModelSizes sizes{.globals_elements = (*arena)->unit_elements((*arena)->globals_unit()),
                         .max_layer_elements = (*arena)->max_layer_elements(),
                         .params = static_cast<std::int64_t>((*arena)->params().size())};
  kernels::Backend& be = kernels::cpu_backend();
  constexpr std::int64_t S = 32;
  auto p5 = plan_device(m->geometry, sizes, *pol, 3, 5 * S, be);
  auto p6 = plan_device(m->geometry, sizes, *pol, 3, 6 * S, be);
  ASSERT_TRUE(p5.ok() && p6.ok());
  ASSERT_LT(p5->total_bytes(), p6->total_bytes());
  // A budget between the two: 5 fits, 6 does not.
  const std::size_t budget = (p5->total_bytes() + p6->total_bytes()) / 2;
  auto best = largest_batch(m->geometry, sizes, *pol, 3, S, budget, be);
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(*best, 5);
  StreamOptions so{.policy = *pol, .prefetch = 2, .device_budget_bytes = budget};
  auto ok = StreamExecutor::create(**s, 5, S, so, be);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)->device_planned_bytes(), p5->total_bytes());
  ok->reset();
  auto refused = StreamExecutor::create(**s, 6, S, so, be);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("the largest batch that fits is 5"), std::string::npos)
      << refused.status().message();
  // More prefetch slots cost device memory: the same budget then fits fewer sequences.
  auto deeper = largest_batch(m->geometry, sizes, *pol, 8, S, budget, be);
  ASSERT_TRUE(deeper.ok());
  EXPECT_LT(*deeper, 5);
  // Not even one sequence: said so.
  so.device_budget_bytes = sizes.max_layer_elements * 4;
  auto none = StreamExecutor::create(**s, 1, S, so, be);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("does not fit even batch 1"), std::string::npos)
      << none.status().message();
}

// The next step may start a layer as soon as that layer is updated: with the worker held before
// the last layer, the globals and layer 0 are ready (and equal the reference update) while the
// last layer is not.
TEST(LayerOptimizer, EachLayerIsReadyAsSoonAsItsOwnUpdateIsDone) {
  const std::string dir = testing::temp_dir("stream_overlap");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  auto ref = TrainState::from_loaded(*m, {}, 1);
  auto s = TrainState::from_loaded(*m, {}, 1);
  ASSERT_TRUE(ref.ok() && s.ok());
  Rng rng(3);
  for (auto* st : {ref->get(), s->get()}) {
    Rng r = rng;  // same gradients in both
    for (auto& [name, g] : st->grads->named) {
      for (std::int64_t i = 0; i < g.numel(); ++i) {
        g.as<float>()[i] = static_cast<float>(r.normal() * 1e-2);
      }
    }
  }
  auto arena = HostArena::create(**s);
  ASSERT_TRUE(arena.ok());
  for (const ParamLoc& p : (*arena)->params()) {
    std::memcpy((*arena)->grads(p.unit) + p.offset, (*s)->grads->named[p.index].second.data,
                static_cast<std::size_t>(p.n) * 4);
  }
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  LayerOptimizer opt(**arena, 1, [&](int unit) {
    if (unit != L - 1) return;
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return release; });
  });
  AdamWConfig cfg;
  cfg.max_grad_norm = 0.0;
  opt.submit({.lr = 1e-3f,
              .beta1 = static_cast<float>(cfg.beta1),
              .beta2 = static_cast<float>(cfg.beta2),
              .eps = static_cast<float>(cfg.eps),
              .weight_decay = static_cast<float>(cfg.weight_decay),
              .grad_scale = 1.0f,
              .step = 1});
  opt.wait_ready((*arena)->globals_unit());
  opt.wait_ready(0);
  EXPECT_FALSE(opt.is_ready(L - 1));
  ASSERT_TRUE(optimizer_step(**ref, cfg, 1e-3, 1, 1, kernels::cpu_backend()).ok());
  for (int idx : (*arena)->unit_params(0)) {
    const ParamLoc& p = (*arena)->params()[static_cast<std::size_t>(idx)];
    EXPECT_EQ(std::memcmp((*arena)->weights(0) + p.offset, (*ref)->master->named[idx].second.data,
                          static_cast<std::size_t>(p.n) * 4),
              0);
  }
  {
    std::lock_guard lk(mu);
    release = true;
  }
  cv.notify_all();
  opt.wait_all();
  EXPECT_TRUE(opt.is_ready(L - 1));
  // Every unit was timed (the globals too).
  const std::vector<double> unit_s = opt.unit_busy_s();
  ASSERT_EQ(unit_s.size(), static_cast<std::size_t>((*arena)->num_units()));
  for (double t : unit_s) EXPECT_GT(t, 0.0);
  ASSERT_TRUE((*arena)->store_to(**s).ok());
  for (std::size_t i = 0; i < (*s)->num_params(); ++i) {
    const TensorView& a = (*ref)->master->named[i].second;
    EXPECT_EQ(std::memcmp(a.data, (*s)->master->named[i].second.data, a.bytes()), 0);
  }
}

TEST(StreamExecutor, PlannedComputeBytesAreWhatModelComputeAllocates) {
  const std::string dir = testing::temp_dir("stream_planned");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  kernels::Backend& be = kernels::cpu_backend();
  for (const model::LoadedModel* m : {dense.get(), moe.get()}) {
    for (int work : {1, 2, m->geometry.layers}) {
      auto planned = model::ModelCompute::planned_bytes(m->geometry, 77, be, work);
      auto mc = model::ModelCompute::create(m->geometry, 77, be, work);
      ASSERT_TRUE(planned.ok() && mc.ok());
      EXPECT_EQ(*planned, (*mc)->total_bytes()) << "work_layers " << work;
    }
  }
}

// The two transit buffers hold boundaries the forward writes off the device (boundary i in
// transit.(i % 2): stored to a host or NVMe home, or a recomputed one the next layer reads) and
// transit.1 also a backward fetch; nothing else writes them (the backward's re-forwards are
// internals-only, no output), so a buffer no boundary of the policy needs plans 0 bytes. The
// executor runs within the plan (peak == planned) and matches the in-memory reference's bits
// under these policies (check_policies' cases: device, every:K, mixes).
TEST(StreamExecutor, TransitBuffersOnlyForTheBoundariesThatUseThem) {
  const std::string dir = testing::temp_dir("stream_transit");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  ASSERT_EQ(L, 4);
  auto s = TrainState::from_loaded(*m, {}, 1);
  ASSERT_TRUE(s.ok());
  auto arena = HostArena::create(**s);
  ASSERT_TRUE(arena.ok());
  const ModelSizes sizes{.globals_elements = (*arena)->unit_elements((*arena)->globals_unit()),
                         .max_layer_elements = (*arena)->max_layer_elements(),
                         .params = static_cast<std::int64_t>((*arena)->params().size())};
  kernels::Backend& be = kernels::cpu_backend();
  const std::int64_t T = kBatch * kSeq;
  const std::size_t act = static_cast<std::size_t>(T) * m->geometry.hidden * sizeof(float);
  // policy, transit.0 and transit.1 in activations
  const std::vector<std::tuple<std::string, int, int>> cases{
      {"device", 0, 0},      {"device+keep:0-1", 0, 0}, {"every:2", 0, 1},  {"mix:drdd", 0, 1},
      {"mix:ddrd", 1, 0},    {"mix:dddh", 0, 1},        {"mix:ddhd", 1, 1}, {"host", 1, 1},
      {"every:2:host", 1, 1}};
  for (const auto& [name, t0, t1] : cases) {
    auto pol = parse_policy(name, L);
    ASSERT_TRUE(pol.ok()) << name;
    auto d = plan_device(m->geometry, sizes, *pol, 3, T, be);
    ASSERT_TRUE(d.ok()) << name;
    ASSERT_EQ(d->transit.size(), 2u);
    EXPECT_EQ(d->plan.slot(d->transit[0]).size_bytes, static_cast<std::size_t>(t0) * act) << name;
    EXPECT_EQ(d->plan.slot(d->transit[1]).size_bytes, static_cast<std::size_t>(t1) * act) << name;
  }
  // The executor under a policy with neither buffer, and with transit.0 only.
  RunSpec spec;
  spec.steps = 2;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 9);
  const RunResult ref = run_reference(*m, spec, data);
  for (const std::string p : {"device", "mix:ddrd", "mix:ddhd"}) {
    const RunResult st = run_stream(*m, spec, data, p);
    ASSERT_EQ(st.losses.size(), ref.losses.size()) << p;
    for (std::size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_EQ(st.losses[i], ref.losses[i]) << p << " step " << i;
    }
    expect_same_state(*ref.state, *st.state, p);
    EXPECT_EQ(st.peak, st.planned) << p;
  }
}

TEST(StreamPolicy, ParsesFixedPoliciesAndMixes) {
  auto every = parse_policy("every:3", 7);
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->describe(), "every:3 = drrdrrd");
  ASSERT_EQ(every->spans().size(), 3u);
  EXPECT_EQ(every->max_recomputed(), 2);
  EXPECT_EQ(weight_schedule(*every),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 6, 3, 4, 5, 4, 3, 0, 1, 2, 1, 0}));
  auto host = parse_policy("every:2:host", 3);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->describe(), "every:2:host = hrh");
  auto mix = parse_policy("mix:dnrh:/tmp/x", 4);
  ASSERT_TRUE(mix.ok());
  EXPECT_EQ(mix->nvme_dir, "/tmp/x");
  EXPECT_FALSE(parse_policy("mix:rd", 2).ok());  // boundary 0 must be kept
  EXPECT_FALSE(parse_policy("mix:dn", 2).ok());  // NVMe without a directory
  EXPECT_FALSE(parse_policy("every:0", 2).ok());
  EXPECT_FALSE(parse_policy("mix:dd", 3).ok());  // wrong length
  EXPECT_FALSE(parse_policy("sometimes", 3).ok());
}

TEST(StreamPolicy, ReadsTheHomesOfAFerryPlanDocument) {
  // The document shape src/plan/plan_json.cpp writes (docs/plan.md), trimmed to what is read.
  const std::string doc = R"({"format": "ferry-plan", "version": 1, "policy": "solved",
    "num_layers": 4, "batch_size": 8, "seq_len": 1024,
    "boundaries": [{"boundary": 0, "home": "gpu"}, {"boundary": 1, "home": "recompute"},
                   {"boundary": 2, "home": "host"}, {"boundary": 3, "home": "nvme"},
                   {"boundary": 4, "home": "gpu"}],
    "spans": [{"start": 0, "end": 2, "keep_weights": true},
              {"start": 2, "end": 3, "keep_weights": false},
              {"start": 3, "end": 4, "keep_weights": false}],
    "transfers": []})";
  auto p = plan_policy_from_text(doc, "test plan", 4, "/tmp/nv");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->policy.describe(), "plan:solved = drhn");
  EXPECT_EQ(p->policy.nvme_dir, "/tmp/nv");
  EXPECT_EQ(p->batch_size, 8);
  EXPECT_EQ(p->keep_weight_spans, 1);
  EXPECT_FALSE(plan_policy_from_text(doc, "test plan", 5, "/tmp/nv").ok());  // layer count
  EXPECT_FALSE(plan_policy_from_text(doc, "test plan", 4, "").ok());  // NVMe needs a directory
  EXPECT_FALSE(plan_policy_from_text("{\"format\": \"other\"}", "x", 4, "").ok());
}

}  // namespace
}  // namespace ferry::train::stream
