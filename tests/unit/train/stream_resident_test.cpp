// SPDX-License-Identifier: Apache-2.0
// GPU-resident layers (resident_layers.h, --resident-layers K) on the emulated device tier: the
// streamed executor with layers 0..K-1 resident (weights, master, states and gradients in the
// device tier, updated there in place by the device tail's kernels) gives the in-memory
// reference's and the K = 0 run's losses, gradient norms, weights and optimizer states bit for
// bit after several steps with active clipping and accumulation 2 — K = 1, 2, L - 1 and all,
// dense and MoE, bf16-Kahan / fp32 masters with f32 or 8-bit states, f32 and bf16 gradients,
// device / host / every:2 policies, beside the device tail — and it is counted: weight bytes
// streamed drop by exactly the resident layers' bytes, no gradient D2H or refill for them, the CPU
// worker spends nothing on them, the device updates K layers per applied step. Budget: a K that
// does not fit is refused before training naming the largest K that does; auto picks it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tail_test_util.h"
#include "test_util.h"
#include "train/stream/activation_policy.h"
#include "train/stream/host_arena.h"
#include "train/stream/resident_layers.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

using tail_test::applied_steps;
using tail_test::kF32x8;
using tail_test::kKahan8;
const OptimMode kKahan32{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::kF32};

std::string name_of(int k) { return k == kResidentAllLayers ? "all" : std::to_string(k); }

// Per micro-batch, how often each layer's weights stream under `policy` ([L]).
std::vector<int> streams_per_layer(const std::string& policy, int layers) {
  auto pol = parse_policy(policy, layers);
  EXPECT_TRUE(pol.ok());
  std::vector<int> n(static_cast<std::size_t>(layers), 0);
  for (int l : weight_schedule(*pol)) ++n[static_cast<std::size_t>(l)];
  return n;
}

// Runs K = 0 and each K of `ks` under each policy and checks them against the reference.
void check_resident(const model::LoadedModel& m, const std::vector<std::string>& policies,
                    RunSpec spec, const std::vector<int>& ks) {
  const int L = m.geometry.layers;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult ref = run_reference(m, spec, data);
  const std::uint64_t applied = applied_steps(ref);
  ASSERT_GT(applied, 0u);
  auto state = make_state(m, spec);
  auto arena = HostArena::create(*state);
  ASSERT_TRUE(arena.ok());
  const auto micro = static_cast<std::uint64_t>(spec.steps * spec.accum);
  for (const std::string& p : policies) {
    RunSpec s0 = spec;
    s0.resident_layers = 0;
    const RunResult base = run_stream(m, s0, data, p);
    const std::vector<int> per = streams_per_layer(p, L);
    for (int k_in : ks) {
      const int K = k_in == kResidentAllLayers ? L : k_in;
      const std::string what = p + " K=" + name_of(k_in);
      RunSpec r = spec;
      r.resident_layers = k_in;
      const RunResult st = run_stream(m, r, data, p);
      ASSERT_EQ(st.losses.size(), ref.losses.size()) << what;
      for (std::size_t i = 0; i < ref.losses.size(); ++i) {
        EXPECT_EQ(st.losses[i], ref.losses[i]) << what << " step " << i;
        EXPECT_EQ(st.losses[i], base.losses[i]) << what << " step " << i;
        EXPECT_EQ(st.outcomes[i].grad_norm, ref.outcomes[i].grad_norm) << what << " step " << i;
        EXPECT_EQ(st.outcomes[i].applied, ref.outcomes[i].applied) << what << " step " << i;
      }
      expect_same_state(*ref.state, *st.state, what);
      expect_same_state(*base.state, *st.state, what + " vs K=0");
      // Counted: the resident layers' weights never stream, their gradients never leave nor come
      // back, the CPU worker never updates them, the device does K per applied step.
      std::uint64_t w = 0, g = 0;
      for (int l = 0; l < K; ++l) {
        w += static_cast<std::uint64_t>(per[static_cast<std::size_t>(l)]) *
             (*arena)->unit_weight_bytes(l);
        g += static_cast<std::uint64_t>((*arena)->unit_elements(l)) * (*arena)->grad_size();
      }
      EXPECT_EQ(base.stats.weight_h2d - st.stats.weight_h2d, micro * w) << what;
      EXPECT_EQ(base.stats.grad_d2h - st.stats.grad_d2h, micro * g) << what;
      EXPECT_EQ(base.stats.grad_h2d - st.stats.grad_h2d,
                static_cast<std::uint64_t>(spec.steps * (spec.accum - 1)) * g)
          << what;
      EXPECT_EQ(st.stats.layer_forwards, base.stats.layer_forwards) << what;
      EXPECT_EQ(st.stats.layer_backwards, base.stats.layer_backwards) << what;
      EXPECT_EQ(st.resident.layers, K) << what;
      EXPECT_EQ(st.resident.updates, applied * static_cast<std::uint64_t>(K)) << what;
      ASSERT_EQ(st.unit_busy_s.size(), static_cast<std::size_t>(L + 1)) << what;
      for (int l = 0; l < L; ++l) {
        if (l < K) {
          EXPECT_EQ(st.unit_busy_s[static_cast<std::size_t>(l)], 0.0) << what << " layer " << l;
        } else {
          EXPECT_GT(st.unit_busy_s[static_cast<std::size_t>(l)], 0.0) << what << " layer " << l;
        }
      }
      EXPECT_EQ(st.resident_bytes, ResidentLayers::bytes(**arena, K, false)) << what;
      EXPECT_EQ(st.planned - base.planned, st.resident_bytes) << what;
      EXPECT_LE(st.peak, st.planned) << what;
    }
  }
}

