// SPDX-License-Identifier: Apache-2.0
// One whole decoder layer, forward then backward, through the code the trainer runs on a GPU:
// model::ModelCompute's per-layer API (layer_forward / layer_forward_internals / layer_backward,
// train/stream's StreamExecutor calls exactly these) on a Backend, here kernels::cuda_backend(0).
// Nothing in this file computes: it sets the layer up the way the executor does and times it.
//
// What is timed (per repetition, GPU events on the compute stream, mean of the repetitions after
// a warm-up that also lets cuBLASLt autotune every GEMM shape):
//   layer_forward(x_in -> x_out), then (after a second L2 flush, as other layers run in between
//   in the trainer) layer_forward_internals(x_in): the re-forward the stream executor runs right
//   before the backward of a layer whose internals it did not keep (no down projection, no
//   residual add), then layer_backward: d x_in and every weight gradient.
// Set-up as in StreamExecutor (stream_executor.cpp): a ModelCompute with one layer workspace,
// the GEMM precision "auto" (bf16 operands, f32 accumulation on a GPU), f32 weights on the GPU
// (the executor's device slots hold the bf16-streamed weights widened to f32), f32 gradient
// slots the backward adds into, f32 activations, the attention backward's dK/dV workspace as
// the executor gets it (model::AttnBwdWorkspace::kDefault: on unless FERRY_ATTN_BWD_WORKSPACE=0;
// --layer_attn_ws overrides, see below). The gradient that enters the layer's backward
// comes from ModelCompute::head_backward over a 128-word vocabulary (the only way into the
// running gradient); it runs before each repetition, outside the timed region, with a 256 MiB
// L2 flush like cuda_kernels_bench.
//
// Rows: BM_Layer/<geometry>/<B>/<S>/manual_time, geometries Qwen2.5-3B (C 2048, 16/2 heads of
// 128, F 11008, q/k/v bias, RMSNorm eps 1e-6, rope theta 1e6) and Qwen2.5-7B (C 3584, 28/4,
// F 18944). tools/bench/torch_layer_baseline.py times transformers' Qwen2DecoderLayer on the same
// rows; tools/bench/compare.py prints torch_ms / ferry_ms (scripts/gpu_check.sh runs all three).
//
//   layer_bench --benchmark_out=layer.json --benchmark_out_format=json
//   layer_bench --layer_shapes=3b:8x1024,7b:4x1024 --layer_reps=10
//   layer_bench --layer_device=cpu --layer_shapes=tiny:2x64     # the CPU backend (a check only)
//   layer_bench --layer_attn_ws=ab       # A/B in one process: BM_Layer/... with the attention
//                                        # backward's workspace, BM_LayerNoAttnWs/... without
// --layer_attn_ws=on|off forces it for the BM_Layer rows (default: the process default).
//
// Counters: ms (forward + backward), fwd_ms, bwd_ms, TFLOP/s (model FLOPs: 3x the linear layers'
// 2*T*MACs, causal attention 3.5x its forward's 2*2*B*H*(S^2/2)*D, as cuda_kernels_bench),
// workspace_gib (ModelCompute's arena), attn_ws_mib (the attention backward's workspace in it,
// 0: none), tokens; reforward_ms (the internals-only re-forward) and trainer_ms (fwd_ms +
// reforward_ms + bwd_ms: a not-kept layer's work per micro-batch in the stream executor).
// ms, fwd_ms and bwd_ms exclude the re-forward, so they pair with torch_layer_baseline.py's plain
// (not checkpointed) layer: forward, then backward from the saved activations. A checkpointed
// torch layer (HF's gradient checkpointing, train_torch_baseline.py --checkpointing: each decoder
// layer under torch.utils.checkpoint) re-runs the layer's forward inside its backward; reentrant
// checkpointing (transformers' default when gradient_checkpointing_enable() gets no kwargs)
// re-runs all of it, down projection and residual add included, so its time per layer is about
// torch fwd_ms + ms, the figure trainer_ms compares with (non-reentrant checkpointing may stop
// the re-run early, once every tensor the backward saved has been regenerated).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"
#include "core/result.h"
#include "kernels/backend.h"
#include "mem/budget.h"
#include "mem/buffer.h"
#include "mem/event.h"
#include "mem/stream_set.h"
#include "mem/tier.h"
#include "mem/transfer_engine.h"
#include "model/config.h"
#include "model/model_binding.h"
#include "model/model_compute.h"

