// SPDX-License-Identifier: Apache-2.0
// Whole-model forward and backward of a decoder-only transformer (Llama, Qwen2/2.5, Qwen3,
// Qwen3-MoE, Mixtral, OLMoE) on any Backend, over a packed batch of variable-length sequences.
//
// Two ways to drive it, same arithmetic, same bits:
//   whole model  forward()/backward(): every activation backward needs is kept, per layer. This is
//                the path the golden tests compare against transformers
//                (tests/golden/model_golden_test.cpp) and what `ferry perplexity` runs.
//   per layer    embed / layer_forward / head_forward, then head_backward / layer_backward /
//                embed_backward (train/stream): the caller owns the layer boundaries (each
//                layer's input) and decides where they live; ModelCompute keeps the internals of
//                the last layer_forward in one of `work_layers` workspaces, and layer_backward(l)
//                consumes those of layer l, so an executor recomputes a layer's internals from its
//                boundary just before the layer's backward. The CPU kernels are deterministic for
//                a given thread count, so a recomputed layer is bit-identical to the first pass.
//                Kept layers (create()'s kept_layers) get a workspace of their own instead, so
//                their internals survive the other layers' forwards and an executor can run
//                their backward without re-running the forward (train/stream's "keep internals").
//                All but a dense layer's SwiGLU output: its backward recomputes that from the
//                kept gate and up (one elementwise pass, the forward's call, the same bits).
//
// Memory is planned, not discovered: ModelCompute sizes every activation buffer for max_tokens at
// construction, in one arena (model_compute_buffers.h); forward()/backward() never allocate.
//
// Where things live: the arena is in the backend's memory: pageable host memory for CPU backends,
// GPU memory (MemTier::kDevice, cudaMalloc) for a CUDA backend (Device::kCuda), where every op
// is enqueued on the CUDA stream given to create(). Everything the caller passes (params, grads,
// PackedBatch views, nll_out / logits_out, per-layer boundaries) must then be device views on
// that GPU too. The few numbers the host needs (per-token nll and targets for the loss sum, MoE
// expert row offsets for the per-expert GEMMs, token ids for the padding row) are copied back
// explicitly (small D2H copies, then a stream synchronize); those are the only host syncs.
// Activations stay f32. Linear layers (every x W^T, their two backward GEMMs and the lm_head inside
// the loss) multiply in the GemmPrecision chosen at create(): kF32 (the default; what the golden
// tests compare), or kBf16, PyTorch autocast's bf16 matmul: both operands rounded to bf16 (round
// to nearest even), products accumulated in f32, f32 out, so the residual stream, norms, softmax
// and gradients stay f32 while the GEMMs run on bf16 tensor cores (model_compute_linear.cpp). A
// backend without bf16 GEMMs (CPU) runs kBf16 as its twin: the same rounding, then f32 GEMMs.
// When the backend has no f32 attention (supports(kAttention, kF32) is
// false, e.g. CUDA), q/k/v are cast to bf16 just for attention and its output back to f32 (and
// dO, dQ, dK, dV likewise in the backward) through Backend::convert. CPU backends never cast.
// A layer's backward right after its own forward (train/stream's recompute, the last layer of
// the whole-model path) reuses the forward's bf16 q/k/v/out instead of recasting them. With bf16
// GEMMs each GEMM input activation is rounded once per pass where several GEMMs read it, and the
// down projection's operand comes from the SwiGLU kernel (gemm_input_reuse_default() below).
//
// One layer, as the code reads top to bottom (shapes in docs/glossary.md):
//   h1 = rms_norm(x, attn_norm); q,k,v = h1 W^T (+b); [q/k norm]; rope(q,k); o = attn(q,k,v)
//   x += o Wo^T; h2 = rms_norm(x, mlp_norm)
//   dense: x += (silu(h2 Wg^T) * h2 Wu^T) Wd^T
//   moe:   w,ids = router(h2 Wr^T); x += sum_k w_k expert_{ids_k}(h2)   (combine in routing order)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "kernels/backend.h"
#include "kernels/rope_table.h"
#include "model/config.h"
#include "model/param_spec.h"
#include "tensor/tensor_view.h"

namespace ferry::mem {
class Arena;
class MemoryBudget;
class TransferEngine;
}  // namespace ferry::mem

