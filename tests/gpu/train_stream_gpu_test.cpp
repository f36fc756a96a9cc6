// SPDX-License-Identifier: Apache-2.0
// The layer-streaming executor on the GPU (issue #4): StreamExecutor on the CUDA backend — the
// device tier in GPU memory under its budget, the host arena and boundary homes pinned, weights
// fed on the h2d stream and gradients drained on the d2h stream, ordered by events.
//
// 1. Every fixed policy gives the same losses, gradient norms, master weights and AdamW states,
//    bit for bit, as the all-on-GPU policy after 3 steps of 2 accumulated micro-batches with
//    clipping active: recompute and offload change where activations live, not the arithmetic
//    (the CUDA kernels have no atomics on these paths and the GEMM algorithm is pinned by
//    FERRY_DETERMINISTIC=1, set below before the backend exists). The bytes moved equal the CPU
//    executor's for the same policy (same schedule), and the device peak stays within the plan.
//    The attention backward runs with its dK/dV workspace (model::AttnBwdWorkspace, on by default
//    unless FERRY_ATTN_BWD_WORKSPACE=0: every executor of the process makes the same choice);
//    both models have 2 query heads per kv head, so the split is in use.
// 2. Against the CPU stream executor (itself bit-identical to the in-memory reference,
//    tests/unit/train/stream_executor_test.cpp): one step's loss and each unit's gradient, with the
//    tolerance rule of tests/gpu/model_gpu_test.cpp: err(cuda, cpu) <= 2 * err(naive, cpu) + floor,
//    naive = the CPU backend with attention in bf16 (Bf16AttentionCpu), floor = the golden f32
//    tolerances (1e-4 loss, 1e-3 gradient norm).
// 3. Exposed time is measured from events: >= 0, and the per-window parts sum to at most the
//    total.
// Skips, saying so, without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "model_fixtures.h"
#include "scoped_env.h"
#include "tests/gpu/bf16_attention_cpu.h"
#include "train/stream/resident_layers.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

bool have_cuda() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

kernels::Backend* cuda_or_null() {
  setenv("FERRY_DETERMINISTIC", "1", 0);
  auto be = kernels::cuda_backend(0);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  return be.ok() ? *be : nullptr;
}

void expect_transfers_equal(const TransferStats& a, const TransferStats& b, const std::string& p) {
  EXPECT_EQ(a.weight_h2d, b.weight_h2d) << p;
  EXPECT_EQ(a.globals_h2d, b.globals_h2d) << p;
  EXPECT_EQ(a.grad_d2h, b.grad_d2h) << p;
  EXPECT_EQ(a.grad_h2d, b.grad_h2d) << p;
  EXPECT_EQ(a.act_d2h, b.act_d2h) << p;
  EXPECT_EQ(a.act_h2d, b.act_h2d) << p;
  EXPECT_EQ(a.nvme_write, b.nvme_write) << p;
  EXPECT_EQ(a.nvme_read, b.nvme_read) << p;
  EXPECT_EQ(a.layer_forwards, b.layer_forwards) << p;
  EXPECT_EQ(a.layer_backwards, b.layer_backwards) << p;
  EXPECT_EQ(a.internals_forwards, b.internals_forwards) << p;
  EXPECT_EQ(a.kept_layers, b.kept_layers) << p;
}

void check_policies_on_gpu(const model::LoadedModel& m, const std::vector<std::string>& policies,
                           const RunSpec& spec = {}) {  // 3 steps x accum 2
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult base = run_stream(m, spec, data, "device", 2, *be);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(spec.steps));
  bool clipped = false;
  for (const StepOutcome& o : base.outcomes) clipped |= o.applied && o.clip < 1.0;
  EXPECT_TRUE(clipped) << "the test should exercise clipping";
  for (const std::string& p : policies) {
    const RunResult g = run_stream(m, spec, data, p, 2, *be);
    ASSERT_EQ(g.losses.size(), base.losses.size()) << p;
    // bf16 streaming weights with bf16 GEMMs: the layer GEMMs read the slots' bf16 twins in place
    // (bf16 weight views, unless FERRY_BF16_WEIGHT_VIEWS=0); a silent fallback fails here.
    const bool bf16_weights = spec.mode.master != MasterWeights::kF32 || spec.bf16_compute;
    const bool views = bf16_weights && spec.bf16_weight_views &&
                       spec.gemm_precision == model::GemmPrecision::kBf16;
    EXPECT_EQ(g.bf16_weight_views, views) << p;
    EXPECT_EQ(base.bf16_weight_views, views) << p;
    if (views) {
      EXPECT_EQ(g.gemm_weight_converts, 0u) << p;
      EXPECT_EQ(base.gemm_weight_converts, 0u) << p;
    }
    for (std::size_t i = 0; i < base.losses.size(); ++i) {
      EXPECT_EQ(g.losses[i], base.losses[i]) << p << " step " << i;
      EXPECT_EQ(g.outcomes[i].grad_norm, base.outcomes[i].grad_norm) << p << " step " << i;
    }
    expect_same_state(*base.state, *g.state, p + " (cuda) vs device (cuda)");
    EXPECT_LE(g.peak, g.planned) << p;
    const RunResult c = run_stream(m, spec, data, p);  // the CPU executor, same policy and GEMMs
    expect_transfers_equal(g.stats, c.stats, p);
    double window_exposed = 0.0;
    for (double w : g.stats.window_exposed_s) window_exposed += w;
    EXPECT_GE(g.stats.exposed_s, 0.0) << p;
    EXPECT_LE(window_exposed, g.stats.exposed_s + 1e-9) << p;
    std::cout << "[train_stream_gpu] " << p << ": losses " << g.losses[0] << " .. "
              << g.losses.back() << ", exposed " << g.stats.exposed_s * 1e3 << " ms (GPU events)"
              << ", weights in " << g.stats.weight_h2d << " B, grads out " << g.stats.grad_d2h
              << " B\n";
  }
}

