// SPDX-License-Identifier: Apache-2.0
// The globals split (layer_optimizer.h, stream_executor.h): the embedding and the head part of
// the globals (final norm + lm_head; tied embeddings: the final norm alone) are two ready points.
// The next forward waits for the embedding before its first layer and for the head only at the
// head (in the loss window), whose weights land on a stream of their own. Checked here: both
// orders of the head's update (early: right after the embedding; late: after the CPU's last
// layer) give the in-memory reference's bits for every policy, tied and untied embeddings, MoE,
// fp32 / bf16 masters, bf16 streaming weights, bf16 gradients, accumulation 2, with the device
// tail on and off; the globals' bytes are unchanged; a slow head update is waited for after the
// forward's layers, not before them; the CPU worker's order and ready points.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "test_util.h"
#include "train/builtin_model.h"
#include "train/stream/device_optimizer_tail.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

const OptimMode kKahan8{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
const OptimMode kSr8{.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
const OptimMode kF32x8{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit};

std::unique_ptr<model::LoadedModel> untied_model(const std::string& dir) {
  BuiltinModelSpec spec = dense_spec();
  spec.tie_embeddings = false;
  EXPECT_TRUE(write_builtin_model(dir, spec, 7).ok());
  auto m = model::load_model_f32(dir);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(*m);
}

const char* name(HeadUpdate h) { return h == HeadUpdate::kEarly ? "early" : "late"; }

// Both head orders, the device tail off and on (every layer may go to the device, 2 slots): the
// reference's losses, norms and state bits; the globals cross once per step in total.
void check_split(const model::LoadedModel& m, const std::vector<std::string>& policies,
                 RunSpec spec) {
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult ref = run_reference(m, spec, data);
  const bool tail_ok =
      spec.mode.master != MasterWeights::kF32 || spec.mode.states == OptimizerStates::k8Bit;
  for (const HeadUpdate h : {HeadUpdate::kEarly, HeadUpdate::kLate}) {
    for (const int K : {0, kDeviceUpdateAllLayers}) {
      if (K != 0 && !tail_ok) continue;
      for (const std::string& p : policies) {
        RunSpec r = spec;
        r.head_update = h;
        r.device_update_layers = K;
        const std::string what =
            p + " head " + name(h) + " tail " + std::to_string(K) + " " + describe(spec.mode);
        const RunResult st = run_stream(m, r, data, p);
        ASSERT_EQ(st.losses.size(), ref.losses.size()) << what;
        for (std::size_t i = 0; i < ref.losses.size(); ++i) {
          EXPECT_EQ(st.losses[i], ref.losses[i]) << what << " step " << i;
          EXPECT_EQ(st.outcomes[i].grad_norm, ref.outcomes[i].grad_norm) << what << " step " << i;
        }
        expect_same_state(*ref.state, *st.state, what);
        auto arena = HostArena::create(*st.state);
        ASSERT_TRUE(arena.ok());
        const int G = (*arena)->globals_unit();
        EXPECT_EQ(st.stats.globals_h2d,
                  static_cast<std::uint64_t>(spec.steps) * (*arena)->unit_weight_bytes(G))
            << what;
      }
    }
  }
}

TEST(GlobalsSplit, TiedAndUntiedMatchInMemoryForEveryPolicyAndHeadOrder) {
  const std::string dir = testing::temp_dir("globals_dense");
  auto tied = dense_model(dir + "/tied");
  auto untied = untied_model(dir + "/untied");
  ASSERT_TRUE(tied->geometry.tied_embeddings);
  ASSERT_FALSE(untied->geometry.tied_embeddings);
  const std::string nv = testing::temp_dir("globals_nvme");
  for (const model::LoadedModel* m : {tied.get(), untied.get()}) {
    check_split(*m, {"device", "host", "every:2", "mix:dhrn:" + nv}, {});  // fp32 / fp32
    RunSpec spec;
    spec.mode = kKahan8;
    check_split(*m, {"every:2", "host"}, spec);
  }
}

// bf16 streaming weights (an fp32 master's bf16 copy, a bf16-SR master: the head lands through
// the bf16 path) and bf16 gradients.
TEST(GlobalsSplit, Bf16WeightsAndGradientsMatchInMemory) {
  const std::string dir = testing::temp_dir("globals_bf16");
  auto tied = dense_model(dir + "/tied");
  auto untied = untied_model(dir + "/untied");
  for (const model::LoadedModel* m : {tied.get(), untied.get()}) {
    RunSpec spec;
    spec.mode = kF32x8;
    spec.bf16_compute = true;
    check_split(*m, {"every:2", "device"}, spec);
    spec.mode = kSr8;
    spec.bf16_compute = false;
    spec.bf16_grads = true;
    check_split(*m, {"host", "every:2"}, spec);
  }
}

TEST(GlobalsSplit, MoeMatchesInMemory) {
  auto m = moe_model();
  ASSERT_FALSE(m->geometry.tied_embeddings);
  check_split(*m, {"every:2"}, {});
  RunSpec spec;
  spec.mode = kKahan8;
  spec.bf16_grads = true;
  check_split(*m, {"host"}, spec);
}

// The head's update is slow (a delay before it on the CPU worker): the next forward runs its
// layers — updated by the CPU before the head (late) or by the device tail while the CPU is in the
// head (early, every layer to the device) — and waits in the loss window, not before its first
// layer. The bits stay the reference's. Before the split the whole globals unit was waited for
// before the embedding, outside every window.
TEST(GlobalsSplit, ForwardRunsItsLayersThenWaitsForTheHead) {
  const std::string dir = testing::temp_dir("globals_delay");
  auto m = untied_model(dir + "/model");
  const int L = m->geometry.layers;
  const int head = L + 1;  // LayerOptimizer::head_unit(): the arena's units + 1
  static constexpr int kDelayMs = 250;
  RunSpec spec;
  spec.mode = kKahan8;
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 5);
  const RunResult ref = run_reference(*m, spec, data);
  for (const HeadUpdate h : {HeadUpdate::kLate, HeadUpdate::kEarly}) {
    RunSpec r = spec;
    r.head_update = h;
    // Early: the CPU is in the head while the device takes every layer.
    r.device_update_layers = h == HeadUpdate::kEarly ? kDeviceUpdateAllLayers : 0;
    r.cpu_update_hook = [head](int u) {
      if (u == head) std::this_thread::sleep_for(std::chrono::milliseconds(kDelayMs));
    };
    const std::string what = std::string("head ") + name(h);
    const RunResult st = run_stream(*m, r, data, "every:2");
    ASSERT_EQ(st.losses.size(), ref.losses.size()) << what;
    for (std::size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_EQ(st.losses[i], ref.losses[i]) << what << " step " << i;
    }
    expect_same_state(*ref.state, *st.state, what);
    // Steps 1 and 2 start while the head's update of the step before sleeps: the wait lands in
    // the loss window (L), the forward windows (0..L-1) wait for far less.
    const double waits = (spec.steps - 1) * kDelayMs * 1e-3;
    ASSERT_EQ(st.stats.window_exposed_s.size(), static_cast<std::size_t>(2 * L + 1));
    EXPECT_GE(st.stats.window_exposed_s[static_cast<std::size_t>(L)], 0.6 * waits) << what;
    double forward = 0.0;
    for (int l = 0; l < L; ++l) forward += st.stats.window_exposed_s[static_cast<std::size_t>(l)];
    EXPECT_LT(forward, 0.3 * waits) << what;
    if (r.device_update_layers != 0) {
      // The device took every layer while the CPU was in the head.
      EXPECT_EQ(st.tail.units_updated, static_cast<std::uint64_t>(spec.steps) * L) << what;
    }
  }
}

// The CPU worker's order: the embedding, then the head (early) or the layers first (late); with a
// shared range the layers from the top. wait_ready(globals) returns while the head is held.
TEST(LayerOptimizer, GlobalsAreTwoReadyPointsInTheChosenOrder) {
  const std::string dir = testing::temp_dir("globals_order");
  auto m = untied_model(dir + "/model");
  RunSpec spec;
  spec.mode = kKahan8;
  auto s = make_state(*m, spec);
  auto arena = HostArena::create(*s);
  ASSERT_TRUE(arena.ok());
  const int G = (*arena)->globals_unit(), L = G;
  for (const HeadUpdate h : {HeadUpdate::kEarly, HeadUpdate::kLate}) {
    for (const bool shared : {false, true}) {
      std::mutex mu;
      std::condition_variable cv;
      bool release = false;
      std::vector<int> ran;
      LayerOptimizer opt(
          **arena, 1,
          [&](int u) {
            std::unique_lock lk(mu);
            ran.push_back(u);
            if (u == G + 1) cv.wait(lk, [&] { return release; });  // hold the head
          },
          h);
      EXPECT_EQ(opt.head_unit(), G + 1);
      const ParamLoc& embed = (*arena)->params()[(*arena)->unit_params(G)[0]];
      EXPECT_EQ(opt.embed_elements(), embed.n);
      if (shared) opt.share_layers(0);  // no bottom claimer: the worker takes every layer
      opt.submit({.lr = 1e-3f, .step = 1});
      opt.wait_ready(G);  // the embedding alone; the head is held
      EXPECT_FALSE(opt.is_ready(opt.head_unit())) << name(h);
      if (h == HeadUpdate::kLate) {
        for (int u = 0; u < L; ++u) opt.wait_ready(u);  // the layers do not wait for the head
      }
      {
        std::lock_guard lk(mu);
        release = true;
      }
      cv.notify_all();
      opt.wait_all();
      EXPECT_TRUE(opt.is_ready(opt.head_unit()));
      std::vector<int> layers;
      for (int u = 0; u < L; ++u) layers.push_back(shared ? L - 1 - u : u);
      std::vector<int> want = {G};
      if (h == HeadUpdate::kEarly) want.push_back(G + 1);
      want.insert(want.end(), layers.begin(), layers.end());
      if (h == HeadUpdate::kLate) want.push_back(G + 1);
      std::lock_guard lk(mu);
      EXPECT_EQ(ran, want) << name(h) << " shared " << shared;
      // unit_busy_s keeps one globals entry (embedding + head), globals_busy_s splits it.
      const std::vector<double> busy = opt.unit_busy_s();
      ASSERT_EQ(busy.size(), static_cast<std::size_t>((*arena)->num_units()));
      const auto split = opt.globals_busy_s();
      EXPECT_GT(split[0], 0.0);
      EXPECT_GT(split[1], 0.0);
      EXPECT_DOUBLE_EQ(busy.back(), split[0] + split[1]);
    }
  }
}

TEST(LayerOptimizer, ParsesHeadUpdate) {
  EXPECT_EQ(*parse_head_update("early"), HeadUpdate::kEarly);
  EXPECT_EQ(*parse_head_update("late"), HeadUpdate::kLate);
  EXPECT_EQ(parse_head_update("middle").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::train::stream