namespace {

using namespace ferry;
using model::DecoderGeometry;
using model::LayerTensors;

// The Qwen2.5 geometries (head dim = hidden / heads = 128) and a tiny one for the CPU check.
struct GeometrySpec {
  std::string_view name;
  int hidden, heads, kv_heads, intermediate;
};
constexpr std::array<GeometrySpec, 3> kGeometries{
    {{"3b", 2048, 16, 2, 11008}, {"7b", 3584, 28, 4, 18944}, {"tiny", 128, 4, 2, 384}}};

struct LayerShape {
  GeometrySpec geo;
  int batch = 0;  // B sequences ...
  int seq = 0;    // ... of S tokens each, packed: T = B * S
  model::AttnBwdWorkspace attn_ws = model::AttnBwdWorkspace::kDefault;
};

// Set by main() from its own flags (the rest goes to Google Benchmark).
struct Options {
  Device device = Device::kCuda;
  int reps = 20;
  int warmup = 3;
  std::vector<LayerShape> shapes;
  // The BM_Layer rows' attention workspace; ab: also BM_LayerNoAttnWs rows without it.
  model::AttnBwdWorkspace attn_ws = model::AttnBwdWorkspace::kDefault;
  bool attn_ws_ab = false;
};
Options g_opts;

constexpr int kHeadVocab = 128;                  // the loss head that seeds the gradient
constexpr std::size_t kFlushBytes = 256u << 20;  // L2 flush before each repetition
constexpr std::int64_t kFillBlock = 1 << 20;     // host block tiled over a device buffer

// A Qwen2 config.json for one layer of the geometry, parsed and bound like a real model's.
Result<DecoderGeometry> qwen2_geometry(const GeometrySpec& g, int max_positions) {
  const std::string json = fmt::format(
      R"({{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": {},
          "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": 1,
          "num_attention_heads": {}, "num_key_value_heads": {}, "max_position_embeddings": {},
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
          "hidden_act": "silu"}})",
      kHeadVocab, g.hidden, g.intermediate, g.heads, g.kv_heads, std::max(max_positions, 32768));
  FERRY_ASSIGN_OR_RETURN(model::ModelConfig cfg,
                         model::parse_model_config_text(json, "layer bench config"));
  return model::make_geometry(cfg);
}

// Binds one layer's tensors (Qwen2: no q/k norm, no o bias, dense MLP) at consecutive 256-byte
// aligned offsets from `base` (nullptr: only counts). Returns the floats used.
template <typename View>
std::int64_t bind_layer(LayerTensors<View>& t, float* base, const DecoderGeometry& g, Device dev) {
  using L = LayerTensors<View>;
  const std::int64_t C = g.hidden, HD = std::int64_t(g.heads) * g.head_dim,
                     GD = std::int64_t(g.kv_heads) * g.head_dim, F = g.mlp_width;
  // member, rows, cols (0: a vector)
  const std::array<std::tuple<View L::*, std::int64_t, std::int64_t>, 12> table{{
      {&L::attn_norm, C, 0},
      {&L::q, HD, C},
      {&L::k, GD, C},
      {&L::v, GD, C},
      {&L::q_bias, HD, 0},
      {&L::k_bias, GD, 0},
      {&L::v_bias, GD, 0},
      {&L::o, C, HD},
      {&L::mlp_norm, C, 0},
      {&L::gate, F, C},
      {&L::up, F, C},
      {&L::down, C, F},
  }};
  std::int64_t off = 0;
  for (const auto& [member, rows, cols] : table) {
    if (base != nullptr) {
      float* p = base + off;
      t.*member = cols == 0 ? View::contiguous(p, DType::kF32, dev, {rows})
                            : View::contiguous(p, DType::kF32, dev, {rows, cols});
    }
    off += ((cols == 0 ? rows : rows * cols) + 63) / 64 * 64;
  }
  return off;
}