namespace ferry::model {
namespace detail {
class BufferTable;
template <typename T>
struct DevBuf;
}  // namespace detail

// The numbers the arithmetic needs, derived from a ModelConfig (model_binding.h).
struct DecoderGeometry {
  int vocab = 0;         // V
  int hidden = 0;        // C
  int layers = 0;        // L
  int heads = 0;         // H
  int kv_heads = 0;      // G
  int head_dim = 0;      // D
  int mlp_width = 0;     // F of dense layers
  int expert_width = 0;  // F of experts
  int experts = 0;       // E (0: dense model)
  int top_k = 0;         // K
  bool renormalize_topk = false;
  float rms_eps = 1e-6f;
  QkNorm qk_norm = QkNorm::kNone;
  bool qkv_bias = false;
  bool o_bias = false;
  bool tied_embeddings = false;
  int padding_idx = -1;  // embedding row excluded from the gradient (HF padding_idx), -1 none
  std::vector<bool> layer_is_moe;  // [L]
  kernels::RopeTable rope;
};

// Views of one layer's parameters (or of their gradients: the same struct with writable data).
// Unused entries are empty views (data == nullptr).
template <typename View>
struct LayerTensors {
  View attn_norm;                 // [C]
  View q, k, v, o;                // [H*D, C], [G*D, C], [G*D, C], [C, H*D]
  View q_bias, k_bias, v_bias;    // [H*D], [G*D], [G*D]
  View o_bias;                    // [C]
  View q_norm, k_norm;            // [D] (per head) or [H*D] / [G*D] (full width)
  View mlp_norm;                  // [C]
  View gate, up, down;            // dense: [F, C], [F, C], [C, F]
  View router;                    // [E, C]
  std::vector<View> expert_gate;  // E x [F, C]
  std::vector<View> expert_up;    // E x [F, C]
  std::vector<View> expert_down;  // E x [C, F]
};

// Every view of a layer mapped through f, field by field: the one place that lists the fields,
// so a field added to LayerTensors is converted everywhere once it is added here.
template <typename To, typename From, typename F>
LayerTensors<To> map_layer(const LayerTensors<From>& l, F&& f) {
  LayerTensors<To> o;
  o.attn_norm = f(l.attn_norm);
  o.q = f(l.q);
  o.k = f(l.k);
  o.v = f(l.v);
  o.o = f(l.o);
  o.q_bias = f(l.q_bias);
  o.k_bias = f(l.k_bias);
  o.v_bias = f(l.v_bias);
  o.o_bias = f(l.o_bias);
  o.q_norm = f(l.q_norm);
  o.k_norm = f(l.k_norm);
  o.mlp_norm = f(l.mlp_norm);
  o.gate = f(l.gate);
  o.up = f(l.up);
  o.down = f(l.down);
  o.router = f(l.router);
  for (const From& e : l.expert_gate) o.expert_gate.push_back(f(e));
  for (const From& e : l.expert_up) o.expert_up.push_back(f(e));
  for (const From& e : l.expert_down) o.expert_down.push_back(f(e));
  return o;
}

// A read-only view of a writable layer (gradients or bench-owned weights read as parameters).
inline LayerTensors<ConstTensorView> as_const(const LayerTensors<TensorView>& l) {
  return map_layer<ConstTensorView>(l, [](const TensorView& t) { return ConstTensorView(t); });
}

template <typename View>
struct ModelTensors {
  View embed;       // [V, C]
  View final_norm;  // [C]
  View lm_head;     // [V, C]; equals embed when tied
  std::vector<LayerTensors<View>> layers;
};

using ModelParams = ModelTensors<ConstTensorView>;
using ModelGrads = ModelTensors<TensorView>;

// A packed batch: S sequences back to back.
struct PackedBatch {
  ConstTensorView ids;         // [T] i32
  ConstTensorView positions;   // [T] i32
  ConstTensorView cu_seqlens;  // [S + 1] i32
  ConstTensorView targets;     // [T] i32, -100 = ignored; may be empty for forward-only logits
};

// How linear layers multiply (see the header comment).
enum class GemmPrecision : std::uint8_t {
  kF32,   // f32 operands
  kBf16,  // operands rounded to bf16, f32 accumulation and output
};
std::string_view to_string(GemmPrecision p);
// "f32" | "bf16" | "auto" (bf16 when computing on a GPU, f32 on a CPU, where bf16 would only add
// rounding); anything else is invalid_argument naming the value.
Result<GemmPrecision> parse_gemm_precision(std::string_view s, Device compute);

// Whether ModelCompute reads a parameter of this role only as the weight operand of its bf16
// GEMMs (linear / linear_backward through gemm_operand): the q/k/v/o projections and the dense
// and expert MLP matrices. With GemmPrecision::kBf16 on a backend with native bf16 GEMMs such a
// parameter may be passed as a bf16 view (the GEMM reads it in place, no convert); every other
// layer parameter (norm weights, biases, q/k norms, the router, whose GEMMs stay f32) must be f32.
// train/stream's bf16 weight views rely on this list (docs/train_gpu_executor.md).
bool is_gemm_weight_role(ParamRole r);

// Whether the attention backward gets its optional workspace (AttentionBackwardArgs::workspace,
// Backend::workspace_bytes): on the CUDA backend the dK/dV kernel then runs every query head of a
// kv head's group in parallel (f32 partials added in a fixed order) instead of one slice per kv
// head: 2 x [T, H, D] f32 = 8 T H D bytes, sized for max_tokens, one buffer shared by all layers
// (they run one at a time) and counted in planned_bytes(). CPU backends ask for 0 bytes, and on
// CUDA a model without grouped heads (H == G) has nothing to split: 0 bytes, unless
// FERRY_ATTN_BWD_DQ=atomic, whose dQ accumulator (4 T H D + dsum bytes) is then the workspace. The
// bits of dK/dV depend on the choice (both are deterministic), so every ModelCompute of one process
// should make the same one: kDefault does (on, unless FERRY_ATTN_BWD_WORKSPACE=0 in the
// environment, read once per process), and it is what train/stream's executor and its device plan
// use.
enum class AttnBwdWorkspace : std::uint8_t {
  kDefault,  // attn_bwd_workspace_default()
  kOn,
  kOff,
};
// The process-wide default: true unless FERRY_ATTN_BWD_WORKSPACE=0 (read on the first call).
bool attn_bwd_workspace_default();

// Whether ModelCompute rounds each GEMM input activation to bf16 once per pass where several
// GEMMs read it (GemmPrecision::kBf16; model_compute_linear.cpp): q/k/v share the rounded attn
// norm output, gate/up the rounded mlp norm output (forward and the backward's weight-gradient
// GEMMs; in a dense layer's forward the norm kernel writes that copy itself, RmsNormArgs::out16),
// the SwiGLU kernel writes the down projection's bf16 operand itself (SwiGluArgs::out16),
// and a layer's backward right after its own forward reuses that copy for the down projection's
// weight gradient. The same bits either way (rounding is deterministic); off only for A/B runs.
// True unless FERRY_GEMM_INPUT_REUSE=0 in the environment, read on every call (create() reads it
// once per ModelCompute; set_gemm_input_reuse() overrides it per object).
bool gemm_input_reuse_default();

// Whether ModelCompute lays the buffers of its attention backward, dense MLP backward, MoE
// backward and loss head over one another (plan_buffers' overlay in model_compute.cpp): their
// lifetimes never overlap, so one region as large as the largest set holds them all. At
// Qwen2.5-3B with bf16 GEMMs that region is the MLP backward's 3 T F f32 or the loss head's
// chunk workspace + bf16 lm_head, whichever is larger, instead of all of them; the same bits
// either way (every buffer of a set is written before it is read). True unless
// FERRY_SCRATCH_OVERLAY=0 in the environment (the A/B and the tests' twin), read at every
// create() / planned_bytes() call, so the two agree within a process that does not change it.
bool scratch_overlay_default();

struct ForwardResult {
  double loss_sum = 0.0;     // sum of nll over counted targets
  std::int64_t counted = 0;  // targets != ignore index
  double mean_loss() const { return counted > 0 ? loss_sum / double(counted) : 0.0; }
};

class ModelCompute {
 public:
  // max_tokens: the largest T forward() will be called with. Allocates every buffer now.
  // work_layers: how many layers' internal activations are kept (default: all L, which the
  // whole-model forward()/backward() need; the per-layer API works with 1).
  // stream: where every op is enqueued. CPU backends: a host stream (default Stream::host()).
  // CUDA backends: required, a CUDA stream of the backend's device (owned by the caller, e.g.
  // a mem::StreamSet's compute(), and outliving this object); forward()/backward() return once
  // the work is enqueued, except for the host syncs listed in the header comment. In a build
  // without CUDA a CUDA backend cannot exist; create() returns unavailable for any non-CPU device.
  //
  //   FERRY_ASSIGN_OR_RETURN(kernels::Backend* be, kernels::cuda_backend(0));
  //   FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(Device::kCuda, 0));
  //   FERRY_ASSIGN_OR_RETURN(auto mc, ModelCompute::create(geo, T, *be, -1, &ss.compute()));
  // attn_ws: the attention backward's workspace (AttnBwdWorkspace above).
  // kept_layers ([L] or empty = none): the layer -> workspace map. Layer l with kept_layers[l]
  // gets a dedicated workspace (its internals, sized for max_tokens and for its own kind, dense or
  // MoE: kept_layer_bytes()); every other layer uses the shared workspace l % work_layers. A kept
  // layer's internals stay until its next layer_forward, whatever other layers run meanwhile,
  // except a dense layer's act = swiglu(gate, up): it is written into the shared workspace's act
  // (l % work_layers), and the layer's backward recomputes it when another dense layer's forward
  // or backward wrote there since (swiglu_recomputes()).
  static Result<std::unique_ptr<ModelCompute>> create(
      const DecoderGeometry& geo, std::int64_t max_tokens, kernels::Backend& backend,
      int work_layers = -1, mem::Stream* stream = nullptr,
      GemmPrecision precision = GemmPrecision::kF32,
      AttnBwdWorkspace attn_ws = AttnBwdWorkspace::kDefault,
      const std::vector<bool>& kept_layers = {});
  // Bytes create() would allocate for these arguments (activations + scratch + the loss chunk's
  // workspace + the attention backward's workspace + the kept layers' workspaces + 256-byte slot
  // alignment, in the backend's memory), without allocating: what a planner charges for
  // ModelCompute's buffers. Equals total_bytes() of the created object. Not counted: the small
  // host copies of the header comment (O(T + L*E) values, device arenas only).
  static Result<std::size_t> planned_bytes(const DecoderGeometry& geo, std::int64_t max_tokens,
                                           kernels::Backend& backend, int work_layers = -1,
                                           GemmPrecision precision = GemmPrecision::kF32,
                                           AttnBwdWorkspace attn_ws = AttnBwdWorkspace::kDefault,
                                           const std::vector<bool>& kept_layers = {});
  // The bytes keeping layer l's internals adds to planned_bytes() (its dedicated workspace, slot
  // alignment included): planned_bytes(keep S) == planned_bytes(keep none) + the sum of this over
  // S, exactly (the dedicated workspaces lead the size table, so each starts 256-aligned and adds
  // the same bytes whatever else is planned). Depends on the layer only through its kind (dense
  // or MoE); backend and precision do not change it today (the kept internals are f32; the bf16
  // copies of q/k/v/out and the GEMM operands are shared scratch, recast by a kept layer's
  // backward), and are taken so a planner asks the same question the executor plans with.
  // Dense, no q/k norm, each buffer 256-byte aligned: 4 T (3C + 2HD + 2GD + H + 2F + 2) bytes
  // (h1, x_mid, h2; q, attn; k, v; lse; gate, up; rstd1, rstd2), no act (create() above).
  static Result<std::size_t> kept_layer_bytes(const DecoderGeometry& geo, int layer,
                                              std::int64_t max_tokens, kernels::Backend& backend,
                                              GemmPrecision precision = GemmPrecision::kF32);