TEST(TrainStreamGpu, DenseEveryPolicyBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_dense");
  auto m = dense_model(dir + "/model");
  const std::string nv = testing::temp_dir("stream_gpu_nvme");
  check_policies_on_gpu(*m, {"host", "nvme:" + nv, "every:2", "every:3:host", "mix:dhrn:" + nv});
}

// bf16 GEMMs (the trainer's default on a GPU): still every policy bit-identical to "device".
TEST(TrainStreamGpu, Bf16GemmsEveryPolicyBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_bf16");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  check_policies_on_gpu(*m, {"host", "every:2", "every:3:host"}, spec);
  auto moe = moe_model();
  check_policies_on_gpu(*moe, {"every:2"}, spec);
}

// Kept layer internals (+keep:LIST, #7): a kept layer's backward reads the workspace its forward
// filled (its bf16 attention copies and the down projection's bf16 operand recast from the kept
// f32 internals when other layers ran since) instead of re-running the forward; kept layers inside
// a recomputed span have the recompute rewrite them. Still bit-identical to "device" without
// keeps, f32 and bf16 GEMMs, dense and MoE; one re-forward less per kept layer and micro-batch
// (the pass counts equal the CPU executor's, checked in check_policies_on_gpu).
TEST(TrainStreamGpu, KeptLayersBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_keep");
  auto m = dense_model(dir + "/model");
  const std::string nv = testing::temp_dir("stream_gpu_keep_nvme");
  const std::vector<std::string> dense = {"device+keep:top:2", "every:2+keep:0-1", "host+keep:1,3",
                                          "every:3:host+keep:0-3", "mix:dhrn:" + nv + "+keep:1-2"};
  check_policies_on_gpu(*m, dense);
  RunSpec bf16;
  bf16.gemm_precision = model::GemmPrecision::kBf16;
  check_policies_on_gpu(*m, dense, bf16);
  auto moe = moe_model();
  check_policies_on_gpu(*moe, {"device+keep:top:3", "every:2+keep:0,2"}, bf16);
  // The 7B A/B's configuration (#7 review): bf16 weight views (Kahan bf16 master, 8-bit states),
  // bf16 gradients (rounded on the compute stream, widened on the refill stream, which a kept
  // layer's backward now waits for with no re-forward in between), accumulation 2.
  RunSpec ab = bf16;
  ab.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  ab.bf16_grads = true;
  check_policies_on_gpu(*m, {"host+keep:top:2", "every:2+keep:0-1"}, ab);
  // ... with the device optimizer tail on layers 0-1 (a slow CPU worker, so the device takes
  // both and the bytes equal the CPU executor's).
  ab.device_update_layers = 2;
  ab.cpu_update_hook = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  check_policies_on_gpu(*m, {"host+keep:0,3", "every:2+keep:1-2"}, ab);
}