// The backend, its streams, the transfer engine and the memory tier of one device.
struct Env {
  Device device = Device::kCuda;
  kernels::Backend* be = nullptr;
  std::unique_ptr<mem::StreamSet> streams;
  std::unique_ptr<mem::TransferEngine> own_te;
  mem::TransferEngine* te = nullptr;
  mem::MemTier tier = mem::MemTier::kPageableHost;
  std::unique_ptr<mem::MemoryBudget> budget;  // unlimited: the numbers are the point here
  mem::Buffer flush;
  std::string error;

  static Env& get() {
    static Env env = [] {
      Env e;
      e.device = g_opts.device;
      if (Status s = e.init(); !s.ok()) e.error = s.to_string();
      return e;
    }();
    return env;
  }
  mem::Stream& stream() { return streams->compute(); }

 private:
  Status init() {
    if (device == Device::kCpu) {
      be = &kernels::cpu_backend();
      te = &mem::host_transfer_engine();
    } else {
      FERRY_ASSIGN_OR_RETURN(be, kernels::cuda_backend(0));
      FERRY_ASSIGN_OR_RETURN(own_te, mem::cuda_transfer_engine(0));
      te = own_te.get();
      tier = mem::MemTier::kDevice;
    }
    FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(device, 0));
    streams = std::make_unique<mem::StreamSet>(std::move(ss));
    budget = std::make_unique<mem::MemoryBudget>(tier);
    if (device == Device::kCuda) {
      FERRY_ASSIGN_OR_RETURN(flush, mem::Buffer::allocate(tier, kFlushBytes, *budget,
                                                          {.what = "layer bench L2 flush"}));
    }
    return {};
  }
};