  // Runs the model over the batch. When targets are given, fills nll_out ([T] f32, optional)
  // and returns the loss; when logits_out ([T, V] f32) is given, writes the full logits too (tests
  // and small vocabularies only: normal runs never materialise [T, V]). All views live on the
  // backend's device. With targets the loss is read back, so the call returns after the stream
  // has drained; without targets it returns once everything is enqueued.
  Result<ForwardResult> forward(const ModelParams& params, const PackedBatch& batch,
                                TensorView nll_out = {}, TensorView logits_out = {});

  // Gradients of the mean loss of the last forward() over the same batch, ADDED into grads
  // (zero them first for a fresh step). Requires targets in the batch.
  Status backward(const ModelParams& params, const PackedBatch& batch, const ModelGrads& grads);

  // ---- Per-layer API (see the header comment). T = batch.ids.numel() <= max_tokens. ----
  // x0 [T, C] = table[ids].
  Status embed(const ConstTensorView& table, const PackedBatch& batch, const TensorView& x0);
  // x_out [T, C] = layer l (x_in [T, C]); keeps the layer's internals in workspace_of(l)
  // (overwriting what was there). x_in must stay unchanged until layer_backward(l).
  Status layer_forward(int l, const LayerTensors<ConstTensorView>& p, const PackedBatch& batch,
                       const ConstTensorView& x_in, const TensorView& x_out);
  // What layer_backward(l) reads, without the output: layer_forward's internals (the same kernels
  // on the same input, the same bits) minus the last steps, whose result only the next layer reads
  // and the backward never does: a dense layer's down projection GEMM and residual add (2*T*C*F
  // of its GEMMs' 2*T*C*(2*H*D + 2*G*D + 3*F) FLOPs: 29% at Qwen2.5-3B/7B shapes), an MoE layer's
  // expert combine and residual add (its experts' down outputs stay: the router's gradient reads
  // them). An executor's re-forward right before a layer's backward runs this; a span recompute,
  // whose outputs are the next layers' inputs, runs layer_forward. Counted in
  // internals_forwards().
  Status layer_forward_internals(int l, const LayerTensors<ConstTensorView>& p,
                                 const PackedBatch& batch, const ConstTensorView& x_in);
  // Final norm + fused lm_head / cross-entropy over x_final [T, C] (kept by the caller until
  // head_backward). Requires targets.
  Result<ForwardResult> head_forward(const ConstTensorView& final_norm,
                                     const ConstTensorView& lm_head, const PackedBatch& batch,
                                     const ConstTensorView& x_final, TensorView nll_out = {});
  // Gradients of the mean loss of the last head_forward: ADDED into d_final_norm and d_lm_head;
  // leaves d loss / d x_final in the running gradient.
  Status head_backward(const ConstTensorView& final_norm, const ConstTensorView& lm_head,
                       const TensorView& d_final_norm, const TensorView& d_lm_head,
                       const PackedBatch& batch, const ConstTensorView& x_final);
  // Running gradient d(layer l output) -> d(layer l input); weight gradients ADDED into g. Uses
  // the internals of the last layer_forward(l) (same x_in, same weights, same batch), which are
  // still in workspace_of(l) when no other layer sharing it ran since: always for a kept layer.
  // The shared bf16 copies (attention's q/k/v/out, the down projection's operand) are reused only
  // when this layer's forward was the last to write them (same layer, workspace and T); else they
  // are recast from the f32 internals (the same bits). A dense layer whose act was overwritten
  // since its forward (a kept layer's, in the shared buffer) recomputes it first with the
  // forward's swiglu_into_gemm_input, which also writes the down projection's bf16 operand.
  Status layer_backward(int l, const LayerTensors<ConstTensorView>& p,
                        const LayerTensors<TensorView>& g, const PackedBatch& batch,
                        const ConstTensorView& x_in);
  // Running gradient -> embedding rows (ADDED into d_table; padding_idx rows excluded).
  Status embed_backward(const TensorView& d_table, const PackedBatch& batch);
  // True when the last head_forward counted no target (then there is no gradient at all).
  bool last_loss_empty() const { return last_counted_ == 0; }

