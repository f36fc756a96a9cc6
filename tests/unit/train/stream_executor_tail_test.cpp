// SPDX-License-Identifier: Apache-2.0
// The device optimizer tail (device_optimizer_tail.h, --device-update-layers K): the streamed
// executor with layers 0..K-1 updated through Backend::hybrid_adamw in the (emulated) device tier
// and the rest by the CPU worker gives the in-memory reference's losses, weights and states bit
// for bit after several steps — every fixed policy, bf16-Kahan / bf16-SR / fp32 masters with
// 8-bit states, gradient accumulation, MoE, bf16 gradients, bf16 streaming weights, K = 1, 2 and
// all, with 1, 2 and 3 staging slots in flight — and the tail really ran (units and bytes
// counted, the CPU worker skipped those units, claims ran ahead by the slots). Refusals: K
// beyond the layers, f32 master + f32 states in a tail layer, a budget without room for the
// staging (naming the slots that fit); the Backend op's argument checks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "kernels/backend.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "tail_test_util.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/stream/device_optimizer_tail.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

using namespace tail_test;  // NOLINT(google-build-using-namespace): the shared checks
using Section = HostArena::Section;

TEST(DeviceOptimizerTail, EveryPolicyAndModeMatchesInMemoryBitForBit) {
  const std::string dir = testing::temp_dir("tail_dense");
  auto m = dense_model(dir + "/model");
  const std::string nv = testing::temp_dir("tail_nvme");
  for (const OptimMode& mode : {kKahan8, kSr8, kF32x8}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_tail(*m, {"device", "host", "every:2", "mix:dhrn:" + nv}, spec);
  }
}

// Every layer on the device (K = L given as a number), and the fp32 master's bf16 streaming copy
// written there.
TEST(DeviceOptimizerTail, AllLayersAndBf16StreamingCopyMatchInMemory) {
  const std::string dir = testing::temp_dir("tail_all");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kSr8;
  check_tail(*m, {"every:2"}, spec, {m->geometry.layers});
  spec.mode = kF32x8;
  spec.bf16_compute = true;
  check_tail(*m, {"every:2", "host"}, spec);
  // The CPU worker's thread pool updating layers K..L-1 beside the tail.
  spec.mode = kKahan8;
  spec.bf16_compute = false;
  spec.optimizer_threads = 3;
  check_tail(*m, {"every:2"}, spec);
}

TEST(DeviceOptimizerTail, Bf16GradientsMatchInMemory) {
  const std::string dir = testing::temp_dir("tail_bf16g");
  auto m = dense_model(dir + "/model");
  const std::string nv = testing::temp_dir("tail_bf16g_nvme");
  for (const OptimMode& mode : {kKahan8, kSr8}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    spec.bf16_grads = true;
    check_tail(*m, {"device", "host", "every:2", "mix:dhrn:" + nv}, spec);
  }
}

TEST(DeviceOptimizerTail, MoeMatchesInMemory) {
  auto m = moe_model();
  ASSERT_GT(m->geometry.experts, 0);
  for (const OptimMode& mode : {kKahan8, kSr8, kF32x8}) {
    SCOPED_TRACE(describe(mode));
    RunSpec spec;
    spec.mode = mode;
    check_tail(*m, {"every:2", "device"}, spec);
  }
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  check_tail(*m, {"host"}, spec);
}