// bf16 masters: bf16 weights on the link (half the bytes), landed in a staging buffer and widened
// by the convert kernel on the h2d stream. Still every policy bit-identical to "device", and the
// bytes moved equal the CPU executor's (which widens in place).
TEST(TrainStreamGpu, Bf16MastersEveryPolicyBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_bf16_master");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode.master = MasterWeights::kBf16Kahan;
  const std::string nv = testing::temp_dir("stream_gpu_bf16_master_nvme");
  check_policies_on_gpu(*m, {"host", "every:2", "mix:dhrn:" + nv}, spec);
  auto moe = moe_model();
  spec.mode = {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
  check_policies_on_gpu(*moe, {"every:2", "host"}, spec);
  // An fp32 master computing with its bf16 rounding (--weights-dtype bf16, the GPU default).
  spec.mode = {};
  spec.bf16_compute = true;
  check_policies_on_gpu(*m, {"host", "every:2"}, spec);
}

// bf16 gradients: rounded on the device (convert kernels on the compute stream), half the D2H,
// widened back on the refill stream for accumulation. Every policy bit-identical to "device",
// the bytes moved equal the CPU executor's.
TEST(TrainStreamGpu, Bf16GradientsEveryPolicyBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_bf16_grads");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.bf16_grads = true;
  spec.bf16_compute = true;
  const std::string nv = testing::temp_dir("stream_gpu_bf16_grads_nvme");
  check_policies_on_gpu(*m, {"host", "every:2", "mix:dhrn:" + nv}, spec);
  spec.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  auto moe = moe_model();
  check_policies_on_gpu(*moe, {"every:2", "host"}, spec);
}

TEST(TrainStreamGpu, MoeEveryPolicyBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto m = moe_model();
  ASSERT_GT(m->geometry.experts, 0);
  const std::string nv = testing::temp_dir("stream_gpu_moe_nvme");
  check_policies_on_gpu(*m, {"host", "every:2", "mix:nrh:" + nv});
}

// --device-update-layers K (device_optimizer_tail.h): layers 0..K-1 updated by the CUDA
// hybrid AdamW kernel in HBM, the rest by the CPU worker. The CUDA kernel is the CPU kernel's bits,
// so every policy with K = 1, 2 equals the K = 0 run on the GPU bit for bit (losses, weights,
// states), and the tail moved the bytes and units the CPU executor's tail moves (the CPU worker
// slowed so that the device takes all K: the meeting point is timing's otherwise) — with one
// staging slot and with two (unit i+1's H2D on the tail's h2d stream beside unit i's kernels and
// D2H, ordered by events). K = all (two slots): bit-identical whatever split the timing gives, and
// each unit's GPU-timed span holds its phases.
TEST(TrainStreamGpu, DeviceUpdatedLayersBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::string dir = testing::temp_dir("stream_gpu_tail");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  const std::string nv = testing::temp_dir("stream_gpu_tail_nvme");
  struct Case {
    const model::LoadedModel* m;
    OptimMode mode;
    bool bf16_grads, bf16_compute;
    std::vector<std::string> policies;
  };
  const OptimMode kahan8{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  const OptimMode sr8{.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
  const OptimMode f32x8{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit};
  const std::vector<Case> cases = {
      {dense.get(), kahan8, true, false, {"device", "host", "every:2", "mix:dhrn:" + nv}},
      {dense.get(), sr8, false, false, {"device", "every:2"}},
      {dense.get(), f32x8, false, true, {"host", "every:2"}},
      {moe.get(), kahan8, true, false, {"every:2", "host"}},
      {moe.get(), sr8, false, false, {"device"}}};
  for (const Case& c : cases) {
    RunSpec spec;
    spec.gemm_precision = model::GemmPrecision::kBf16;
    spec.mode = c.mode;
    spec.bf16_grads = c.bf16_grads;
    spec.bf16_compute = c.bf16_compute;
    SCOPED_TRACE(describe(c.mode) + (c.bf16_grads ? " bf16 grads" : ""));
    const std::vector<Batch> data = make_batches(spec.steps * spec.accum, c.m->geometry.vocab, 5);
    const RunResult base = run_stream(*c.m, spec, data, "device", 2, *be);
    ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(spec.steps));
    std::uint64_t applied = 0;
    for (const StepOutcome& o : base.outcomes) applied += o.applied ? 1 : 0;
    struct TailCase {
      int K, slots;
      bool prestage;
      HeadUpdate head;
    };
    for (const TailCase& tc :
         {TailCase{1, 1, true, HeadUpdate::kEarly}, TailCase{2, 1, true, HeadUpdate::kEarly},
          TailCase{2, 2, true, HeadUpdate::kEarly}, TailCase{2, 2, false, HeadUpdate::kLate},
          TailCase{2, 3, true, HeadUpdate::kLate},
          TailCase{kDeviceUpdateAllLayers, 2, true, HeadUpdate::kEarly}}) {
      const int K = tc.K, slots = tc.slots;
      spec.device_update_layers = K;
      spec.device_update_slots = slots;
      spec.device_update_prestage = tc.prestage;
      spec.head_update = tc.head;
      const bool all = K == kDeviceUpdateAllLayers;
      // The device and the CPU worker meet where timing says; a slow CPU worker (a delay before
      // each of its units) makes the device take all K, so the counts below are exact (K = all:
      // the split is timing's, checked for consistency only).
      spec.cpu_update_hook = [](int) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      };
      for (const std::string& p : c.policies) {
        const std::string what = p + " K=" + (all ? std::string("all") : std::to_string(K)) +
                                 " slots=" + std::to_string(slots) +
                                 (tc.prestage ? " prestage" : " no prestage") +
                                 (tc.head == HeadUpdate::kEarly ? " head early" : " head late");
        const RunResult g = run_stream(*c.m, spec, data, p, 2, *be);
        ASSERT_EQ(g.losses.size(), base.losses.size()) << what;
        for (std::size_t i = 0; i < base.losses.size(); ++i) {
          EXPECT_EQ(g.losses[i], base.losses[i]) << what << " step " << i;
        }
        expect_same_state(*base.state, *g.state, what + " (cuda) vs K=0 device (cuda)");
        EXPECT_EQ(g.tail.slots, slots) << what;
        EXPECT_LE(g.peak, g.planned) << what;
        const std::uint64_t L = static_cast<std::uint64_t>(c.m->geometry.layers);
        EXPECT_EQ(g.tail.units_updated + g.tail.cpu_units, applied * L) << what;
        EXPECT_GT(g.tail.units_updated, 0u) << what;
        EXPECT_GT(g.tail.unit_h2d_s, 0.0) << what;
        EXPECT_GT(g.tail.unit_d2h_s, 0.0) << what;
        EXPECT_GE(g.tail.unit_s * (1 + 1e-6), g.tail.unit_h2d_s) << what;
        // The globals crossed once per step in total (embedding + head, two copies).
        EXPECT_EQ(g.stats.globals_h2d, base.stats.globals_h2d) << what;
        // Pre-staging: one unit per slot (at most K) at every step's last micro-batch.
        const std::uint64_t staged =
            tc.prestage
                ? static_cast<std::uint64_t>(std::min(slots, all ? c.m->geometry.layers : K))
                : 0;
        EXPECT_EQ(g.tail.prestaged_units, static_cast<std::uint64_t>(spec.steps) * staged) << what;
        EXPECT_LE(g.tail.prestage_hits, g.tail.units_updated) << what;
        if (all) continue;
        EXPECT_EQ(g.tail.units_updated, applied * static_cast<std::uint64_t>(K)) << what;
        EXPECT_EQ(g.tail.prestage_hits, applied * staged) << what;
        const RunResult cpu = run_stream(*c.m, spec, data, p);
        EXPECT_EQ(g.tail.h2d_bytes, cpu.tail.h2d_bytes) << what;
        EXPECT_EQ(g.tail.d2h_bytes, cpu.tail.d2h_bytes) << what;
        EXPECT_EQ(g.tail.prestaged_bytes, cpu.tail.prestaged_bytes) << what;
        std::cout << "[train_stream_gpu] tail " << what << ": " << g.tail.units_updated
                  << " units on the GPU, " << g.tail.h2d_bytes << " B up ("
                  << g.tail.prestaged_bytes << " B pre-staged, " << g.tail.prestage_hits
                  << " hits), " << g.tail.d2h_bytes << " B down\n";
      }
    }
  }
}

// GPU-resident layers (--resident-layers K, resident_layers.h) on the GPU: layers 0..K-1's
// weights, master, states and gradients in GPU memory for the whole run, updated there in place
// by the tail's kernels on the compute stream. K = 1, 2, L - 1 and all give the K = 0 GPU run's
// losses, gradient norms, weights and states bitwise (bf16 GEMMs: with bf16 streaming weights the
// resident GEMM weights are read as bf16 views of their resident bf16 copy), under host and
// every:2, dense and MoE, f32 and 8-bit states, f32 and bf16 gradients, and beside the tail; the
// weight H2D drops by exactly their streamed bytes, their gradients never cross, the plan grows by
// exactly ResidentLayers::bytes. The CPU twin: tests/unit/train/stream_resident_test.cpp.
// Written and compiled; not yet run on a GPU.
TEST(TrainStreamGpu, ResidentLayersBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::string dir = testing::temp_dir("stream_gpu_resident");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  struct Case {
    const model::LoadedModel* m;
    OptimMode mode;
    bool bf16_grads, bf16_compute;
    int tail;  // device_update_layers beside the resident layers
  };
  const OptimMode kahan8{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  const OptimMode kahan32{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::kF32};
  const OptimMode f32x8{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit};
  const std::vector<Case> cases = {{dense.get(), kahan8, true, false, 0},
                                   {dense.get(), kahan32, false, false, 0},
                                   {dense.get(), f32x8, false, true, 0},
                                   {dense.get(), kahan8, false, false, kDeviceUpdateAllLayers},
                                   {moe.get(), kahan8, true, false, 0}};
  for (const Case& c : cases) {
    const int L = c.m->geometry.layers;
    RunSpec spec;
    spec.gemm_precision = model::GemmPrecision::kBf16;
    spec.mode = c.mode;
    spec.bf16_grads = c.bf16_grads;
    spec.bf16_compute = c.bf16_compute;
    spec.device_update_layers = c.tail;
    SCOPED_TRACE(describe(c.mode) + (c.bf16_grads ? " bf16 grads" : "") +
                 (c.tail != 0 ? " tail all" : ""));
    const std::vector<Batch> data = make_batches(spec.steps * spec.accum, c.m->geometry.vocab, 5);
    auto state = make_state(*c.m, spec);
    auto arena = HostArena::create(*state);
    ASSERT_TRUE(arena.ok()) << arena.status().to_string();
    for (const std::string& p : {std::string("host"), std::string("every:2")}) {
      auto pol = parse_policy(p, L);
      ASSERT_TRUE(pol.ok());
      std::vector<std::uint64_t> streams(static_cast<std::size_t>(L), 0);
      for (int l : weight_schedule(*pol)) ++streams[static_cast<std::size_t>(l)];
      spec.resident_layers = 0;
      const RunResult base = run_stream(*c.m, spec, data, p, 2, *be);
      ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(spec.steps));
      std::uint64_t applied = 0;
      for (const StepOutcome& o : base.outcomes) applied += o.applied ? 1 : 0;
      for (int k_in : {1, 2, L - 1, kResidentAllLayers}) {
        const int K = k_in == kResidentAllLayers ? L : k_in;
        const std::string what = p + " K=" + std::to_string(K);
        spec.resident_layers = k_in;
        const RunResult g = run_stream(*c.m, spec, data, p, 2, *be);
        ASSERT_EQ(g.losses.size(), base.losses.size()) << what;
        for (std::size_t i = 0; i < base.losses.size(); ++i) {
          EXPECT_EQ(g.losses[i], base.losses[i]) << what << " step " << i;
          EXPECT_EQ(g.outcomes[i].grad_norm, base.outcomes[i].grad_norm) << what << " step " << i;
        }
        expect_same_state(*base.state, *g.state, what + " (cuda) vs K=0 (cuda)");
        std::uint64_t w = 0, gb = 0;
        for (int l = 0; l < K; ++l) {
          w += streams[static_cast<std::size_t>(l)] * (*arena)->unit_weight_bytes(l);
          gb += static_cast<std::uint64_t>((*arena)->unit_elements(l)) * (*arena)->grad_size();
        }
        const auto micro = static_cast<std::uint64_t>(spec.steps * spec.accum);
        EXPECT_EQ(base.stats.weight_h2d - g.stats.weight_h2d, micro * w) << what;
        EXPECT_EQ(base.stats.grad_d2h - g.stats.grad_d2h, micro * gb) << what;
        EXPECT_EQ(g.resident.layers, K) << what;
        EXPECT_EQ(g.resident.updates, applied * static_cast<std::uint64_t>(K)) << what;
        EXPECT_EQ(g.resident_bytes, ResidentLayers::bytes(**arena, K, g.bf16_weight_views)) << what;
        // (Beside the tail the plan also holds the tail's staging for layers K.., none at K = L.)
        if (c.tail == 0) {
          EXPECT_EQ(g.planned - base.planned, g.resident_bytes) << what;
        }
        EXPECT_LE(g.peak, g.planned) << what;
        if (c.tail != 0 && !g.tail.unit_updates.empty()) {
          for (int u = 0; u < K; ++u) EXPECT_EQ(g.tail.unit_updates[u], 0u) << what << " " << u;
        }
      }
    }
  }
}

// The globals split on the GPU: the head's weights land on their own stream (bf16 weights through
// the embedding's gradient region as staging) while the forward runs; both head orders, the tail
// on and off, a slow head update (the forward runs its layers, then waits in the loss window),
// bitwise against the default run; the globals' bytes unchanged.
TEST(TrainStreamGpu, GlobalsSplitBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::string dir = testing::temp_dir("stream_gpu_globals");
  auto dense = dense_model(dir + "/model");  // tied embeddings
  auto moe = moe_model();                    // untied lm_head
  const OptimMode kahan8{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  const OptimMode f32x8{.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit};
  struct Case {
    const model::LoadedModel* m;
    OptimMode mode;
    bool bf16_compute;
  };
  for (const Case& c : {Case{dense.get(), kahan8, false}, Case{moe.get(), kahan8, false},
                        Case{moe.get(), f32x8, true}, Case{moe.get(), OptimMode{}, false}}) {
    RunSpec spec;
    spec.gemm_precision = model::GemmPrecision::kBf16;
    spec.mode = c.mode;
    spec.bf16_compute = c.bf16_compute;
    const bool tail_ok = c.mode.states == OptimizerStates::k8Bit;
    SCOPED_TRACE(describe(c.mode) + (c.m == moe.get() ? " moe" : " dense"));
    const std::vector<Batch> data = make_batches(spec.steps * spec.accum, c.m->geometry.vocab, 5);
    const RunResult base = run_stream(*c.m, spec, data, "every:2", 2, *be);
    const int L = c.m->geometry.layers;
    const int head = L + 1;  // LayerOptimizer::head_unit()
    for (const HeadUpdate h : {HeadUpdate::kEarly, HeadUpdate::kLate}) {
      for (const int K : {0, kDeviceUpdateAllLayers}) {
        if (K != 0 && !tail_ok) continue;
        for (const bool slow_head : {false, true}) {
          RunSpec r = spec;
          r.head_update = h;
          r.device_update_layers = K;
          if (slow_head) {
            r.cpu_update_hook = [head](int u) {
              if (u == head) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            };
          }
          const std::string what = std::string(h == HeadUpdate::kEarly ? "early" : "late") +
                                   " K=" + std::to_string(K) + (slow_head ? " slow head" : "");
          const RunResult g = run_stream(*c.m, r, data, "every:2", 2, *be);
          ASSERT_EQ(g.losses.size(), base.losses.size()) << what;
          for (std::size_t i = 0; i < base.losses.size(); ++i) {
            EXPECT_EQ(g.losses[i], base.losses[i]) << what << " step " << i;
          }
          expect_same_state(*base.state, *g.state, what + " (cuda) vs default (cuda)");
          EXPECT_EQ(g.stats.globals_h2d, base.stats.globals_h2d) << what;
          if (slow_head && (h == HeadUpdate::kLate || K != 0)) {
            // The forward's layers did not wait for the head; the loss window did (GPU idle time).
            EXPECT_GT(g.stats.window_exposed_s[static_cast<std::size_t>(L)], 0.1) << what;
          }
          std::cout << "[train_stream_gpu] globals " << what << ": loss window exposed "
                    << g.stats.window_exposed_s[static_cast<std::size_t>(L)] * 1e3 << " ms\n";
        }
      }
    }
  }
}

// One step's loss and gradients: the stream executor on `be`, accumulation 1, no update yet.
struct OneStep {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // [unit] the host arena's gradient after the step
};

// batches.size() micro-batches accumulated into one step's gradient.
OneStep one_step(const model::LoadedModel& m, const std::vector<Batch>& batches,
                 const std::string& policy, kernels::Backend& be,
                 model::GemmPrecision precision = model::GemmPrecision::kF32, OptimMode mode = {}) {
  OneStep out;
  auto state = make_state(m, {.mode = mode});
  auto pol = parse_policy(policy, m.geometry.layers);
  EXPECT_TRUE(pol.ok());
  auto ex = StreamExecutor::create(*state, kBatch, kSeq,
                                   {.policy = *pol, .gemm_precision = precision}, be);
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  if (!ex.ok()) return out;
  (*ex)->begin_step(static_cast<int>(batches.size()));
  for (const Batch& batch : batches) {
    auto r = (*ex)->micro_batch(batch.view());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return out;
    out.loss += r->mean_loss();
  }
  const HostArena& a = (*ex)->arena();
  for (int u = 0; u < a.num_units(); ++u) {
    const float* g = a.grads(u);
    out.grads.emplace_back(g, g + a.unit_elements(u));
  }
  return out;
}

using ferry::testing::rel_norm_diff;

// The CPU f32 run is the reference; the naive twin uses the GPU's precision (bf16 attention, and
// bf16-rounded GEMM operands when `precision` is kBf16).
// mode: a bf16 master makes every run (the f32 reference included) compute with the same
// bf16-valued weights, streamed as bf16.
// accum > 1: the gradients accumulated over that many micro-batches (on the GPU, micro-batches
// after the first refill the device slot from the host's running sum on a stream of their own).
void check_against_cpu(const model::LoadedModel& m, const std::string& policy,
                       model::GemmPrecision precision = model::GemmPrecision::kF32,
                       OptimMode mode = {}, int accum = 1) {
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::vector<Batch> batch = make_batches(accum, m.geometry.vocab, 11);
  const OneStep cpu =
      one_step(m, batch, policy, kernels::cpu_backend(), model::GemmPrecision::kF32, mode);
  ferry::testing::Bf16AttentionCpu naive_be;
  const OneStep naive = one_step(m, batch, policy, naive_be, precision, mode);
  const OneStep gpu = one_step(m, batch, policy, *be, precision, mode);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  ASSERT_EQ(naive.grads.size(), cpu.grads.size());
  const double eloss = std::fabs(gpu.loss - cpu.loss) / std::fabs(cpu.loss);
  const double eloss_n = std::fabs(naive.loss - cpu.loss) / std::fabs(cpu.loss);
  EXPECT_LE(eloss, 2 * eloss_n + 1e-4) << policy << " loss";
  double worst = 0.0, worst_bound = 0.0;
  for (std::size_t u = 0; u < cpu.grads.size(); ++u) {
    const double e = rel_norm_diff(gpu.grads[u], cpu.grads[u]);
    const double en = rel_norm_diff(naive.grads[u], cpu.grads[u]);
    EXPECT_LE(e, 2 * en + 1e-3) << policy << " unit " << u << " gradient (naive " << en << ")";
    if (e / (2 * en + 1e-3) > worst / std::max(worst_bound, 1e-30)) {
      worst = e;
      worst_bound = 2 * en + 1e-3;
    }
  }
  std::cout << "[train_stream_gpu] " << policy << " " << model::to_string(precision)
            << " vs CPU: loss " << eloss << " (naive " << eloss_n << "), tightest unit gradient "
            << worst << " vs bound " << worst_bound << "\n";
}

TEST(TrainStreamGpu, DenseGradientsMatchCpuWithinBf16AttentionTolerance) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_vs_cpu");
  auto m = dense_model(dir + "/model");
  check_against_cpu(*m, "every:2:host");
}

TEST(TrainStreamGpu, MoeGradientsMatchCpuWithinBf16AttentionTolerance) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto m = moe_model();
  check_against_cpu(*m, "every:2");
}