// Writes n floats at dst (Env memory): uniform in [-scale, scale) from a seeded LCG, or `scale`
// everywhere when constant. One host block is tiled over large buffers (fine for timing).
Status fill(Env& env, float* dst, std::int64_t n, float scale, std::uint32_t seed,
            bool constant = false) {
  std::vector<float> h(static_cast<std::size_t>(std::min(n, kFillBlock)));
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (float& v : h) {
    x = x * 1664525u + 1013904223u;
    v = constant ? scale : scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
  for (std::int64_t off = 0; off < n; off += kFillBlock) {
    const std::int64_t m = std::min(kFillBlock, n - off);
    FERRY_TRY(env.te->h2d(dst + off, h.data(), static_cast<std::size_t>(m) * sizeof(float),
                          env.stream()));
  }
  return env.stream().synchronize();  // h dies here
}

// Everything one row needs: weights, gradients, boundaries, batch, loss head, ModelCompute.
class LayerRig {
 public:
  static Result<std::unique_ptr<LayerRig>> create(Env& env, const LayerShape& shape) {
    std::unique_ptr<LayerRig> r(new LayerRig(env));
    FERRY_TRY(r->init(shape));
    return r;
  }

  // Seconds of one repetition's three timed phases.
  struct RepTimes {
    double fwd = 0, reforward = 0, bwd = 0;
  };

  // One repetition: seeds the running gradient (head_backward), flushes L2, then times
  // layer_forward, layer_forward_internals (after another flush) and layer_backward: the stream
  // executor's order for a layer whose internals it does not keep.
  Result<RepTimes> rep() {
    mem::Stream& st = env_.stream();
    FERRY_TRY(mc_->head_backward(head_c(final_norm_), head_c(lm_head_), d_final_norm_, d_lm_head_,
                                 batch_, x_out_));
    if (env_.device == Device::kCuda) {
      FERRY_TRY(env_.te->zero(env_.flush.data(), kFlushBytes, st));
      FERRY_TRY(e0_.record(st));
      FERRY_TRY(mc_->layer_forward(0, p_, batch_, x_in_, x_out_));
      FERRY_TRY(e1_.record(st));
      FERRY_TRY(env_.te->zero(env_.flush.data(), kFlushBytes, st));
      FERRY_TRY(e2_.record(st));
      FERRY_TRY(mc_->layer_forward_internals(0, p_, batch_, x_in_));
      FERRY_TRY(e3_.record(st));
      FERRY_TRY(mc_->layer_backward(0, p_, g_, batch_, x_in_));
      FERRY_TRY(e4_.record(st));
      FERRY_TRY(e4_.synchronize());
      FERRY_ASSIGN_OR_RETURN(const float fwd_ms, mem::Event::elapsed_ms(e0_, e1_));
      FERRY_ASSIGN_OR_RETURN(const float ref_ms, mem::Event::elapsed_ms(e2_, e3_));
      FERRY_ASSIGN_OR_RETURN(const float bwd_ms, mem::Event::elapsed_ms(e3_, e4_));
      return RepTimes{fwd_ms * 1e-3, ref_ms * 1e-3, bwd_ms * 1e-3};
    }
    // Host streams run each op at enqueue time: the wall clock is the time.
    using Clock = std::chrono::steady_clock;
    const auto seconds = [](auto a, auto b) {
      return std::chrono::duration<double>(b - a).count();
    };
    const auto t0 = Clock::now();
    FERRY_TRY(mc_->layer_forward(0, p_, batch_, x_in_, x_out_));
    const auto t1 = Clock::now();
    FERRY_TRY(mc_->layer_forward_internals(0, p_, batch_, x_in_));
    const auto t2 = Clock::now();
    FERRY_TRY(mc_->layer_backward(0, p_, g_, batch_, x_in_));
    const auto t3 = Clock::now();
    return RepTimes{seconds(t0, t1), seconds(t1, t2), seconds(t2, t3)};
  }

  // A check that the backward reached the layer's first op: the attn_norm weight gradient (the
  // last one the backward writes) is finite and not all zero.
  Result<bool> gradient_reached_input() {
    const std::int64_t C = geo_.hidden;
    std::vector<float> h(static_cast<std::size_t>(C));
    FERRY_TRY(env_.te->d2h(h.data(), g_.attn_norm.data, h.size() * sizeof(float), env_.stream()));
    FERRY_TRY(env_.stream().synchronize());
    bool finite = true, nonzero = false;
    for (float v : h) {
      finite = finite && std::isfinite(v);
      nonzero = nonzero || v != 0.0f;
    }
    return finite && nonzero;
  }

  // Model FLOPs of one forward + backward (see the header comment).
  double flops() const {
    const double C = geo_.hidden, HD = double(geo_.heads) * geo_.head_dim,
                 GD = double(geo_.kv_heads) * geo_.head_dim, F = geo_.mlp_width;
    const double macs_per_token = C * (HD + 2 * GD) + HD * C + 3 * C * F;
    const double linear = 3.0 * 2.0 * double(T_) * macs_per_token;
    const double attn_fwd = 2.0 * 2.0 * shape_.batch * geo_.heads *
                            (double(shape_.seq) * shape_.seq / 2.0) * geo_.head_dim;
    return linear + 3.5 * attn_fwd;
  }
  std::int64_t tokens() const { return T_; }
  std::size_t workspace_bytes() const { return mc_->total_bytes(); }
  std::size_t attn_workspace_bytes() const { return mc_->attention_workspace_bytes(); }
  double loss() const { return loss_; }

 private:
  explicit LayerRig(Env& env) : env_(env) {}

  ConstTensorView head_c(const TensorView& v) const { return v; }

  Status init(const LayerShape& shape) {
    shape_ = shape;
    const Device dev = env_.device;
    FERRY_ASSIGN_OR_RETURN(geo_, qwen2_geometry(shape.geo, shape.seq));
    T_ = std::int64_t(shape.batch) * shape.seq;
    const std::int64_t C = geo_.hidden, V = geo_.vocab;

    // Weights and gradients: one buffer each, same layout. Loss head (final norm + lm_head) and
    // its gradients after the layer's tensors.
    LayerTensors<TensorView> unused;
    const std::int64_t layer_n = bind_layer(unused, nullptr, geo_, dev);
    const std::int64_t head_n = C + V * C;
    const auto bytes = static_cast<std::size_t>(layer_n + head_n) * sizeof(float);
    FERRY_ASSIGN_OR_RETURN(params_, mem::Buffer::allocate(env_.tier, bytes, *env_.budget,
                                                          {.what = "layer bench weights"}));
    FERRY_ASSIGN_OR_RETURN(grads_, mem::Buffer::allocate(env_.tier, bytes, *env_.budget,
                                                         {.what = "layer bench gradients"}));
    auto* w = reinterpret_cast<float*>(params_.data());
    auto* gw = reinterpret_cast<float*>(grads_.data());
    LayerTensors<TensorView> pw;
    bind_layer(pw, w, geo_, dev);
    bind_layer(g_, gw, geo_, dev);
    p_ = model::as_const(pw);
    final_norm_ = TensorView::contiguous(w + layer_n, DType::kF32, dev, {C});
    lm_head_ = TensorView::contiguous(w + layer_n + C, DType::kF32, dev, {V, C});
    d_final_norm_ = TensorView::contiguous(gw + layer_n, DType::kF32, dev, {C});
    d_lm_head_ = TensorView::contiguous(gw + layer_n + C, DType::kF32, dev, {V, C});

    // Values: matrices and biases ~U(-0.02, 0.02) (HF's init scale), norm weights 1.
    FERRY_TRY(fill(env_, w, layer_n + head_n, 0.02f, 1));
    for (const TensorView& norm : {pw.attn_norm, pw.mlp_norm, final_norm_}) {
      FERRY_TRY(fill(env_, norm.as<float>(), norm.numel(), 1.0f, 0, /*constant=*/true));
    }
    FERRY_TRY(env_.te->zero(grads_.data(), bytes, env_.stream()));

    // Boundaries: x_in ~U(-1, 1), x_out written by the forward.
    const auto act_bytes = static_cast<std::size_t>(T_ * C) * sizeof(float);
    FERRY_ASSIGN_OR_RETURN(acts_, mem::Buffer::allocate(env_.tier, 2 * act_bytes, *env_.budget,
                                                        {.what = "layer bench boundaries"}));
    auto* a = reinterpret_cast<float*>(acts_.data());
    x_in_ = TensorView::contiguous(a, DType::kF32, dev, {T_, C});
    x_out_ = TensorView::contiguous(a + T_ * C, DType::kF32, dev, {T_, C});
    FERRY_TRY(fill(env_, a, T_ * C, 1.0f, 2));

    // The packed batch: B sequences of S tokens, positions restarting per sequence.
    const std::int64_t B = shape.batch;
    std::vector<std::int32_t> h(static_cast<std::size_t>(3 * T_ + B + 1));
    std::int32_t* ids = h.data();
    std::int32_t* pos = ids + T_;
    std::int32_t* tgt = pos + T_;
    std::int32_t* cu = tgt + T_;
    std::uint32_t x = 7;
    for (std::int64_t t = 0; t < T_; ++t) {
      x = x * 1664525u + 1013904223u;
      ids[t] = static_cast<std::int32_t>((x >> 8) % V);
      tgt[t] = static_cast<std::int32_t>((x >> 16) % V);
      pos[t] = static_cast<std::int32_t>(t % shape.seq);
    }
    for (std::int64_t b = 0; b <= B; ++b) cu[b] = static_cast<std::int32_t>(b * shape.seq);
    FERRY_ASSIGN_OR_RETURN(ints_, mem::Buffer::allocate(env_.tier, h.size() * 4, *env_.budget,
                                                        {.what = "layer bench batch"}));
    FERRY_TRY(env_.te->h2d(ints_.data(), h.data(), h.size() * 4, env_.stream()));
    FERRY_TRY(env_.stream().synchronize());
    const auto* d = reinterpret_cast<const std::int32_t*>(ints_.data());
    batch_ = model::PackedBatch{
        .ids = ConstTensorView::contiguous(d, DType::kI32, dev, {T_}),
        .positions = ConstTensorView::contiguous(d + T_, DType::kI32, dev, {T_}),
        .cu_seqlens = ConstTensorView::contiguous(d + 3 * T_, DType::kI32, dev, {B + 1}),
        .targets = ConstTensorView::contiguous(d + 2 * T_, DType::kI32, dev, {T_})};

    // ModelCompute as StreamExecutor::init creates it: one layer workspace, "auto" precision,
    // the attention workspace as the row asks (the executor's: kDefault).
    FERRY_ASSIGN_OR_RETURN(const model::GemmPrecision prec,
                           model::parse_gemm_precision("auto", dev));
    FERRY_ASSIGN_OR_RETURN(mc_, model::ModelCompute::create(geo_, T_, *env_.be, 1, &env_.stream(),
                                                            prec, shape.attn_ws));
    if (dev == Device::kCuda) {
      for (mem::Event* e : {&e0_, &e1_, &e2_, &e3_, &e4_}) {
        FERRY_ASSIGN_OR_RETURN(*e, mem::Event::create(dev, 0, /*timing=*/true));
      }
    }
    // Prime: one forward and the loss head, so head_backward can seed every repetition.
    FERRY_TRY(mc_->layer_forward(0, p_, batch_, x_in_, x_out_));
    FERRY_ASSIGN_OR_RETURN(
        const model::ForwardResult fr,
        mc_->head_forward(head_c(final_norm_), head_c(lm_head_), batch_, x_out_));
    loss_ = fr.mean_loss();
    return {};
  }

  Env& env_;
  LayerShape shape_;
  DecoderGeometry geo_;
  std::int64_t T_ = 0;
  mem::Buffer params_, grads_, acts_, ints_;
  LayerTensors<ConstTensorView> p_;
  LayerTensors<TensorView> g_;
  TensorView final_norm_, lm_head_, d_final_norm_, d_lm_head_;
  TensorView x_in_, x_out_;  // [T, C] f32
  model::PackedBatch batch_;
  std::unique_ptr<model::ModelCompute> mc_;
  mem::Event e0_, e1_, e2_, e3_, e4_;
  double loss_ = 0.0;
};

void run_layer(benchmark::State& st, const LayerShape& shape) {
  Env& env = Env::get();
  if (!env.error.empty()) {
    st.SkipWithError(("layer bench: " + env.error).c_str());
    return;
  }
  auto rig = LayerRig::create(env, shape);
  if (!rig.ok()) {
    st.SkipWithError(("layer bench: " + rig.status().to_string()).c_str());
    return;
  }
  LayerRig& r = **rig;
  for (int i = 0; i < g_opts.warmup; ++i) {
    if (auto w = r.rep(); !w.ok()) {
      st.SkipWithError(("layer bench warm-up: " + w.status().to_string()).c_str());
      return;
    }
  }
  double fwd = 0.0, reforward = 0.0, bwd = 0.0;
  for (auto _ : st) {
    auto t = r.rep();
    if (!t.ok()) {
      st.SkipWithError(("layer bench: " + t.status().to_string()).c_str());
      return;
    }
    // The row's time is forward + backward (torch_layer_baseline.py's plain layer); the
    // re-forward is reported beside it (reforward_ms, trainer_ms).
    st.SetIterationTime(t->fwd + t->bwd);
    fwd += t->fwd;
    reforward += t->reforward;
    bwd += t->bwd;
  }
  auto reached = r.gradient_reached_input();
  if (!reached.ok() || !*reached) {
    st.SkipWithError("layer bench: the attn_norm gradient is zero or not finite");
    return;
  }
  const double it = static_cast<double>(st.iterations());
  st.counters["ms"] = (fwd + bwd) / it * 1e3;
  st.counters["fwd_ms"] = fwd / it * 1e3;
  st.counters["bwd_ms"] = bwd / it * 1e3;
  st.counters["reforward_ms"] = reforward / it * 1e3;
  st.counters["trainer_ms"] = (fwd + reforward + bwd) / it * 1e3;
  st.counters["TFLOP/s"] = r.flops() * it / (fwd + bwd) / 1e12;
  st.counters["tokens"] = static_cast<double>(r.tokens());
  st.counters["workspace_gib"] = static_cast<double>(r.workspace_bytes()) / double(1u << 30);
  st.counters["attn_ws_mib"] = static_cast<double>(r.attn_workspace_bytes()) / double(1u << 20);
  st.counters["head_loss"] = r.loss();
}

// "3b:4x1024,7b:8x1024" -> shapes; empty on a malformed list.
std::vector<LayerShape> parse_shapes(std::string_view list) {
  std::vector<LayerShape> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string item(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    char name[16] = {};
    int b = 0, s = 0;
    if (std::sscanf(item.c_str(), "%15[^:]:%dx%d", name, &b, &s) != 3 || b <= 0 || s <= 0) {
      return {};
    }
    bool found = false;
    for (const GeometrySpec& g : kGeometries) {
      if (g.name == name) {
        out.push_back({g, b, s});
        found = true;
      }
    }
    if (!found) return {};
  }
  return out;
}

// Default rows: Qwen2.5-3B at 4 and 8 x 1024 (a training micro-batch), 4 x 2048 and 2 x 4096;
// Qwen2.5-7B at 4 and 8 x 1024.
constexpr std::string_view kDefaultShapes =
    "3b:4x1024,3b:8x1024,3b:4x2048,3b:2x4096,7b:4x1024,7b:8x1024";

}  // namespace

