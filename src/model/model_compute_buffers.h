// SPDX-License-Identifier: Apache-2.0
// Internal to model_compute*.cpp: the activation buffers ModelCompute plans at construction
// (llm.c's "size table, then one allocation": BufferTable names every buffer, create() lays them
// out in one mem::Arena and planned_bytes() runs the same table without allocating, so the two
// agree by construction) and small view helpers. The arena is pageable host memory for CPU
// backends and device memory (MemTier::kDevice) for CUDA backends; DevBuf records which, so every
// view ModelCompute hands a kernel carries the right Device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mem/arena.h"
#include "model/model_compute.h"

namespace ferry::model::detail {

// Tokens per logits chunk of the fused lm_head + cross-entropy (forward and backward must agree,
// since the workspace is sized for it). On the CPU 128 rows (they stay in cache). On a GPU every
// chunk's lm_head gradient GEMM reads and writes the whole f32 [V, C] gradient, so short chunks
// leave the backward memory-bound: at V = 151936, C = 2048, 128-row chunks move ~2.5 GB per 128
// tokens, and the loss window took 1.05 s of a 5.09 s Qwen2.5-3B step at batch 64 (H200,
// 2026-12-01, all-on-GPU policy). There chunks grow to 1024 rows while the chunk's f32 logits and
// bf16 d_logits (6 bytes per logit) stay within 1 GiB.
inline int ce_chunk_tokens(std::int64_t vocab, Device device) {
  constexpr int kCpuChunk = 128, kGpuChunk = 1024;
  constexpr std::int64_t kGpuChunkBytes = std::int64_t{1} << 30;
  if (device == Device::kCpu) return kCpuChunk;
  int chunk = kGpuChunk;
  while (chunk > kCpuChunk && chunk * vocab * 6 > kGpuChunkBytes) chunk /= 2;
  return chunk;
}

// n elements of T inside ModelCompute's arena (host or device memory, see `device`). Empty when
// the geometry does not need it (n == 0, data() == nullptr).
template <typename T>
struct DevBuf {
  T* ptr = nullptr;
  std::int64_t n = 0;
  Device device = Device::kCpu;
  T* data() const { return ptr; }
  std::int64_t size() const { return n; }
};
using F32Buf = DevBuf<float>;
using I32Buf = DevBuf<std::int32_t>;
using Bf16Buf = DevBuf<std::uint16_t>;

// The size table. add() records a buffer (name, element count); bind() points every recorded
// buffer into an arena made from plan().
//
// Overlays: buffers whose lifetimes never overlap may share bytes. Between begin_overlay(name)
// and end_overlay(), every next_alternative() starts a new set laid out again from the region's
// start (each buffer 256-byte aligned within it), and the region, one arena slot, is as large as
// the largest set. begin_overlay(name, false) makes the three calls no-ops: every buffer then gets
// its own slot (the layout's twin). The caller guarantees that no buffer of one set is read after a
// buffer of another set was written (model_compute.cpp says why that holds for its sets).
class BufferTable {
 public:
  template <typename T>
  void add(DevBuf<T>& b, std::string name, std::int64_t n) {
    if (n <= 0) return;
    b.n = n;
    auto bind = [&b](std::byte* p, Device d) {
      b.ptr = reinterpret_cast<T*>(p);
      b.device = d;
    };
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    if (in_overlay_) {
      const std::size_t offset = mem::detail::align_up(set_bytes_, mem::detail::kMinAlignBytes);
      overlay_.push_back({offset, std::move(bind)});
      set_bytes_ = offset + bytes;
      overlay_bytes_ = std::max(overlay_bytes_, set_bytes_);
      return;
    }
    entries_.push_back({plan_.add(name, bytes), 0, std::move(bind)});
  }
  void begin_overlay(std::string name, bool enabled = true) {
    FERRY_CHECK(!in_overlay_, "model: overlay {} opened inside overlay {}", name, overlay_name_);
    if (!enabled) return;
    in_overlay_ = true;
    overlay_name_ = std::move(name);
    overlay_.clear();
    set_bytes_ = overlay_bytes_ = 0;
  }
  void next_alternative() { set_bytes_ = 0; }
  void end_overlay() {
    if (!in_overlay_) return;  // begin_overlay(name, false)
    in_overlay_ = false;
    if (overlay_bytes_ == 0) return;  // every set empty: no slot
    const mem::SlotId slot = plan_.add(overlay_name_, overlay_bytes_);
    for (Member& m : overlay_) entries_.push_back({slot, m.offset, std::move(m.bind)});
    overlay_.clear();
  }
  const mem::ArenaPlan& plan() const { return plan_; }
  void bind(mem::Arena& arena, Device device) {
    FERRY_CHECK(!in_overlay_, "model: overlay {} not closed", overlay_name_);
    for (const Entry& e : entries_) e.bind(arena.data(e.slot) + e.offset, device);
  }