TEST(TrainStreamGpu, Bf16GemmGradientsMatchCpuWithinTheRule) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_bf16_vs_cpu");
  auto m = dense_model(dir + "/model");
  check_against_cpu(*m, "every:2:host", model::GemmPrecision::kBf16);
  auto moe = moe_model();
  check_against_cpu(*moe, "every:2", model::GemmPrecision::kBf16);
}

TEST(TrainStreamGpu, AccumulatedGradientsMatchCpuWithinTheRule) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_accum_vs_cpu");
  auto m = dense_model(dir + "/model");
  check_against_cpu(*m, "every:2:host", model::GemmPrecision::kBf16, {}, 3);
}

TEST(TrainStreamGpu, Bf16MasterGradientsMatchCpuWithinTheRule) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_bf16_master_vs_cpu");
  auto m = dense_model(dir + "/model");
  check_against_cpu(*m, "every:2:host", model::GemmPrecision::kBf16,
                    {.master = MasterWeights::kBf16Kahan});
}

// bf16 weight views (bf16_widen.h): with bf16 streaming weights and bf16 GEMMs the layer GEMMs
// read the streamed bf16 bytes in place instead of converting the widened f32 slot back to bf16
// before every GEMM. bf16 -> f32 -> bf16 is the identity and the GEMMs see 16-byte aligned bf16
// weights either way (the cuBLASLt choice), so the same steps with the switch on and off
// (StreamOptions::bf16_weight_views, FERRY_BF16_WEIGHT_VIEWS=0) give the same losses, gradient
// norms, gradients (every unit, after each step's last micro-batch), weights and states bit for
// bit, and move the same bytes. The views path really ran (no layer GEMM converted its weight;
// the converting path did), its plan is smaller (twins instead of f32 slots, no stage16) and
// exact: one byte short is refused before training.
struct ViewsRun {
  RunResult r;
  std::vector<std::vector<std::uint8_t>> grads;  // [step]: every unit's gradient bytes
};