int main(int argc, char** argv) {
  std::string shapes(kDefaultShapes);
  // Own flags first (--layer_device=cuda|cpu, --layer_shapes=..., --layer_reps=N,
  // --layer_warmup=N, --layer_attn_ws=on|off|ab); everything else is Google Benchmark's.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const std::size_t eq = arg.find('=');
    const std::string_view flag = arg.substr(0, eq);
    const std::string value(eq == std::string_view::npos ? "" : arg.substr(eq + 1));
    if (flag == "--layer_device") {
      if (value != "cuda" && value != "cpu") {
        std::fprintf(stderr, "layer bench: --layer_device=%s (expected cuda or cpu)\n",
                     value.c_str());
        return 2;
      }
      g_opts.device = value == "cpu" ? Device::kCpu : Device::kCuda;
    } else if (flag == "--layer_shapes") {
      shapes = value;
    } else if (flag == "--layer_reps") {
      g_opts.reps = std::atoi(value.c_str());
    } else if (flag == "--layer_warmup") {
      g_opts.warmup = std::atoi(value.c_str());
    } else if (flag == "--layer_attn_ws") {
      if (value == "on" || value == "ab") {
        g_opts.attn_ws = model::AttnBwdWorkspace::kOn;
      } else if (value == "off") {
        g_opts.attn_ws = model::AttnBwdWorkspace::kOff;
      } else {
        std::fprintf(stderr, "layer bench: --layer_attn_ws=%s (expected on, off or ab)\n",
                     value.c_str());
        return 2;
      }
      g_opts.attn_ws_ab = value == "ab";
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  g_opts.shapes = parse_shapes(shapes);
  if (g_opts.shapes.empty() || g_opts.reps < 1 || g_opts.reps > 10000 || g_opts.warmup < 0) {
    std::fprintf(stderr,
                 "layer bench: bad --layer_shapes=%s (geometry:BxS,... with geometry 3b, 7b or "
                 "tiny) or --layer_reps/--layer_warmup\n",
                 shapes.c_str());
    return 2;
  }
  for (LayerShape s : g_opts.shapes) {
    // BM_Layer rows pair with tools/bench/torch_layer_baseline.py's; the A/B rows are ferry's only.
    std::vector<std::pair<std::string, model::AttnBwdWorkspace>> rows{{"BM_Layer", g_opts.attn_ws}};
    if (g_opts.attn_ws_ab) rows.emplace_back("BM_LayerNoAttnWs", model::AttnBwdWorkspace::kOff);
    for (const auto& [prefix, ws] : rows) {
      s.attn_ws = ws;
      const std::string name = fmt::format("{}/{}/{}/{}", prefix, s.geo.name, s.batch, s.seq);
      benchmark::RegisterBenchmark(name.c_str(), [s](benchmark::State& st) { run_layer(st, s); })
          ->UseManualTime()
          ->Iterations(g_opts.reps)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