TEST(ResidentLayers, DenseEveryModeMatchesInMemoryAndStreamedBitForBit) {
  const std::string dir = testing::temp_dir("resident_dense");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  for (const OptimMode& mode : {kKahan8, kKahan32, kF32x8}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_resident(*m, {"host", "every:2", "device"}, spec, {1, 2, L - 1, kResidentAllLayers});
  }
}

TEST(ResidentLayers, Bf16GradientsAndBf16StreamingCopyMatchInMemory) {
  const std::string dir = testing::temp_dir("resident_bf16");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  check_resident(*m, {"host", "every:2"}, spec, {1, 2, L - 1, kResidentAllLayers});
  // An fp32 master computing on its bf16 streaming copy (the copy the resident layer widens).
  spec.mode = kF32x8;
  spec.bf16_grads = false;
  spec.bf16_compute = true;
  check_resident(*m, {"host", "every:2"}, spec, {1, L - 1});
}

TEST(ResidentLayers, MoeMatchesInMemory) {
  auto m = moe_model();
  ASSERT_GT(m->geometry.experts, 0);
  const int L = m->geometry.layers;
  for (const OptimMode& mode : {kKahan8, kF32x8}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_resident(*m, {"host", "every:2"}, spec, {1, L - 1, kResidentAllLayers});
  }
  RunSpec spec;
  spec.mode = kKahan32;
  spec.bf16_grads = true;
  check_resident(*m, {"every:2"}, spec, {1, kResidentAllLayers});
}