ViewsRun run_views(const model::LoadedModel& m, RunSpec spec, const std::vector<Batch>& data,
                   const std::string& policy, bool views, kernels::Backend& be) {
  ViewsRun out;
  spec.bf16_weight_views = views;
  out.r.state = make_state(m, spec);
  auto pol = parse_policy(policy, m.geometry.layers);
  EXPECT_TRUE(pol.ok()) << pol.status().to_string();
  if (!pol.ok()) return out;
  const StreamOptions so{.policy = *pol,
                         .gemm_precision = spec.gemm_precision,
                         .device_update_layers = spec.device_update_layers,
                         .bf16_weight_views = views};
  auto ex = StreamExecutor::create(*out.r.state, kBatch, kSeq, so, be);
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  if (!ex.ok()) return out;
  std::int64_t opt_step = 0;
  std::size_t next = 0;
  for (int step = 0; step < spec.steps; ++step) {
    (*ex)->begin_step(spec.accum);
    double loss = 0.0;
    for (int a = 0; a < spec.accum; ++a) {
      auto f = (*ex)->micro_batch(data[next++].view());
      EXPECT_TRUE(f.ok()) << f.status().to_string();
      if (!f.ok()) return out;
      loss += f->mean_loss() / spec.accum;
    }
    // The step's gradients are in the host arena now (drained, globals copied back).
    const HostArena& arena = (*ex)->arena();
    std::vector<std::uint8_t> g;
    for (int u = 0; u < arena.num_units(); ++u) {
      const auto* p = arena.bf16_grads() ? reinterpret_cast<const std::uint8_t*>(arena.grads16(u))
                                         : reinterpret_cast<const std::uint8_t*>(arena.grads(u));
      const std::size_t bytes =
          static_cast<std::size_t>(arena.unit_elements(u)) * (arena.bf16_grads() ? 2 : 4);
      g.insert(g.end(), p, p + bytes);
    }
    out.grads.push_back(std::move(g));
    auto o = (*ex)->finish_step(adamw(), lr_of(step), opt_step + 1);
    EXPECT_TRUE(o.ok());
    if (!o.ok()) return out;
    if (o->applied) ++opt_step;
    out.r.losses.push_back(loss);
    out.r.outcomes.push_back(*o);
  }
  EXPECT_TRUE((*ex)->store_to(*out.r.state).ok());
  out.r.stats = (*ex)->stats();
  out.r.peak = (*ex)->device_peak_bytes();
  out.r.planned = (*ex)->device_planned_bytes();
  out.r.bf16_weight_views = (*ex)->bf16_weight_views();
  out.r.gemm_weight_converts = (*ex)->gemm_weight_converts();
  return out;
}