 private:
  using Binder = std::function<void(std::byte*, Device)>;
  struct Entry {
    mem::SlotId slot;
    std::size_t offset = 0;  // within the slot (overlay members)
    Binder bind;
  };
  struct Member {
    std::size_t offset = 0;
    Binder bind;
  };
  mem::ArenaPlan plan_;
  std::vector<Entry> entries_;
  bool in_overlay_ = false;
  std::string overlay_name_;
  std::vector<Member> overlay_;
  std::size_t set_bytes_ = 0, overlay_bytes_ = 0;
};

template <typename T>
TensorView typed_view(const DevBuf<T>& b, DType dt, std::initializer_list<std::int64_t> dims) {
  TensorView v = TensorView::contiguous(b.ptr, dt, b.device, dims);
  FERRY_CHECK(v.numel() <= b.n, "model: view {} larger than its buffer ({} elements)",
              v.shape_string(), b.n);
  return v;
}
inline TensorView f32_view(const F32Buf& b, std::initializer_list<std::int64_t> dims) {
  return typed_view(b, DType::kF32, dims);
}
inline TensorView i32_view(const I32Buf& b, std::initializer_list<std::int64_t> dims) {
  return typed_view(b, DType::kI32, dims);
}
inline TensorView bf16_view(const Bf16Buf& b, std::initializer_list<std::int64_t> dims) {
  return typed_view(b, DType::kBF16, dims);
}

// Rows [r0, r1) of a row-major 2-D view.
inline TensorView rows_of(const TensorView& v, std::int64_t r0, std::int64_t r1) {
  TensorView out = v;
  out.data = static_cast<std::byte*>(v.data) + r0 * v.stride[0] * std::int64_t(dtype_size(v.dtype));
  out.shape[0] = r1 - r0;
  return out;
}
inline ConstTensorView rows_of(const ConstTensorView& v, std::int64_t r0, std::int64_t r1) {
  ConstTensorView out = v;
  out.data =
      static_cast<const std::byte*>(v.data) + r0 * v.stride[0] * std::int64_t(dtype_size(v.dtype));
  out.shape[0] = r1 - r0;
  return out;
}

// Reinterprets a contiguous view with new dims (same element count).
template <typename View>
View reshaped(const View& v, std::initializer_list<std::int64_t> dims) {
  View out = View::contiguous(v.data, v.dtype, v.device, dims);
  FERRY_CHECK(out.numel() == v.numel(), "model: reshape {} -> {} changes size", v.shape_string(),
              out.shape_string());
  return out;
}

}  // namespace ferry::model::detail