  const DecoderGeometry& geometry() const { return geo_; }
  std::size_t activation_bytes() const;
  // The layer -> workspace map: kept layers have one of their own (index >= work_layers), the
  // others share l % work_layers.
  int workspace_of(int l) const { return workspace_of_[static_cast<std::size_t>(l)]; }
  bool layer_kept(int l) const { return workspace_of(l) >= work_layers_; }
  int kept_layer_count() const { return kept_count_; }
  // Bytes of the kept layers' workspaces in the arena (the sum of kept_layer_bytes()).
  std::size_t kept_bytes() const { return kept_bytes_; }
  // Everything create() allocated (activations + scratch + cross-entropy workspace, one arena in
  // the backend's memory).
  std::size_t total_bytes() const;
  // Device::kCuda when the buffers are GPU memory, else Device::kCpu.
  Device buffer_device() const { return dev_; }
  // True when attention runs on bf16 copies of q/k/v (backend without f32 attention).
  bool attention_in_bf16() const { return attn_bf16_; }
  GemmPrecision gemm_precision() const { return precision_; }
  // Layer GEMMs whose weight operand was converted (rounded to bf16 into the w16 scratch) since
  // create(): 0 when every weight came as a bf16 view (or the GEMMs are f32). The lm_head's
  // conversion (head16) is not counted. For tests and benches of train/stream's weight views.
  std::uint64_t gemm_weight_converts() const { return gemm_weight_converts_; }
  // GemmInputReuse (gemm_input_reuse_default() above): on by default from the environment; tests
  // flip it to compare the two paths. Changes no buffer (both paths use gemm.x16).
  void set_gemm_input_reuse(bool on) {
    gemm_input_reuse_ = on;
    act16_layer_ = -1;
  }
  bool gemm_input_reuse() const { return gemm_input_reuse_; }
  // Layer GEMM input activations rounded to bf16 by a separate convert since create() (into
  // gemm.x16; with GemmPrecision::kF32 none). The loss head's hidden rows (hf16) are not counted,
  // nor the bf16 copies the norm and SwiGLU kernels write themselves. For tests and benches of the
  // reuse.
  std::uint64_t gemm_input_converts() const { return gemm_input_converts_; }
  // Dense SwiGLU outputs a layer_backward recomputed since create(): one per backward of a dense
  // layer whose act = swiglu(gate, up) is no longer where its forward left it, i.e. a kept layer
  // (whose act lives in the shared workspace l % work_layers) after another dense layer's forward
  // or recompute wrote that buffer. Each is one swiglu_into_gemm_input call over the kept gate and
  // up, the forward's own call: one swiglu kernel (with the reuse on and bf16 GEMMs it also writes
  // the down projection's bf16 operand, so no gemm_input convert; with the reuse off or f32 GEMMs
  // it counts in gemm_input_converts() as the forward's does). Not counted: the top kept layer's
  // backward right after its own forward, which finds act (and its bf16 copy) in place. For tests
  // and benches of the keep.
  std::uint64_t swiglu_recomputes() const { return swiglu_recomputes_; }
  // layer_forward_internals calls since create() (for tests and benches of the re-forward).
  std::uint64_t internals_forwards() const { return internals_forwards_; }
  // Bytes of the attention backward's workspace in the arena (0: the backward runs without one).
  std::size_t attention_workspace_bytes() const;