void check_views_on_off(const model::LoadedModel& m, const RunSpec& spec,
                        const std::vector<std::string>& policies, const std::string& what) {
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  for (const std::string& p : policies) {
    const std::string w = what + " " + p;
    const ViewsRun on = run_views(m, spec, data, p, true, *be);
    const ViewsRun off = run_views(m, spec, data, p, false, *be);
    ASSERT_EQ(on.r.losses.size(), static_cast<std::size_t>(spec.steps)) << w;
    ASSERT_EQ(off.r.losses.size(), static_cast<std::size_t>(spec.steps)) << w;
    EXPECT_TRUE(on.r.bf16_weight_views) << w;
    EXPECT_FALSE(off.r.bf16_weight_views) << w;
    EXPECT_EQ(on.r.gemm_weight_converts, 0u) << w;
    EXPECT_GT(off.r.gemm_weight_converts, 0u) << w;
    for (int i = 0; i < spec.steps; ++i) {
      const auto k = static_cast<std::size_t>(i);
      EXPECT_EQ(on.r.losses[k], off.r.losses[k]) << w << " step " << i;
      EXPECT_EQ(on.r.outcomes[k].grad_norm, off.r.outcomes[k].grad_norm) << w << " step " << i;
      EXPECT_EQ(on.r.outcomes[k].clip, off.r.outcomes[k].clip) << w << " step " << i;
      ASSERT_EQ(on.grads[k].size(), off.grads[k].size()) << w;
      EXPECT_TRUE(on.grads[k] == off.grads[k]) << w << ": gradients differ at step " << i;
    }
    expect_same_state(*on.r.state, *off.r.state, w + ": views on vs off");
    expect_transfers_equal(on.r.stats, off.r.stats, w);
    EXPECT_LE(on.r.peak, on.r.planned) << w;
    EXPECT_LT(on.r.planned, off.r.planned) << w;
    std::cout << "[train_stream_gpu] bf16 weight views " << w << ": planned " << on.r.planned
              << " B (converting path " << off.r.planned << " B), weight converts 0 (converting "
              << off.r.gemm_weight_converts << ")\n";
  }
}