// Beside the device tail: the tail takes only layers K.. (its `all` is the rest), the CPU worker
// the others; bits unchanged.
TEST(ResidentLayers, BesideTheDeviceTailTheTailTakesOnlyTheLayersAbove) {
  const std::string dir = testing::temp_dir("resident_tail");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  RunSpec spec;
  spec.mode = kKahan8;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult ref = run_reference(*m, spec, data);
  const std::uint64_t applied = applied_steps(ref);
  for (int K : {1, 2}) {
    for (int tail : {1, kDeviceUpdateAllLayers}) {
      const std::string what = "K=" + std::to_string(K) + " tail=" + std::to_string(tail);
      RunSpec r = spec;
      r.resident_layers = K;
      r.device_update_layers = tail;
      r.bf16_grads = K == 2;
      const RunResult want = K == 2 ? run_reference(*m, r, data) : RunResult{};
      const RunResult& rf = K == 2 ? want : ref;
      const RunResult st = run_stream(*m, r, data, "every:2");
      for (std::size_t i = 0; i < rf.losses.size(); ++i) {
        EXPECT_EQ(st.losses[i], rf.losses[i]) << what << " step " << i;
      }
      expect_same_state(*rf.state, *st.state, what);
      EXPECT_EQ(st.resident.updates, applied * static_cast<std::uint64_t>(K)) << what;
      EXPECT_EQ(st.tail.steps, applied) << what;
      EXPECT_EQ(st.tail.units_updated + st.tail.cpu_units,
                applied * static_cast<std::uint64_t>(L - K))
          << what;
      for (int u = 0; u < K; ++u) EXPECT_EQ(st.tail.unit_updates[u], 0u) << what << " " << u;
    }
  }
  // Every layer resident: `all` for the tail is none.
  RunSpec r = spec;
  r.resident_layers = kResidentAllLayers;
  r.device_update_layers = kDeviceUpdateAllLayers;
  const RunResult st = run_stream(*m, r, data, "host");
  expect_same_state(*ref.state, *st.state, "all resident, tail all");
  EXPECT_EQ(st.tail.steps, 0u);
  // A tail count beyond the layers left is refused.
  auto s = make_state(*m, spec);
  auto pol = parse_policy("host", L);
  ASSERT_TRUE(pol.ok());
  auto ex = StreamExecutor::create(
      *s, kBatch, kSeq, {.policy = *pol, .device_update_layers = L - 1, .resident_layers = 2},
      kernels::cpu_backend());
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("--device-update-layers"), std::string::npos)
      << ex.status().to_string();
}

// A K that does not fit is refused before training, naming the largest K that does; auto takes
// that K; an fp32 master with fp32 states (no device kernel) and K beyond L are refused.
TEST(ResidentLayers, BudgetRefusesNamingTheLargestKAndAutoPicksIt) {
  const std::string dir = testing::temp_dir("resident_budget");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  RunSpec spec;
  spec.mode = kKahan8;
  auto s = make_state(*m, spec);
  auto pol = parse_policy("every:2", L);
  ASSERT_TRUE(pol.ok());
  auto ex0 = StreamExecutor::create(*s, kBatch, kSeq, {.policy = *pol}, kernels::cpu_backend());
  ASSERT_TRUE(ex0.ok());
  const std::size_t base = (*ex0)->device_planned_bytes();
  const std::size_t two = ResidentLayers::bytes((*ex0)->arena(), 2, false);
  ASSERT_GT(two, 0u);
  // Room for two resident layers and not three.
  const std::size_t budget =
      base + two + ResidentLayers::layer_bytes((*ex0)->arena(), 2, false) / 2;
  StreamOptions so{.policy = *pol, .device_budget_bytes = budget, .resident_layers = 3};
  auto refused = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("the largest --resident-layers that fits at this "
                                            "batch is 2"),
            std::string::npos)
      << refused.status().to_string();
  so.resident_layers = 2;
  auto fits = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  EXPECT_EQ((*fits)->resident_layers(), 2);
  EXPECT_EQ((*fits)->device_planned_bytes(), base + two);
  so.resident_layers = kResidentAuto;
  auto picked = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_TRUE(picked.ok()) << picked.status().to_string();
  EXPECT_EQ((*picked)->resident_layers(), 2);
  so.device_budget_bytes = mem::MemoryBudget::kUnlimited;
  auto all = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)->resident_layers(), L);
  // Not even one layer: named as such.
  so.device_budget_bytes = base + ResidentLayers::layer_bytes((*ex0)->arena(), 0, false) / 2;
  so.resident_layers = 1;
  auto none = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not even --resident-layers 1 fits"), std::string::npos)
      << none.status().to_string();
  so.device_budget_bytes = mem::MemoryBudget::kUnlimited;
  so.resident_layers = L + 1;
  EXPECT_FALSE(StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend()).ok());
  RunSpec f32;
  f32.mode = {.master = MasterWeights::kF32, .states = OptimizerStates::kF32};
  auto s32 = make_state(*m, f32);
  so.resident_layers = 1;
  auto r32 = StreamExecutor::create(*s32, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_FALSE(r32.ok());
  EXPECT_EQ(r32.status().code(), StatusCode::kUnimplemented);
}

