// SPDX-License-Identifier: Apache-2.0
// The device tail's pre-staging (DeviceOptimizerTail::prestage): during the last micro-batch's
// backward the first layers' optimizer sections but the gradients go up into the staging slots;
// at submit a staged unit the device claims uploads only its gradients, one the CPU worker claims
// is dropped (the device writes back only what it claimed). Checked: the in-memory reference's
// bits with pre-staging on and off, K = 1, 2, all x slots 1..3, delays on the CPU, the device and
// the pre-staging itself; the staged sections really are what the kernels read (the arena's copy
// is spoiled after the claim: the result is still the reference's, and without pre-staging it is
// not); a failure while pre-staging comes back as a Status without a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "kernels/backend.h"
#include "tail_test_util.h"
#include "test_util.h"
#include "train/rng.h"
#include "train/stream/device_optimizer_tail.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

using namespace tail_test;  // NOLINT(google-build-using-namespace): the shared checks

auto sleep_ms(int ms) {
  return [ms](int) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
}

// Pre-staging on (the default) and off: K = 1, 2, all x slots 1..3 give the reference's bits, the
// staged units and bytes are what the layout says (check_run).
TEST(DeviceTailPrestage, OnAndOffMatchInMemory) {
  const std::string dir = testing::temp_dir("prestage_dense");
  auto m = dense_model(dir + "/model");
  const std::string nv = testing::temp_dir("prestage_nvme");
  for (const bool on : {true, false}) {
    RunSpec spec;
    spec.mode = kKahan8;
    spec.device_update_prestage = on;
    check_tail(*m, {"every:2", "mix:dhrn:" + nv}, spec);
    spec.mode = kF32x8;
    spec.bf16_grads = true;
    check_tail(*m, {"host"}, spec);
  }
}

TEST(DeviceTailPrestage, MoeAndBf16SrMatchInMemory) {
  auto m = moe_model();
  RunSpec spec;
  spec.mode = kSr8;
  check_tail(*m, {"every:2"}, spec, {1, kDeviceUpdateAllLayers}, {1, 3});
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  check_tail(*m, {"host"}, spec, {2}, {2});
}

// Delays move who takes what; the bits stay the reference's. A slow CPU: the device takes all it
// may, each staged unit is a hit. A slow device: it takes layer 0 (staged: a hit) and the CPU the
// staged layers 1.. (dropped, never written back by the device). A slow pre-staging (longer than
// the backward): finish_step waits for it before it submits the update.
TEST(DeviceTailPrestage, DelaysOnEitherSideKeepTheBits) {
  const std::string dir = testing::temp_dir("prestage_delay");
  auto m = dense_model(dir + "/model");
  const int L = m->geometry.layers;
  RunSpec spec;
  spec.mode = kKahan8;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult ref = run_reference(*m, spec, data);
  const std::uint64_t applied = applied_steps(ref);
  ASSERT_EQ(applied, static_cast<std::uint64_t>(spec.steps));
  for (int S : {1, 2, 3}) {
    for (int K : {1, 2, kDeviceUpdateAllLayers}) {
      const int k = K < 0 ? L : K;
      RunSpec r = spec;
      r.device_update_layers = K;
      r.device_update_slots = S;
      r.cpu_update_hook = sleep_ms(20);
      const std::string what = "slow cpu K=" + std::to_string(k) + " slots=" + std::to_string(S);
      const RunResult st = run_stream(*m, r, data, "every:2");
      check_run(*m, r, ref, st, what);
      EXPECT_EQ(st.tail.units_updated, applied * static_cast<std::uint64_t>(k)) << what;
      EXPECT_EQ(st.tail.prestage_hits, applied * static_cast<std::uint64_t>(std::min(S, k)))
          << what;
    }
    RunSpec r = spec;
    r.device_update_layers = kDeviceUpdateAllLayers;
    r.device_update_slots = S;
    r.device_update_hook = [](int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      return Status{};
    };
    std::string what = "slow device slots=" + std::to_string(S);
    RunResult st = run_stream(*m, r, data, "every:2");
    check_run(*m, r, ref, st, what);
    EXPECT_LE(st.tail.units_updated, applied) << what;  // layer 0 at most
    EXPECT_EQ(st.tail.prestaged_units, applied * static_cast<std::uint64_t>(S)) << what;
    EXPECT_EQ(st.tail.prestage_hits, st.tail.units_updated) << what;
    // A slow pre-staging (30 ms per unit: longer than the backward), the CPU slower still (50 ms
    // per unit: the embedding, the head and two layers before it reaches layer 1) so the device
    // takes its two layers with their staging.
    r = spec;
    r.device_update_layers = 2;
    r.device_update_slots = S;
    r.cpu_update_hook = sleep_ms(50);
    r.device_prestage_hook = [](int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      return Status{};
    };
    what = "slow prestage slots=" + std::to_string(S);
    st = run_stream(*m, r, data, "every:2");
    check_run(*m, r, ref, st, what);
    EXPECT_EQ(st.tail.prestage_hits, applied * static_cast<std::uint64_t>(std::min(S, 2))) << what;
  }
}

