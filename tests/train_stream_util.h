// SPDX-License-Identifier: Apache-2.0
// Shared by the stream executor's tests on the CPU (tests/unit/train/stream_executor_test.cpp) and
// on the GPU (tests/gpu/train_stream_gpu_test.cpp): packed random micro-batches, the two test
// models (the dense builtin, the qwen3_moe fixture), a training run of the stream executor on a
// given backend, and the bitwise comparison of two training states.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "train/builtin_model.h"
#include "train/optim/param_selection.h"
#include "train/optimizer.h"
#include "train/rng.h"
#include "train/stream/activation_policy.h"
#include "train/stream/stream_executor.h"
#include "train/train_state.h"
#include "unit/train/test_util.h"

namespace ferry::train::stream {

inline constexpr std::int64_t kSeq = 24;  // tokens per sequence (max)
inline constexpr int kBatch = 3;          // sequences per micro-batch

struct Batch {
  std::vector<std::int32_t> ids, pos, cu, tg;
  model::PackedBatch view() const {
    auto v = [](const std::vector<std::int32_t>& x) {
      return ConstTensorView::contiguous(x.data(), DType::kI32, Device::kCpu,
                                         {static_cast<std::int64_t>(x.size())});
    };
    return {.ids = v(ids), .positions = v(pos), .cu_seqlens = v(cu), .targets = v(tg)};
  }
};

// Packed micro-batches of kBatch sequences of random length; about a third of the targets
// ignored (-100), like response-only SFT masks.
inline std::vector<Batch> make_batches(int count, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Batch> out(static_cast<std::size_t>(count));
  for (Batch& b : out) {
    b.cu.push_back(0);
    for (int s = 0; s < kBatch; ++s) {
      const int len = 4 + static_cast<int>(rng.next_u64() % (kSeq - 3));
      for (int t = 0; t < len; ++t) {
        b.ids.push_back(static_cast<std::int32_t>(rng.next_u64() % vocab));
        b.pos.push_back(t);
        b.tg.push_back(rng.next_u64() % 3 == 0 ? -100
                                               : static_cast<std::int32_t>(rng.next_u64() % vocab));
      }
      b.cu.push_back(static_cast<std::int32_t>(b.ids.size()));
    }
  }
  return out;
}

// The small dense model of these tests (4 layers, C = 32, GQA 2/1).
inline BuiltinModelSpec dense_spec() {
  return {.layers = 4,
          .hidden = 32,
          .heads = 2,
          .kv_heads = 1,
          .head_dim = 16,
          .intermediate = 48,
          .max_positions = 64,
          .init_std = 0.05};
}

inline std::unique_ptr<model::LoadedModel> dense_model(const std::string& dir) {
  const BuiltinModelSpec spec = dense_spec();
  EXPECT_TRUE(write_builtin_model(dir, spec, 7).ok());
  auto m = model::load_model_f32(dir);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(*m);
}

inline std::unique_ptr<model::LoadedModel> moe_model() {
  auto m = model::load_model_f32(std::string(FERRY_TEST_DATA_DIR) + "/models/qwen3_moe");
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(*m);
}

struct RunSpec {
  int steps = 3;
  int accum = 2;
  OptimMode mode;
  std::string q8_params;      // 8bit states: --8bit-params (empty = all)
  int optimizer_threads = 0;  // StreamOptions::optimizer_threads
  model::GemmPrecision gemm_precision = model::GemmPrecision::kF32;
  bool bf16_compute = false;     // TrainState::use_bf16_compute (fp32 master, bf16 weights)
  bool bf16_grads = false;       // TrainState::bf16_grads
  int device_update_layers = 0;  // StreamOptions::device_update_layers (-1: all)
  int device_update_slots = 2;   // StreamOptions::device_update_slots
  int resident_layers = 0;       // StreamOptions::resident_layers (-1: all, -2: auto)
  std::function<void(int)> cpu_update_hook;              // StreamOptions::cpu_update_hook
  std::function<Status(int)> device_update_hook;         // StreamOptions::device_update_hook
  HeadUpdate head_update = HeadUpdate::kEarly;           // StreamOptions::head_update
  bool device_update_prestage = true;                    // StreamOptions::device_update_prestage
  std::function<Status(int)> device_prestage_hook;       // StreamOptions::device_prestage_hook
  bool bf16_weight_views = bf16_weight_views_default();  // StreamOptions::bf16_weight_views
};

inline std::unique_ptr<TrainState> make_state(const model::LoadedModel& m, const RunSpec& r) {
  std::vector<bool> q8;
  if (r.mode.states == OptimizerStates::k8Bit) {
    std::vector<std::string> names;
    for (const auto& [name, t] : m.named) names.push_back(name);
    auto sel = select_8bit_params(names, r.q8_params);
    EXPECT_TRUE(sel.ok()) << sel.status().to_string();
    if (sel.ok()) q8 = *sel;
  }
  auto s = TrainState::from_loaded(m, r.mode, 99, q8);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (s.ok() && r.bf16_compute) {
    EXPECT_TRUE((*s)->use_bf16_compute().ok());
  }
  if (s.ok()) (*s)->bf16_grads = r.bf16_grads;
  return std::move(s).value();
}

inline AdamWConfig adamw() {
  AdamWConfig c;
  c.weight_decay = 0.1;
  c.max_grad_norm = 0.05;  // well below the gradient norms here: clipping is active
  return c;
}
inline double lr_of(int step) { return 2e-2 / (1.0 + step); }

struct RunResult {
  std::vector<double> losses;
  std::vector<StepOutcome> outcomes;
  std::unique_ptr<TrainState> state;
  TransferStats stats;
  DeviceTailStats tail;             // the device optimizer tail's counters
  ResidentStats resident;           // StreamExecutor::resident_stats()
  std::size_t resident_bytes = 0;   // StreamExecutor::device_resident_bytes()
  std::vector<double> unit_busy_s;  // StreamExecutor::optimizer_unit_busy_s()
  std::size_t peak = 0, planned = 0;
  std::int64_t tokens = 0;                       // summed over micro-batches
  bool bf16_weight_views = false;                // StreamExecutor::bf16_weight_views()
  std::uint64_t gemm_weight_converts = 0;        // StreamExecutor::gemm_weight_converts()
  std::uint64_t gemm_input_converts = 0;         // StreamExecutor::gemm_input_converts()
  std::uint64_t compute_internals_forwards = 0;  // StreamExecutor::compute_internals_forwards()
  bool gemm_input_reuse = false;                 // StreamExecutor::gemm_input_reuse()
};

// The in-memory reference: the same batches, kernels and AdamW as the streamed runs, on
// TrainState in host memory (bf16 gradients rounded after every micro-batch, as the trainer does).
inline RunResult run_reference(const model::LoadedModel& m, const RunSpec& r,
                               const std::vector<Batch>& data) {
  RunResult out;
  out.state = make_state(m, r);
  kernels::Backend& be = kernels::cpu_backend();
  auto mc =
      model::ModelCompute::create(m.geometry, kBatch * kSeq, be, -1, nullptr, r.gemm_precision);
  EXPECT_TRUE(mc.ok());
  std::int64_t opt_step = 0;
  std::size_t next = 0;
  for (int step = 0; step < r.steps; ++step) {
    out.state->grads->zero();
    double loss = 0.0;
    for (int a = 0; a < r.accum; ++a) {
      const model::PackedBatch b = data[next++].view();
      auto f = (*mc)->forward(out.state->params, b);
      EXPECT_TRUE(f.ok());
      EXPECT_TRUE((*mc)->backward(out.state->params, b, out.state->grads->grads).ok());
      out.state->round_grads_to_bf16();  // with bf16 gradients, as the trainer does
      loss += f->mean_loss() / r.accum;
    }
    auto o = optimizer_step(*out.state, adamw(), lr_of(step), opt_step + 1, r.accum, be);
    EXPECT_TRUE(o.ok());
    if (o->applied) ++opt_step;
    out.losses.push_back(loss);
    out.outcomes.push_back(*o);
  }
  return out;
}

inline RunResult run_stream(const model::LoadedModel& m, const RunSpec& r,
                            const std::vector<Batch>& data, const std::string& policy,
                            int prefetch = 2, kernels::Backend& backend = kernels::cpu_backend()) {
  RunResult out;
  out.state = make_state(m, r);
  auto pol = parse_policy(policy, m.geometry.layers);
  EXPECT_TRUE(pol.ok()) << pol.status().to_string();
  StreamOptions so{.policy = *pol,
                   .prefetch = prefetch,
                   .optimizer_threads = r.optimizer_threads,
                   .gemm_precision = r.gemm_precision,
                   .device_update_layers = r.device_update_layers,
                   .device_update_slots = r.device_update_slots,
                   .resident_layers = r.resident_layers,
                   .head_update = r.head_update,
                   .device_update_prestage = r.device_update_prestage,
                   .bf16_weight_views = r.bf16_weight_views,
                   .cpu_update_hook = r.cpu_update_hook,
                   .device_update_hook = r.device_update_hook,
                   .device_prestage_hook = r.device_prestage_hook};
  auto ex = StreamExecutor::create(*out.state, kBatch, kSeq, so, backend);
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  if (!ex.ok()) return out;
  std::int64_t opt_step = 0;
  std::size_t next = 0;
  for (int step = 0; step < r.steps; ++step) {
    (*ex)->begin_step(r.accum);
    double loss = 0.0;
    for (int a = 0; a < r.accum; ++a) {
      const model::PackedBatch b = data[next++].view();
      out.tokens += b.ids.numel();
      auto f = (*ex)->micro_batch(b);
      EXPECT_TRUE(f.ok()) << f.status().to_string();
      loss += f->mean_loss() / r.accum;
    }
    auto o = (*ex)->finish_step(adamw(), lr_of(step), opt_step + 1);
    EXPECT_TRUE(o.ok());
    if (o->applied) ++opt_step;
    out.losses.push_back(loss);
    out.outcomes.push_back(*o);
  }
  EXPECT_TRUE((*ex)->store_to(*out.state).ok());
  out.stats = (*ex)->stats();
  out.tail = (*ex)->device_tail_stats();
  out.resident = (*ex)->resident_stats();
  out.resident_bytes = (*ex)->device_resident_bytes();
  out.unit_busy_s = (*ex)->optimizer_unit_busy_s();
  out.peak = (*ex)->device_peak_bytes();
  out.planned = (*ex)->device_planned_bytes();
  out.bf16_weight_views = (*ex)->bf16_weight_views();
  out.gemm_weight_converts = (*ex)->gemm_weight_converts();
  out.gemm_input_converts = (*ex)->gemm_input_converts();
  out.compute_internals_forwards = (*ex)->compute_internals_forwards();
  out.gemm_input_reuse = (*ex)->gemm_input_reuse();
  return out;
}

inline void expect_same_state(const TrainState& a, const TrainState& b, const std::string& what) {
  ASSERT_EQ(a.num_params(), b.num_params());
  for (std::size_t i = 0; i < a.num_params(); ++i) {
    const TensorView& wa = a.master->named[i].second;
    const TensorView& wb = b.master->named[i].second;
    EXPECT_EQ(std::memcmp(wa.data, wb.data, wa.bytes()), 0)
        << what << ": weights of " << a.master->named[i].first << " differ";
    // bf16 masters: the weights themselves and the Kahan compensation (empty otherwise).
    EXPECT_EQ(a.optim.params[i].w16, b.optim.params[i].w16) << what;
    EXPECT_EQ(a.optim.params[i].comp16, b.optim.params[i].comp16) << what;
    if (a.m) {
      EXPECT_EQ(std::memcmp(a.m->named[i].second.data, b.m->named[i].second.data, wa.bytes()), 0)
          << what << ": m of " << a.master->named[i].first;
      EXPECT_EQ(std::memcmp(a.v->named[i].second.data, b.v->named[i].second.data, wa.bytes()), 0)
          << what << ": v of " << a.master->named[i].first;
    }
    // 8-bit states (empty for parameters with f32 states).
    EXPECT_EQ(a.optim.params[i].q8(), b.optim.params[i].q8()) << what;
    EXPECT_EQ(a.optim.params[i].m8, b.optim.params[i].m8) << what;
    EXPECT_EQ(a.optim.params[i].v8, b.optim.params[i].v8) << what;
    EXPECT_EQ(a.optim.params[i].m_absmax, b.optim.params[i].m_absmax) << what;
    EXPECT_EQ(a.optim.params[i].v_absmax, b.optim.params[i].v_absmax) << what;
  }
}

}  // namespace ferry::train::stream