TEST(TrainStreamGpu, Bf16WeightViewsBitIdenticalToTheConvertingPath) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_views");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  const std::string nv = testing::temp_dir("stream_gpu_views_nvme");
  check_views_on_off(*m, spec, {"device", "host", "every:2", "mix:dhrn:" + nv}, "kahan+8bit");
  // The 7B A/B's configuration on the fixture: bf16 gradients, every layer's update on the device.
  spec.bf16_grads = true;
  spec.device_update_layers = kDeviceUpdateAllLayers;
  check_views_on_off(*m, spec, {"host", "every:2"}, "kahan+8bit bf16-grads tail");
  // An fp32 master streaming its bf16 rounding (the GPU default), and MoE (router stays f32).
  spec = {};
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.bf16_compute = true;
  check_views_on_off(*m, spec, {"every:2"}, "fp32 master bf16 weights");
  auto moe = moe_model();
  spec = {};
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
  check_views_on_off(*moe, spec, {"every:2", "host"}, "moe sr+8bit");
}

// ModelCompute's GEMM input reuse (FERRY_GEMM_INPUT_REUSE; read by every ModelCompute::create(),
// so the environment is set around each run) under the stream executor on the GPU with bf16
// GEMMs and bf16 weight views (the 7B configuration's path): losses, gradient norms, clip factors,
// the final state and the bytes moved are the same bits with the reuse on and off, and fewer
// activation converts run with it on. CPU twin: tests/unit/train/gemm_input_reuse_test.cpp.
RunResult run_gemm_input_reuse(bool reuse, const model::LoadedModel& m, const RunSpec& spec,
                               const std::vector<Batch>& data, const std::string& policy,
                               kernels::Backend& be) {
  const char* old = std::getenv("FERRY_GEMM_INPUT_REUSE");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("FERRY_GEMM_INPUT_REUSE", reuse ? "1" : "0", 1);
  RunResult r = run_stream(m, spec, data, policy, 2, be);
  if (old != nullptr) {
    ::setenv("FERRY_GEMM_INPUT_REUSE", saved.c_str(), 1);
  } else {
    ::unsetenv("FERRY_GEMM_INPUT_REUSE");
  }
  EXPECT_EQ(r.gemm_input_reuse, reuse);
  return r;
}

void check_gemm_input_reuse(const model::LoadedModel& m, const RunSpec& spec,
                            const std::vector<std::string>& policies, const std::string& what) {
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 9);
  for (const std::string& p : policies) {
    const std::string w = what + " " + p;
    const RunResult off = run_gemm_input_reuse(false, m, spec, data, p, *be);
    const RunResult on = run_gemm_input_reuse(true, m, spec, data, p, *be);
    ASSERT_EQ(on.losses.size(), static_cast<std::size_t>(spec.steps)) << w;
    ASSERT_EQ(off.losses.size(), static_cast<std::size_t>(spec.steps)) << w;
    for (int i = 0; i < spec.steps; ++i) {
      const auto k = static_cast<std::size_t>(i);
      EXPECT_EQ(on.losses[k], off.losses[k]) << w << " step " << i;
      EXPECT_EQ(on.outcomes[k].grad_norm, off.outcomes[k].grad_norm) << w << " step " << i;
      EXPECT_EQ(on.outcomes[k].clip, off.outcomes[k].clip) << w << " step " << i;
    }
    expect_same_state(*on.state, *off.state, w + ": gemm input reuse on vs off");
    expect_transfers_equal(on.stats, off.stats, w);
    EXPECT_EQ(on.bf16_weight_views, off.bf16_weight_views) << w;
    EXPECT_GT(off.gemm_input_converts, 0u) << w;
    EXPECT_LT(on.gemm_input_converts, off.gemm_input_converts) << w;
    std::cout << "[train_stream_gpu] gemm input reuse " << w << ": activation converts "
              << on.gemm_input_converts << " (off " << off.gemm_input_converts << ")\n";
  }
}