// The device bytes are each layer's pieces, 256-byte aligned: bf16 weights (bf16 streaming
// weights only), master / Kahan words, m, v, block scales, f32 gradients, the f32 weights compute
// reads (bf16 streaming weights: the whole layer without views, the f32-read part with them),
// plus one bf16 rounding scratch of the largest layer with bf16 gradients.
TEST(ResidentLayers, BytesAreEachLayersPiecesPlusOneScratch) {
  const std::string dir = testing::temp_dir("resident_bytes");
  auto m = dense_model(dir + "/model");
  using S = HostArena::Section;
  auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  for (const bool bf16_grads : {false, true}) {
    for (const OptimMode& mode : {kKahan8, kF32x8}) {
      RunSpec spec;
      spec.mode = mode;
      spec.bf16_grads = bf16_grads;
      auto s = make_state(*m, spec);
      auto arena = HostArena::create(*s);
      ASSERT_TRUE(arena.ok());
      const HostArena& a = **arena;
      for (const bool views : {false, true}) {
        std::size_t want = 0;
        std::int64_t most = 0;
        for (int u = 0; u < a.globals_unit(); ++u) {
          const auto n = static_cast<std::size_t>(a.unit_elements(u));
          most = std::max<std::int64_t>(most, a.unit_elements(u));
          std::size_t f32_part = n;
          if (views) {
            f32_part = 0;
            for (int idx : a.unit_params(u)) {
              const ParamLoc& p = a.params()[static_cast<std::size_t>(idx)];
              if (!bf16_view_param(p.gemm_weight, p.offset)) f32_part += p.n;
            }
          }
          std::size_t layer = 0;
          if (a.bf16_weights()) layer += up(a.section(u, S::kWeights).size) + up(4 * f32_part);
          for (S sec : {S::kMaster, S::kM, S::kV, S::kMAbsmax, S::kVAbsmax}) {
            layer += up(a.section(u, sec).size);
          }
          layer += up(4 * n);
          EXPECT_EQ(ResidentLayers::layer_bytes(a, u, views), layer) << u;
          want += layer;
          EXPECT_EQ(ResidentLayers::bytes(a, u + 1, views),
                    want + (bf16_grads ? up(2 * static_cast<std::size_t>(most)) : 0))
              << u;
        }
      }
      EXPECT_EQ(ResidentLayers::bytes(a, 0, false), 0u);
    }
  }
}

// store_to brings the resident state back (the host arena is stale meanwhile) and load_from
// takes a new state up: a second executor resuming from the first's stored state after 2 steps
// continues bit for bit as the uninterrupted run.
TEST(ResidentLayers, StoreAndLoadRoundTripResumesExactly) {
  const std::string dir = testing::temp_dir("resident_resume");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  spec.steps = 4;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult ref = run_reference(*m, spec, data);
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  auto s = make_state(*m, spec);
  const StreamOptions so{.policy = *pol, .resident_layers = 2};
  auto run_steps = [&](StreamExecutor& ex, int from, int to) {
    for (int step = from; step < to; ++step) {
      ex.begin_step(spec.accum);
      for (int a = 0; a < spec.accum; ++a) {
        ASSERT_TRUE(
            ex.micro_batch(data[static_cast<std::size_t>(step * spec.accum + a)].view()).ok());
      }
      auto o = ex.finish_step(adamw(), lr_of(step), step + 1);
      ASSERT_TRUE(o.ok());
      ASSERT_TRUE(o->applied);
    }
  };
  {
    auto ex = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
    ASSERT_TRUE(ex.ok());
    run_steps(**ex, 0, 2);
    ASSERT_TRUE((*ex)->store_to(*s).ok());
    EXPECT_EQ((*ex)->resident_stats().downloads, 1u);
  }
  // A fresh executor from the stored state (what a resumed run builds).
  auto ex = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
  ASSERT_TRUE(ex.ok());
  run_steps(**ex, 2, 4);
  ASSERT_TRUE((*ex)->store_to(*s).ok());
  expect_same_state(*ref.state, *s, "resumed after 2");
  // load_from into a live executor: overwrite with the reference's final state and read it back.
  auto other = make_state(*m, spec);
  ASSERT_TRUE((*ex)->load_from(*ref.state).ok());
  ASSERT_TRUE((*ex)->store_to(*other).ok());
  expect_same_state(*ref.state, *other, "load_from then store_to");
}

}  // namespace
}  // namespace ferry::train::stream