// The kernels read the staged sections, not the arena's at submit: right after the device claims
// a staged unit its optimizer state in the arena is spoiled (every byte of m, v, master / Kahan
// words flipped); the device's result is still the CPU-only reference's. Without pre-staging the
// same spoiling changes the result (so the check can fail). Straight on a LayerOptimizer + tail
// (the CPU worker slowed so that the device claims every layer).
TEST(DeviceTailPrestage, StagedSectionsAreWhatTheKernelsRead) {
  const std::string dir = testing::temp_dir("prestage_read");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  auto s = make_state(*m, spec);
  using Section = HostArena::Section;
  const std::vector<Section> all = {Section::kWeights, Section::kMaster,  Section::kM,
                                    Section::kV,       Section::kMAbsmax, Section::kVAbsmax,
                                    Section::kGrads};
  auto make_arena = [&]() {
    auto a = HostArena::create(*s);
    EXPECT_TRUE(a.ok());
    Rng rng(17);  // the same gradients in every arena
    for (int u = 0; u < (*a)->num_units(); ++u) {
      const HostArena::Bytes g = (*a)->section(u, Section::kGrads);
      auto* g16 = reinterpret_cast<std::uint16_t*>(g.data);
      for (std::size_t i = 0; i < g.size / 2; ++i) {
        g16[i] = f32_to_bf16(static_cast<float>(rng.normal() * 1e-2));
      }
    }
    return std::move(*a);
  };
  const UpdateArgs args{.lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 1};
  // The reference: the CPU worker alone.
  auto ref = make_arena();
  {
    LayerOptimizer opt(*ref, 1);
    opt.submit(args);
    opt.wait_all();
  }
  const int L = ref->globals_unit();
  auto streams = mem::StreamSet::create(Device::kCpu, 0);
  ASSERT_TRUE(streams.ok());
  for (const int S : {1, 2, 3}) {
    for (const bool pre : {true, false}) {
      auto arena = make_arena();
      LayerOptimizer opt(*arena, 1, sleep_ms(100));  // slow: the device claims every layer
      std::vector<std::uint8_t> staging(DeviceOptimizerTail::staging_bytes(*arena, L, S));
      HostArena* a = arena.get();
      auto tail = DeviceOptimizerTail::create(
          *arena, opt, kDeviceUpdateAllLayers, S, kernels::cpu_backend(),
          mem::host_transfer_engine(), staging.data(), staging.size(), *streams, [a, S](int u) {
            if (u >= S) return Status{};  // not staged
            for (Section sec : {Section::kMaster, Section::kM, Section::kV}) {
              const HostArena::Bytes b = a->section(u, sec);
              for (std::size_t i = 0; i < b.size; ++i) b.data[i] ^= 0x5A;
            }
            return Status{};
          });
      ASSERT_TRUE(tail.ok()) << tail.status().to_string();
      if (pre) (*tail)->prestage();
      opt.submit(args);
      (*tail)->submit(args);
      ASSERT_TRUE((*tail)->wait().ok());
      opt.wait_all();
      const DeviceTailStats st = (*tail)->stats();
      EXPECT_EQ(st.units_updated, static_cast<std::uint64_t>(L));
      EXPECT_EQ(st.prestage_hits, pre ? static_cast<std::uint64_t>(S) : 0u);
      bool same = true;
      for (int u = 0; u <= L; ++u) {
        for (Section sec : all) {
          const HostArena::Bytes x = ref->section(u, sec), y = arena->section(u, sec);
          ASSERT_EQ(x.size, y.size);
          if (x.size > 0 && std::memcmp(x.data, y.data, x.size) != 0) same = false;
        }
      }
      EXPECT_EQ(same, pre) << "slots " << S << " prestage " << pre;
    }
  }
}