 private:
  struct LayerActs;
  struct Scratch;
  ModelCompute(const DecoderGeometry& geo, std::int64_t max_tokens, kernels::Backend& backend);
  ~ModelCompute();
  friend struct std::default_delete<ModelCompute>;

  // The size table shared by create() and planned_bytes() (model_compute_buffers.h). acts gets
  // work_layers shared workspaces, then one per kept layer; workspace_of [L] maps layers to them.
  static void plan_buffers(const DecoderGeometry& geo, std::int64_t T, int work_layers,
                           const std::vector<bool>& kept, kernels::Backend& backend,
                           GemmPrecision precision, bool attn_ws, std::vector<LayerActs>& acts,
                           std::vector<int>& workspace_of, Scratch& s, detail::BufferTable& table,
                           std::size_t* activation_bytes, std::size_t* kept_bytes);
  // One layer workspace's buffers (moe / dense: the kinds of layer it serves; x_in only for the
  // whole-model path), named with `prefix`.
  // kept: a kept layer's (no act of its own).
  static void plan_workspace(const DecoderGeometry& geo, std::int64_t T, bool moe, bool dense,
                             bool kept, bool with_x_in, bool device, LayerActs& a,
                             detail::BufferTable& tab, const std::string& prefix);
  // The GEMM operand buffers of GemmPrecision::kBf16 (model_compute_linear.cpp).
  static void plan_linear_buffers(const DecoderGeometry& geo, std::int64_t T,
                                  kernels::Backend& backend, Scratch& s,
                                  detail::BufferTable& table);
  // The loss head's bf16 operands (hf16, head16 and their f32 twins), recast at every use.
  static void plan_head_operands(const DecoderGeometry& geo, std::int64_t T,
                                 kernels::Backend& backend, Scratch& s, detail::BufferTable& table);
  kernels::Stream& st() const { return *stream_; }
  // n elements at src (arena or caller memory on the buffer device) as a host pointer: src itself
  // for host buffers, else a D2H copy into `mirror` followed by a stream synchronize.
  template <typename T>
  Result<const T*> read_to_host(const T* src, std::vector<T>& mirror, std::int64_t n);
  // Sets n floats at p (arena memory) to +0.0: memset on the host, a copy from s.zeros on device.
  Status zero_fill(float* p, std::int64_t n);