// The CPU worker leaves the tail's units alone (no time charged to them) and still updates the
// rest; the planned device tier grows by exactly the staging.
TEST(DeviceOptimizerTail, CpuWorkerSkipsTheTailUnitsAndThePlanCountsTheStaging) {
  const std::string dir = testing::temp_dir("tail_busy");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  auto s = make_state(*m, spec);
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  auto ex0 = StreamExecutor::create(*s, kBatch, kSeq, {.policy = *pol}, kernels::cpu_backend());
  ASSERT_TRUE(ex0.ok()) << ex0.status().to_string();
  // A slow CPU worker (a delay before each of its units): the device takes both of its layers.
  auto slow = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  auto ex = StreamExecutor::create(
      *s, kBatch, kSeq, {.policy = *pol, .device_update_layers = 2, .cpu_update_hook = slow},
      kernels::cpu_backend());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ((*ex)->device_planned_bytes() - (*ex0)->device_planned_bytes(),
            DeviceOptimizerTail::staging_bytes((*ex)->arena(), 2, 2));
  EXPECT_GT(DeviceOptimizerTail::staging_bytes((*ex)->arena(), 2, 2), 0u);
  const std::vector<Batch> data = make_batches(2, m->geometry.vocab, 5);
  for (int step = 0; step < 2; ++step) {
    (*ex)->begin_step(1);
    ASSERT_TRUE((*ex)->micro_batch(data[static_cast<std::size_t>(step)].view()).ok());
    auto o = (*ex)->finish_step(adamw(), lr_of(step), step + 1);
    ASSERT_TRUE(o.ok());
    ASSERT_TRUE(o->applied);
  }
  (*ex)->wait_optimizer();
  const std::vector<double> busy = (*ex)->optimizer_unit_busy_s();
  EXPECT_EQ(busy[0], 0.0);
  EXPECT_EQ(busy[1], 0.0);
  EXPECT_GT(busy[2], 0.0);
  EXPECT_GT(busy.back(), 0.0);  // the globals
  EXPECT_EQ((*ex)->device_tail_stats().units_updated, 4u);
  EXPECT_EQ((*ex)->device_tail_stats().cpu_units, 4u);  // layers 2, 3 in both steps
  EXPECT_GT((*ex)->device_tail_stats().busy_s, 0.0);
}

// Delays injected on either side move the meeting point; the bits stay the reference's.
TEST(DeviceOptimizerTail, MeetingPointMovesWithTheDelaysAndTheBitsStay) {
  const std::string dir = testing::temp_dir("tail_meet");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  RunSpec spec;
  spec.mode = kKahan8;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult ref = run_reference(*m, spec, data);
  const std::uint64_t applied = applied_steps(ref);
  ASSERT_GT(applied, 0u);
  auto sleep_ms = [](int ms) {
    return [ms](int) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  };
  for (int S : {1, 2, 3}) {
    // A slow CPU: the device takes all it may, K = 2 and K = all.
    for (int K : {2, kDeviceUpdateAllLayers}) {
      RunSpec r = spec;
      r.device_update_layers = K;
      r.device_update_slots = S;
      r.cpu_update_hook = sleep_ms(20);
      const int k = K < 0 ? L : K;
      const std::string what = "slow cpu K=" + std::to_string(k) + " slots=" + std::to_string(S);
      const RunResult st = run_stream(*m, r, data, "every:2");
      check_run(*m, r, ref, st, what);
      EXPECT_EQ(st.tail.units_updated, applied * static_cast<std::uint64_t>(k)) << what;
      for (int u = 0; u < k; ++u) EXPECT_EQ(st.tail.unit_updates[u], applied) << what << " " << u;
    }
    // A slow device: it holds its first layer (and claims no further: the CPU has taken the rest
    // from the top by the time its first unit is queued).
    RunSpec r = spec;
    r.device_update_layers = kDeviceUpdateAllLayers;
    r.device_update_slots = S;
    r.device_update_hook = [](int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      return Status{};
    };
    const std::string what = "slow device slots=" + std::to_string(S);
    const RunResult st = run_stream(*m, r, data, "every:2");
    check_run(*m, r, ref, st, what);
    EXPECT_LE(st.tail.units_updated, applied) << what;  // at most layer 0 per step
    EXPECT_GE(st.tail.cpu_units, applied * static_cast<std::uint64_t>(L - 1)) << what;
    for (int u = 1; u < L; ++u) EXPECT_EQ(st.tail.unit_updates[u], 0u) << what << " " << u;
  }
}