// A failure while pre-staging: no hang, the error comes back as the Status of the step's
// finish_step (which waits for the pre-staging), nothing is submitted after it, store_to refuses.
TEST(DeviceTailPrestage, FailureSurfacesAsStatusWithoutHanging) {
  const std::string dir = testing::temp_dir("prestage_fail");
  auto m = dense_model(dir + "/model");
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  for (const int S : {1, 3}) {
    for (const int fail_at : {0, 1}) {  // which pre-staging call (over the run) fails
      if (fail_at >= S) continue;       // one call per slot and step: the second needs 2 slots
      const std::string what = "slots " + std::to_string(S) + " fail " + std::to_string(fail_at);
      RunSpec spec;
      spec.mode = kKahan8;
      auto s = make_state(*m, spec);
      std::atomic<int> calls{0};
      StreamOptions so{
          .policy = *pol, .device_update_layers = kDeviceUpdateAllLayers, .device_update_slots = S};
      so.device_prestage_hook = [&, fail_at](int u) -> Status {
        if (calls++ == fail_at) return internal_error("test: injected prestage failure of {}", u);
        return {};
      };
      auto ex = StreamExecutor::create(*s, kBatch, kSeq, so, kernels::cpu_backend());
      ASSERT_TRUE(ex.ok()) << ex.status().to_string();
      const std::vector<Batch> data = make_batches(6, m->geometry.vocab, 5);
      const Timer t;
      Status first;
      int failed_at = -1;
      for (int step = 0; step < 3 && first.ok(); ++step) {
        (*ex)->begin_step(2);
        for (int a = 0; a < 2 && first.ok(); ++a) {
          auto f = (*ex)->micro_batch(data[static_cast<std::size_t>(2 * step + a)].view());
          if (!f.ok()) {
            first = f.status();
            failed_at = step;
          }
        }
        if (!first.ok()) break;
        auto o = (*ex)->finish_step(adamw(), lr_of(step), step + 1);
        if (!o.ok()) {
          first = o.status();
          failed_at = step;
        }
      }
      ASSERT_FALSE(first.ok()) << what;
      EXPECT_EQ(failed_at, 0) << what;  // step 0's finish_step waits for the pre-staging
      EXPECT_EQ(first.code(), StatusCode::kInternal) << first.to_string();
      EXPECT_NE(first.message().find("injected prestage failure of " + std::to_string(fail_at)),
                std::string::npos)
          << what << ": " << first.to_string();
      EXPECT_EQ((*ex)->store_to(*s).code(), StatusCode::kInternal) << what;
      EXPECT_EQ(calls.load(), fail_at + 1) << what;  // the pre-staging stopped at the failure
      EXPECT_EQ((*ex)->device_tail_stats().units_updated, 0u) << what;
      auto arena = StreamExecutor::release_arena(std::move(*ex));
      EXPECT_NE(arena, nullptr);
      EXPECT_LT(t.elapsed_s(), 10.0) << what;
    }
  }
}

}  // namespace
}  // namespace ferry::train::stream