  // Linear layers in the GemmPrecision (model_compute_linear.cpp).
  // A GEMM's input activation as the GEMMs read it: x the f32 activation [N, in], op x itself
  // (f32 GEMMs) or its bf16 rounding in gemm.x16 (gemm.x16_f widened on the CPU twin). Valid
  // until the next gemm_input / swiglu_into_gemm_input / rms_norm_into_gemm_input (they overwrite
  // gemm.x16), so a caller takes one and passes it to every GEMM that reads x before asking for
  // another.
  // op empty: x not rounded yet, each GEMM that reads it rounds it itself (the reuse off: the
  // path before it, kept for A/B).
  struct GemmInput {
    ConstTensorView x;
    ConstTensorView op;
  };
  Result<GemmInput> gemm_input(const ConstTensorView& x, bool f32_operands = false);
  // The GemmInput for several GEMMs reading x: gemm_input(x) with the reuse on, else {x, empty}.
  Result<GemmInput> shared_gemm_input(const ConstTensorView& x);
  // y = x w^T (+ bias), y f32 [N, out], x f32 [N, in], w [out, in]. f32_operands: multiply in
  // f32 whatever the precision (the MoE router, see model_compute_linear.cpp).
  Status linear(const TensorView& y, const ConstTensorView& x, const ConstTensorView& w,
                const ConstTensorView& bias = {}, bool f32_operands = false);
  // The same over a GemmInput (rounded by gemm_input with the same f32_operands, or op empty).
  Status linear(const TensorView& y, const GemmInput& x, const ConstTensorView& w,
                const ConstTensorView& bias = {}, bool f32_operands = false);
  // Backward of y = x w^T + b given dy: dw += dy^T x; db += 1^T dy (f32, exact operands);
  // dx = dy w (dx += dy w when accumulate_dx). dx may be empty.
  Status linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const ConstTensorView& dy, const ConstTensorView& x,
                         const ConstTensorView& w, bool accumulate_dx, bool f32_operands = false);
  Status linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& db,
                         const ConstTensorView& dy, const GemmInput& x, const ConstTensorView& w,
                         bool accumulate_dx, bool f32_operands = false);
  // out [N, F] = swiglu(gate, up), returned as the down projection's GemmInput. With the reuse on
  // and bf16 GEMMs the kernel writes the bf16 copy into gemm.x16 itself; otherwise a plain swiglu
  // and gemm_input(out).
  Result<GemmInput> swiglu_into_gemm_input(const TensorView& out, const ConstTensorView& gate,
                                           const ConstTensorView& up);
  // args.out [N, C] (f32) = rms_norm(args.in) and, with the reuse on, the GemmInput of the GEMMs
  // that read it: with bf16 GEMMs the norm kernel writes the bf16 copy into gemm.x16 itself
  // (RmsNormArgs::out16; args.out16 must be empty). With the reuse off a plain rms_norm and
  // {out, empty} (the GEMMs then round out themselves, the old path).
  Result<GemmInput> rms_norm_into_gemm_input(const kernels::RmsNormArgs& args);
  // The down projection's input of layer l as its forward left it in gemm.x16 (act [T, F] of
  // workspace a), when that copy is still there (act16_layer_ below); else {act, empty}.
  GemmInput reusable_act16(int l, const LayerActs& a, const ConstTensorView& act);
  // The view a GEMM reads for v in the GemmPrecision: v itself (kF32, or v already bf16 on a
  // bf16 backend); else v rounded to bf16 in `b16` (a bf16 view on a bf16-GEMM backend, or
  // widened back into `f32` on the CPU twin).
  Result<ConstTensorView> gemm_operand(const ConstTensorView& v,
                                       const detail::DevBuf<std::uint16_t>& b16,
                                       const detail::DevBuf<float>& f32, bool f32_operands = false);

  // The internal steps work on one layer's workspace `a`; x_in/x_out are [T*C] f32. x_out null:
  // the internals only (layer_forward_internals: no down projection / combine, no residual add).
  Status run_layer_forward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                           std::int64_t T, const PackedBatch& batch, const float* x_in,
                           float* x_out);
  Status run_layer_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                            const LayerTensors<TensorView>& g, std::int64_t T,
                            const PackedBatch& batch, const float* x_in);
  // h1_in: h1 as rms_norm_into_gemm_input returned it (nullopt: the old path).
  Status attention_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p, std::int64_t T,
                           const PackedBatch& batch, const float* x_in, const GemmInput& h1_in);
  Status attention_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                            const LayerTensors<TensorView>& g, std::int64_t T,
                            const PackedBatch& batch);
  // The attention backward's workspace for these arguments: the first workspace_bytes(args)
  // bytes of the planned buffer, or an empty view when none was planned.
  TensorView attention_workspace(const kernels::AttentionBackwardArgs& args) const;
  // h2_in: h2 as rms_norm_into_gemm_input returned it.
  // with_output false: up to act (the down projection, whose output only the residual reads, is
  // skipped); likewise moe_forward skips the combine.
  Status mlp_forward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p, std::int64_t T,
                     const GemmInput& h2_in, bool with_output);
  Status mlp_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                      const LayerTensors<TensorView>& g, std::int64_t T);
  Status moe_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p, std::int64_t T,
                     bool with_output);
  Status moe_backward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                      const LayerTensors<TensorView>& g, std::int64_t T);
  Status check_layer_call(int l, const PackedBatch& batch, const ConstTensorView& x) const;
  Result<ForwardResult> run_head_forward(const ConstTensorView& lm_head, const PackedBatch& batch,
                                         TensorView nll_out);
  Status run_head_backward(const ConstTensorView& final_norm, const ConstTensorView& lm_head,
                           const TensorView& d_final_norm, const TensorView& d_lm_head,
                           const PackedBatch& batch, const float* x_final);
  Status run_embed_backward(const TensorView& d_table, const PackedBatch& batch);

  DecoderGeometry geo_;
  std::int64_t max_tokens_;
  kernels::Backend& be_;
  kernels::Stream* stream_ = nullptr;
  Device dev_ = Device::kCpu;
  bool attn_bf16_ = false;
  GemmPrecision precision_ = GemmPrecision::kF32;
  bool native_bf16_gemm_ = false;              // the backend multiplies bf16 operands itself
  std::uint64_t gemm_weight_converts_ = 0;     // gemm_weight_converts()
  std::unique_ptr<mem::MemoryBudget> budget_;  // unlimited; outlives arena_ (declared first)
  std::unique_ptr<mem::Arena> arena_;
  std::unique_ptr<mem::TransferEngine> own_te_;  // the CUDA engine (device arenas)
  mem::TransferEngine* te_ = nullptr;            // own_te_ or host_transfer_engine()
  std::size_t activation_bytes_ = 0;
  std::size_t kept_bytes_ = 0;
  int work_layers_ = 0;            // shared workspaces: acts_[0, work_layers_)
  int kept_count_ = 0;             // dedicated workspaces: acts_[work_layers_, +kept_count_)
  std::vector<LayerActs> acts_;    // shared workspaces, then one per kept layer
  std::vector<int> workspace_of_;  // [L] index into acts_
  std::unique_ptr<Scratch> scratch_;
  std::int64_t last_T_ = 0;
  std::int64_t last_counted_ = 0;
  // bf16 attention: the layer (and T) whose q/k/v/out the shared bf16 buffers (q16, k16, v16,
  // o16) hold, -1 when unknown. The backward of that layer reads them as they are instead of
  // recasting its f32 activations (the same bits: the rounding is deterministic and attn holds
  // o16 widened exactly); any other layer's backward recasts.
  int attn16_layer_ = -1;
  std::int64_t attn16_tokens_ = 0;
  // ...and whose activations they came from: a backward of the same layer and T over other
  // activations (a caller's saved ones, another micro-batch's) recasts too. A kept layer's
  // backward normally follows other layers' forwards (which reset the key before writing), so it
  // recasts from its kept f32 internals; it reuses the copies only when its own forward was the
  // last writer (e.g. the top layer, whose forward is followed only by the loss).
  const LayerActs* attn16_acts_ = nullptr;
  // GEMM input reuse (gemm_input_reuse_default()).
  bool gemm_input_reuse_ = true;
  std::uint64_t gemm_input_converts_ = 0;  // gemm_input_converts()
  // The layer whose dense SwiGLU output's bf16 copy gemm.x16 (and x16_f on the CPU twin) holds,
  // -1 when none: set by mlp_forward right after swiglu_into_gemm_input, cleared by every other
  // write to those buffers (gemm_input, swiglu_into_gemm_input) and by set_gemm_input_reuse. The
  // backward of that layer over the same workspace and shape reads the copy instead of
  // rounding act again (the same bits: act is not written between the two, and the rounding is
  // deterministic).
  int act16_layer_ = -1;
  const LayerActs* act16_acts_ = nullptr;
  std::int64_t act16_shape_[2] = {0, 0};  // [T, F]
  // Whose SwiGLU output each shared workspace's f32 act buffer holds: [work_layers], indexed by
  // l % work_layers (the buffer layer l's act is, kept or not): the layer, the workspace whose
  // gate/up it came from and T. Set by every write to it (mlp_forward, mlp_backward's recompute);
  // mlp_backward recomputes act when the entry is not (l, its workspace, T).
  struct ActHolder {
    int layer = -1;
    const LayerActs* acts = nullptr;
    std::int64_t tokens = 0;
    bool operator==(const ActHolder&) const = default;
  };
  std::vector<ActHolder> act_holder_;
  std::uint64_t swiglu_recomputes_ = 0;   // swiglu_recomputes()
  std::uint64_t internals_forwards_ = 0;  // internals_forwards()
};

}  // namespace ferry::model