TEST(TrainStreamGpu, GemmInputReuseBitIdenticalOnGpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir("stream_gpu_gemm_input");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  check_gemm_input_reuse(*m, spec, {"device", "host", "every:2"}, "kahan+8bit");
  // The 7B A/B's configuration on the fixture: bf16 gradients, every layer's update on the device.
  spec.bf16_grads = true;
  spec.device_update_layers = kDeviceUpdateAllLayers;
  check_gemm_input_reuse(*m, spec, {"host"}, "kahan+8bit bf16-grads tail");
  auto moe = moe_model();
  spec = {};
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit};
  check_gemm_input_reuse(*moe, spec, {"every:2", "host"}, "moe sr+8bit");
  // Kept layers (#7 review): the SwiGLU recompute writes the down projection's bf16 operand with
  // the reuse on, a separate convert with it off; the same bits either way.
  spec.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  check_gemm_input_reuse(*m, spec, {"device+keep:top:2", "every:2+keep:0-1"}, "keep kahan+8bit");
}

TEST(TrainStreamGpu, Bf16WeightViewsBudgetIsExact) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::string dir = testing::temp_dir("stream_gpu_views_budget");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Kahan};
  auto state = make_state(*m, spec);
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  const StreamOptions so{
      .policy = *pol, .gemm_precision = model::GemmPrecision::kBf16, .bf16_weight_views = true};
  auto fits = StreamExecutor::create(*state, kBatch, kSeq, so, *be);
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  ASSERT_TRUE((*fits)->bf16_weight_views());
  const std::size_t planned = (*fits)->device_planned_bytes();
  // What `ferry plan` counts (model_sizes + plan_device, views asked for) is what it allocated.
  ModelSizes sizes = model_sizes((*fits)->arena());
  sizes.bf16_weight_views = true;
  const std::int64_t T = std::int64_t{kBatch} * kSeq;
  auto d =
      plan_device(m->geometry, sizes, *pol, so.prefetch + 1, T, *be, model::GemmPrecision::kBf16);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->bf16_weight_views);
  EXPECT_EQ(d->total_bytes(), planned);
  EXPECT_EQ(d->stage16_elements, 0);
  fits->reset();
  StreamOptions tight = so;
  tight.device_budget_bytes = planned - 1;
  auto refused = StreamExecutor::create(*state, kBatch, kSeq, tight, *be);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("largest batch that fits"), std::string::npos)
      << refused.status().to_string();
}

// The budget is enforced on GPU memory as on the emulated tier: one byte short of the plan is
// refused with the largest batch that fits, before anything is allocated. The plan counts the
// attention backward's workspace exactly as the executor's ModelCompute allocates it.
TEST(TrainStreamGpu, DeviceBudgetRefusesWhatDoesNotFit) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  kernels::Backend* be = cuda_or_null();
  ASSERT_NE(be, nullptr);
  const std::string dir = testing::temp_dir("stream_gpu_budget");
  auto m = dense_model(dir + "/model");
  auto state = make_state(*m, {});
  auto pol = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(pol.ok());
  auto fits = StreamExecutor::create(*state, kBatch, kSeq, {.policy = *pol}, *be);
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  const std::size_t planned = (*fits)->device_planned_bytes();
  // The plan's compute part is ModelCompute's bytes with the process's workspace choice. Without
  // the backward's scratch overlay the workspace adds its 8 T H D bytes (the dK/dV partials of
  // the grouped heads); with it (the default) it shares the overlay with the MLP's backward
  // buffers, which are larger in this model, so it may add nothing.
  const model::DecoderGeometry& geo = m->geometry;
  const std::int64_t T = std::int64_t{kBatch} * kSeq;
  auto compute_bytes = [&](model::AttnBwdWorkspace w) {
    return model::ModelCompute::planned_bytes(geo, T, *be, 1, model::GemmPrecision::kF32, w);
  };
  {
    const ferry::testing::ScopedEnv no_overlay("FERRY_SCRATCH_OVERLAY", "0");
    auto with = compute_bytes(model::AttnBwdWorkspace::kOn);
    auto without = compute_bytes(model::AttnBwdWorkspace::kOff);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_GE(*with - *without, static_cast<std::size_t>(8 * T * geo.heads * geo.head_dim));
  }
  auto with = compute_bytes(model::AttnBwdWorkspace::kOn);
  auto without = compute_bytes(model::AttnBwdWorkspace::kOff);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GE(*with, *without);
  auto d =
      plan_device(geo, model_sizes((*fits)->arena()), *pol, StreamOptions{}.prefetch + 1, T, *be);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->compute_bytes, model::attn_bwd_workspace_default() ? *with : *without);
  EXPECT_EQ(d->total_bytes(), planned);
  std::cout << "[train_stream_gpu] attention backward workspace "
            << (model::attn_bwd_workspace_default() ? "on" : "off (FERRY_ATTN_BWD_WORKSPACE=0)")
            << ": " << (*with - *without) << " B of the plan's " << planned << " B\n";
  fits->reset();
  auto refused = StreamExecutor::create(*state, kBatch, kSeq,
                                        {.policy = *pol, .device_budget_bytes = planned - 1}, *be);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("largest batch that fits"), std::string::npos)
      << refused.status().to_string();
}

}  // namespace
}  // namespace ferry::train::stream