namespace ferry::model {

using detail::Bf16Buf;
using detail::F32Buf;
using detail::I32Buf;

struct ModelCompute::LayerActs {
  F32Buf x_in;           // [T, C] residual stream entering the layer
  F32Buf h1;             // [T, C] attn_norm output
  F32Buf rstd1;          // [T]
  F32Buf q_pre;          // [T, H*D] projection output before q/k norm (when normed)
  F32Buf k_pre;          // [T, G*D]
  F32Buf q_rstd;         // [T*H] or [T]
  F32Buf k_rstd;         // [T*G] or [T]
  F32Buf q, k, v;        // [T, H*D], [T, G*D], [T, G*D] after norm + rope
  F32Buf attn;           // [T, H*D]
  F32Buf lse;            // [H, T]
  F32Buf x_mid;          // [T, C] after the attention residual
  F32Buf h2;             // [T, C] mlp_norm output
  F32Buf rstd2;          // [T]
  F32Buf gate, up, act;  // dense MLP: [T, F]
  // (act: a kept layer's workspace has none of its own; create() points it at the shared
  // workspace l % work_layers' act, which later dense layers' forwards overwrite, so the kept
  // layer's backward recomputes act = swiglu(gate, up) when it is no longer there:
  // ModelCompute::act_holder_, swiglu_recomputes().)
  // MoE
  F32Buf router_logits, probs;  // [T, E]
  F32Buf weights;               // [T, K]
  I32Buf ids, slot_of;          // [T, K]
  I32Buf offsets;               // [E + 1]
  F32Buf gathered;              // [T*K, C]
  F32Buf egate, eup, eact;      // [T*K, Fe]
  F32Buf eout;                  // [T*K, C]
  // Host copy of `offsets` (the per-expert GEMMs need the row ranges on the host), read back
  // after dispatch when the arena is device memory; host memory, not part of the arena.
  std::vector<std::int32_t> h_offsets;  // [E + 1]
};

struct ModelCompute::Scratch {
  F32Buf x_final, hf, rstd_f;                 // [T, C], [T, C], [T]
  F32Buf nll;                                 // [T]
  detail::DevBuf<std::uint8_t> ce_workspace;  // [workspace_bytes] u8
  // The attention backward's optional workspace (AttnBwdWorkspace, model_compute.h), for the
  // largest T; empty when off or when the backend asks for none.
  detail::DevBuf<std::uint8_t> attn_workspace;  // [workspace_bytes(AttentionBackwardArgs)] u8
  F32Buf ones;                                  // [T] of 1.0 (bias gradients as a GEMM)
  F32Buf inv_freq;                              // [R/2] rope frequencies (geo.rope.inv_freq)
  F32Buf zeros;                   // device only: [T*C] (MoE) or [C] (padding row) of 0.0
  F32Buf tmp_c;                   // [T, C]
  F32Buf dx, dx_mid, dh;          // [T, C]
  F32Buf dq, dk, dv;              // [T, H*D], [T, G*D], [T, G*D]
  F32Buf dq_pre, dk_pre;          // same
  F32Buf d_attn;                  // [T, H*D]
  F32Buf d_act, d_gate, d_up;     // [T, F]
  F32Buf d_eout, d_gathered;      // [T*K, C]
  F32Buf d_eact, d_egate, d_eup;  // [T*K, Fe]
  F32Buf d_weights;               // [T, K]
  F32Buf d_router_logits;         // [T, E]
  // bf16 attention (backends without f32 attention): q/k/v/out and the backward's dO, dQ, dK,
  // dV, shared by all layers. The backward of the layer last forwarded reads the forward's
  // q/k/v/out as they are; any other layer's recasts its f32 activations into them
  // (ModelCompute::attn16_layer_).
  Bf16Buf q16, k16, v16, o16;      // [T, H*D], [T, G*D], [T, G*D], [T, H*D]
  Bf16Buf do16, dq16, dk16, dv16;  // same
  // GemmPrecision::kBf16 operands (model_compute_linear.cpp): a GEMM's activation operand (x),
  // its output gradient (dy), its weight (w), and the loss's hidden rows and lm_head (hf16,
  // head16). The *_f buffers hold the same values widened to f32, only on a backend without bf16
  // GEMMs (the CPU twin).
  Bf16Buf x16, dy16, w16, hf16, head16;
  F32Buf x16_f, dy16_f, w16_f, hf16_f, head16_f;
  // Host copies of what the host reads when the arena is device memory.
  std::vector<float> h_nll;            // [T]
  std::vector<std::int32_t> h_ids;     // [T]
  std::vector<std::int32_t> h_target;  // [T]
};

}  // namespace ferry::model