// The tail claims ahead while a slot is free: with S slots, when it claims layer u the S - 1
// layers below it are still in flight (queued, not yet marked done) and layer u - S is done; a
// unit is marked only after its own copies back ran. On the emulated tier (host streams, the
// work runs at enqueue), straight on a LayerOptimizer whose CPU worker is slowed.
TEST(DeviceOptimizerTail, ClaimsRunAheadByTheSlotsAndMarkAfterTheirCopiesBack) {
  const std::string dir = testing::temp_dir("tail_ahead");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  auto s = make_state(*m, spec);
  auto arena = HostArena::create(*s);
  ASSERT_TRUE(arena.ok()) << arena.status().to_string();
  const int L = (*arena)->globals_unit();
  ASSERT_GE(L, 4);
  auto streams = mem::StreamSet::create(Device::kCpu, 0);
  ASSERT_TRUE(streams.ok());
  for (int S : {1, 2, 3}) {
    // The CPU worker sleeps before each unit (the globals first), so the device claims all L.
    LayerOptimizer opt(**arena, 1,
                       [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
    std::vector<std::uint8_t> staging(DeviceOptimizerTail::staging_bytes(**arena, L, S));
    std::mutex mu;
    std::vector<std::vector<bool>> ready_at_claim;  // [claim][layer] is_ready when claimed
    auto tail = DeviceOptimizerTail::create(**arena, opt, kDeviceUpdateAllLayers, S,
                                            kernels::cpu_backend(), mem::host_transfer_engine(),
                                            staging.data(), staging.size(), *streams, [&](int u) {
                                              std::vector<bool> r;
                                              for (int l = 0; l < L; ++l)
                                                r.push_back(opt.is_ready(l));
                                              std::lock_guard lk(mu);
                                              EXPECT_EQ(u, static_cast<int>(ready_at_claim.size()));
                                              ready_at_claim.push_back(r);
                                              return Status{};
                                            });
    ASSERT_TRUE(tail.ok()) << tail.status().to_string();
    const UpdateArgs args{.lr = 1e-3f, .step = 1};
    opt.submit(args);
    (*tail)->submit(args);
    ASSERT_TRUE((*tail)->wait().ok());
    opt.wait_all();
    std::lock_guard lk(mu);
    ASSERT_EQ(static_cast<int>(ready_at_claim.size()), L) << S;
    for (int u = 0; u < L; ++u) {
      for (int l = 0; l < u; ++l) {
        // Layers u-S+1 .. u-1 in flight, u-S and below marked.
        EXPECT_EQ(ready_at_claim[u][l], l <= u - S) << "slots " << S << " claim " << u << " " << l;
      }
      for (int l = u; l < L; ++l) EXPECT_FALSE(ready_at_claim[u][l]) << S << " " << u << " " << l;
    }
    EXPECT_EQ((*tail)->stats().units_updated, static_cast<std::uint64_t>(L));
    EXPECT_EQ((*tail)->stats().slots, S);
  }
}

// The device tier holds slots x the largest layer's optimizer sections (each section 256-byte
// aligned), plus one f32 widening buffer of the largest parameter with bf16 gradients: the plan
// grows by exactly that, for 1, 2, 3 slots and K = 1, all.
TEST(DeviceOptimizerTail, PlanHoldsSlotsTimesTheLargestUnit) {
  const std::string dir = testing::temp_dir("tail_plan");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  auto pol = parse_policy("every:2", L);
  ASSERT_TRUE(pol.ok());
  auto align = [](std::size_t n) { return (n + 255) / 256 * 256; };
  for (bool bf16g : {false, true}) {
    RunSpec spec;
    spec.mode = kKahan8;
    spec.bf16_grads = bf16g;
    auto s = make_state(*m, spec);
    auto ex0 = StreamExecutor::create(*s, kBatch, kSeq, {.policy = *pol}, kernels::cpu_backend());
    ASSERT_TRUE(ex0.ok()) << ex0.status().to_string();
    const HostArena& a = (*ex0)->arena();
    for (int K : {1, kDeviceUpdateAllLayers}) {
      const int k = K < 0 ? L : K;
      std::size_t unit = 0, widen = 0;
      for (int u = 0; u < k; ++u) {
        std::size_t b = 0;
        for (Section sec : {Section::kWeights, Section::kMaster, Section::kM, Section::kV,
                            Section::kMAbsmax, Section::kVAbsmax, Section::kGrads}) {
          b += align(a.section(u, sec).size);
        }
        unit = std::max(unit, b);
        for (int idx : a.unit_params(u)) {
          const std::size_t n =
              static_cast<std::size_t>(a.params()[static_cast<std::size_t>(idx)].n);
          if (bf16g) widen = std::max(widen, align(n * 4));
        }
      }
      ASSERT_GT(unit, 0u);
      for (int S : {1, 2, 3}) {
        auto ex = StreamExecutor::create(
            *s, kBatch, kSeq, {.policy = *pol, .device_update_layers = K, .device_update_slots = S},
            kernels::cpu_backend());
        ASSERT_TRUE(ex.ok()) << ex.status().to_string();
        EXPECT_EQ((*ex)->device_planned_bytes() - (*ex0)->device_planned_bytes(),
                  static_cast<std::size_t>(S) * unit + widen)
            << "K=" << k << " slots=" << S << " bf16 grads " << bf16g;
        EXPECT_EQ(DeviceOptimizerTail::staging_bytes(a, K, S),
                  static_cast<std::size_t>(S) * unit + widen);
      }
    }
  }
}

// A failed device unit: the forward does not hang on it, the error comes back as a Status (the
// next micro-batch or finish_step at the latest), store_to refuses, and the executor ends. With
// several slots the failing claim may be the second, while the first unit is still in flight: that
// one finishes (counted), the failed one is marked without an update, nothing hangs.
TEST(DeviceOptimizerTail, FailedUnitSurfacesAsStatusWithoutHanging) {
  const std::string dir = testing::temp_dir("tail_fail");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kSr8;
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  struct Case {
    int slots, fail_claim;  // which claim (0-based, over the run) fails
  };
  for (const Case c : {Case{1, 0}, Case{2, 0}, Case{2, 1}, Case{3, 1}}) {
    const std::string what =
        "slots=" + std::to_string(c.slots) + " failing claim " + std::to_string(c.fail_claim);
    auto s = make_state(*m, spec);
    std::atomic<int> calls{0};
    StreamOptions so{.policy = *pol, .device_update_layers = 2, .device_update_slots = c.slots};
    // The CPU is slowed so the device surely claims both of its layers in the first update.
    so.cpu_update_hook = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
    so.device_update_hook = [&, c](int u) -> Status {
      if (calls++ == c.fail_claim) return internal_error("test: injected failure of layer {}", u);
      return {};
    };
    auto ex = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
    ASSERT_TRUE(ex.ok()) << ex.status().to_string();
    const std::vector<Batch> data = make_batches(3, m->geometry.vocab, 5);
    const Timer t;
    Status first;
    int failed_at = -1;
    for (int step = 0; step < 3 && first.ok(); ++step) {
      (*ex)->begin_step(1);
      auto f = (*ex)->micro_batch(data[static_cast<std::size_t>(step)].view());
      if (!f.ok()) {
        first = f.status();
        failed_at = step;
        break;
      }
      auto o = (*ex)->finish_step(adamw(), lr_of(step), step + 1);
      if (!o.ok()) {
        first = o.status();
        failed_at = step;
      }
    }
    ASSERT_FALSE(first.ok()) << what;
    EXPECT_EQ(failed_at, 1) << what;  // step 0 submitted the update; step 1 sees its failure
    EXPECT_EQ(first.code(), StatusCode::kInternal) << first.to_string();
    const std::string layer = "injected failure of layer " + std::to_string(c.fail_claim);
    EXPECT_NE(first.message().find(layer), std::string::npos) << what << ": " << first.to_string();
    EXPECT_EQ((*ex)->store_to(*s).code(), StatusCode::kInternal) << what;
    // Every claim but the failed one was an update (the first unit in flight included).
    EXPECT_EQ(calls.load(), c.fail_claim + 1) << what;
    EXPECT_EQ((*ex)->device_tail_stats().units_updated + 1,
              static_cast<std::uint64_t>(calls.load()))
        << what;
    auto arena = StreamExecutor::release_arena(std::move(*ex));
    EXPECT_NE(arena, nullptr);
    EXPECT_LT(t.elapsed_s(), 10.0) << what;
  }
}

// The executor ends mid-step (both sides slow, updates in flight) without hanging.
TEST(DeviceOptimizerTail, DestructionMidStepDoesNotHang) {
  const std::string dir = testing::temp_dir("tail_dtor");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  auto pol = parse_policy("host", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  const std::vector<Batch> data = make_batches(1, m->geometry.vocab, 5);
  for (int slots : {1, 3})
    for (bool release : {false, true}) {
      auto s = make_state(*m, spec);
      StreamOptions so{.policy = *pol, .device_update_layers = 2, .device_update_slots = slots};
      so.cpu_update_hook = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
      so.device_update_hook = [](int) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        return Status{};
      };
      auto ex = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
      ASSERT_TRUE(ex.ok()) << ex.status().to_string();
      (*ex)->begin_step(1);
      ASSERT_TRUE((*ex)->micro_batch(data[0].view()).ok());
      auto o = (*ex)->finish_step(adamw(), lr_of(0), 1);
      ASSERT_TRUE(o.ok() && o->applied);
      const Timer t;
      if (release) {
        EXPECT_NE(StreamExecutor::release_arena(std::move(*ex)), nullptr);
      } else {
        ex->reset();
      }
      EXPECT_LT(t.elapsed_s(), 5.0) << release << " slots " << slots;
    }
}

TEST(DeviceOptimizerTail, RefusesWhatItCannotRun) {
  const std::string dir = testing::temp_dir("tail_refuse");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  auto pol = parse_policy("every:2", L);
  ASSERT_TRUE(pol.ok());
  auto create = [&](const RunSpec& spec, int K, std::size_t budget, int slots = 1) {
    auto s = make_state(*m, spec);
    return StreamExecutor::create(*s, kBatch, kSeq,
                                  {.policy = *pol,
                                   .device_budget_bytes = budget,
                                   .device_update_layers = K,
                                   .device_update_slots = slots},
                                  kernels::cpu_backend());
  };
  constexpr std::size_t kAny = mem::MemoryBudget::kUnlimited;
  RunSpec q8;
  q8.mode = kKahan8;
  for (int K : {L + 1, -2}) {
    auto r = create(q8, K, kAny);
    ASSERT_FALSE(r.ok()) << K;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--device-update-layers"), std::string::npos)
        << r.status().to_string();
  }
  EXPECT_TRUE(create(q8, L, kAny).ok());
  EXPECT_TRUE(create(q8, kDeviceUpdateAllLayers, kAny).ok());
  // f32 master + f32 states: every parameter, or the ones --8bit-params leaves out.
  RunSpec f32;
  auto r = create(f32, 1, kAny);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().to_string();
  EXPECT_TRUE(create(f32, 0, kAny).ok());
  RunSpec subset;
  subset.mode = kF32x8;
  subset.q8_params = "mlp";
  r = create(subset, 1, kAny);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fp32 states"), std::string::npos) << r.status().to_string();
  // A budget that holds the executor but not the staging.
  auto plain = create(q8, 0, kAny);
  ASSERT_TRUE(plain.ok());
  const std::size_t without = (*plain)->device_planned_bytes();
  r = create(q8, 1, without);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("--device-update-layers 1 with 1 staging slots needs"),
            std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find("not even 1 slot"), std::string::npos)
      << r.status().to_string();
  auto with = create(q8, 1, kAny);
  ASSERT_TRUE(with.ok());
  EXPECT_TRUE(create(q8, 1, (*with)->device_planned_bytes()).ok());
  // Room for one slot of every layer but not three: the message names the slots that fit.
  const std::size_t one = (*with)->device_planned_bytes();
  r = create(q8, kDeviceUpdateAllLayers, one, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("--device-update-layers " + std::to_string(L) +
                                      " with 3 staging slots needs"),
            std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find("--device-update-slots 1 fits"), std::string::npos)
      << r.status().to_string();
  EXPECT_TRUE(create(q8, kDeviceUpdateAllLayers, one, 1).ok());
  // Slots outside [1, kMaxDeviceUpdateSlots].
  for (int slots : {0, kMaxDeviceUpdateSlots + 1}) {
    r = create(q8, 1, kAny, slots);
    ASSERT_FALSE(r.ok()) << slots;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  }
}

TEST(LayerOptimizer, ExternalUnitsAreSkippedAndWaitForTheirUpdater) {
  const std::string dir = testing::temp_dir("tail_external");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  auto s = make_state(*m, spec);
  auto arena = HostArena::create(*s);
  ASSERT_TRUE(arena.ok());
  std::mutex mu;
  std::vector<int> ran;
  LayerOptimizer opt(**arena, 1, [&](int u) {
    std::lock_guard lk(mu);
    ran.push_back(u);
  });
  opt.set_external({0, 1});
  opt.submit({.lr = 1e-3f, .step = 1});
  for (int u = 2; u < (*arena)->num_units(); ++u) opt.wait_ready(u);
  EXPECT_FALSE(opt.is_ready(0));
  EXPECT_FALSE(opt.is_ready(1));
  opt.mark_external_done(1);
  opt.mark_external_done(0);
  opt.wait_all();
  // The embedding, the head part (early, the default), then the worker's layers.
  std::vector<int> want = {(*arena)->globals_unit(), opt.head_unit()};
  for (int u = 2; u < (*arena)->globals_unit(); ++u) want.push_back(u);
  std::lock_guard lk(mu);
  EXPECT_EQ(ran, want);
}

// The shared range: the bottom-up claimer and the worker (the embedding and the head first, then
// from the top) take every layer exactly once and meet; the bottom side never goes past its
// maximum.
TEST(LayerOptimizer, SharedLayersAreClaimedFromBothEndsOnce) {
  const std::string dir = testing::temp_dir("tail_shared");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  auto s = make_state(*m, spec);
  auto arena = HostArena::create(*s);
  ASSERT_TRUE(arena.ok());
  const int L = (*arena)->globals_unit();
  for (int most : {0, 1, L}) {
    std::mutex mu;
    std::vector<int> ran;
    LayerOptimizer opt(**arena, 1, [&](int u) {
      std::lock_guard lk(mu);
      ran.push_back(u);
    });
    opt.share_layers(most);
    for (int step = 1; step <= 2; ++step) {
      {
        std::lock_guard lk(mu);
        ran.clear();
      }
      opt.submit({.lr = 1e-3f, .step = step});
      std::vector<int> bottom;
      for (int u = opt.claim_bottom(); u >= 0; u = opt.claim_bottom()) {
        bottom.push_back(u);
        opt.mark_bottom_done(u);
      }
      opt.wait_all();
      std::lock_guard lk(mu);
      ASSERT_FALSE(ran.empty());
      ASSERT_GE(ran.size(), 2u);
      EXPECT_EQ(ran[0], L);      // the embedding first
      EXPECT_EQ(ran[1], L + 1);  // then the head (HeadUpdate::kEarly)
      EXPECT_LE(static_cast<int>(bottom.size()), most);
      for (std::size_t i = 0; i < bottom.size(); ++i) EXPECT_EQ(bottom[i], static_cast<int>(i));
      // The worker's layers: from the top down to just above the bottom side's.
      std::vector<int> want;
      for (int u = L - 1; u >= static_cast<int>(bottom.size()); --u) want.push_back(u);
      EXPECT_EQ(std::vector<int>(ran.begin() + 2, ran.end()), want) << most;
    }
  }
}

TEST(HybridAdamWOp, BackendChecksItsArguments) {
  namespace kc = kernels::cpu;
  std::vector<float> g(4096, 0.1f), p(4096, 1.0f), absm(2), absv(2);
  std::vector<std::uint16_t> w(4096), c(4096);
  std::vector<std::uint8_t> m8(4096), v8(4096);
  kernels::HybridAdamWArgs a;
  a.master = kc::MasterKind::kBf16Kahan;
  a.states = kc::StateKind::kQ8;
  a.k = kc::make_adamw_constants(1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
  a.span = {.n = 4096,
            .grad = g.data(),
            .p16 = w.data(),
            .comp16 = c.data(),
            .m8 = m8.data(),
            .v8 = v8.data(),
            .m_absmax = absm.data(),
            .v_absmax = absv.data()};
  kernels::Backend& be = kernels::cpu_backend();
  mem::Stream& st = mem::Stream::host();
  EXPECT_TRUE(be.hybrid_adamw(a, st).ok());
  auto bad = a;
  bad.span.comp16 = nullptr;
  EXPECT_EQ(be.hybrid_adamw(bad, st).code(), StatusCode::kInvalidArgument);
  bad = a;
  bad.span.index0 = 1024;  // not on an 8-bit block
  EXPECT_EQ(be.hybrid_adamw(bad, st).code(), StatusCode::kInvalidArgument);
  bad = a;
  bad.device = Device::kCuda;
  EXPECT_EQ(be.hybrid_adamw(bad, st).code(), StatusCode::kInvalidArgument);
  bad = a;
  bad.states = kc::StateKind::kF32;  // 8-bit pointers given
  EXPECT_EQ(be.hybrid_adamw(bad, st).code(), StatusCode::kInvalidArgument);
  bad = a;
  bad.master = kc::MasterKind::kF32;
  bad.span.p32 = p.data();
  bad.span.comp16 = nullptr;
  EXPECT_TRUE(be.hybrid_adamw(bad, st).ok());  // f32 master + 8-bit states (p16: a bf16 copy)
  EXPECT_EQ(kernels::reference_backend().hybrid_adamw(a, st).code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ferry::train::stream
