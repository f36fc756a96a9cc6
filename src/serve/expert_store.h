// SPDX-License-Identifier: Apache-2.0
// ExpertStore: the host copy of every routed expert, each (gate, up, down) packed into ONE
// contiguous block so a miss is one copy (one DMA on a GPU):
//   block(l, e) = [gate F*C | up F*C | down C*F] in dtype(), blocks of a layer back to back.
// dtype: f32 (the CPU engine's), or bf16 (the CUDA engine's PagerConfig::expert_dtype: half the
// host bytes, slot bytes and PCIe bytes per miss; converted once here, round to nearest even).
// Lives in the pinned host tier (plain mmap'd pages in CPU builds), charged to its own unlimited
// host budget. Immutable after create() / create_filled(); safe to read from any thread.
// create_filled() writes the blocks itself (no model views needed), in parallel: how bench serve's
// 48-layer geometry gets its bf16 experts without ever holding them in f32 (builtin_model.h
// make_builtin_moe_packed; tests/unit/serve/packed_builtin_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/result.h"
#include "mem/buffer.h"
#include "model/model_compute.h"
#include "serve/expert_ffn.h"

namespace ferry::serve {

class ExpertStore {
 public:
  // Copies the experts of every MoE layer out of `params` (f32 or bf16 host views), converted to
  // `dtype` (kF32 or kBF16).
  static Result<std::unique_ptr<ExpertStore>> create(const model::DecoderGeometry& geo,
                                                     const model::ModelParams& params,
                                                     DType dtype = DType::kF32);

  // A block's contents: fill(layer, expert, block) writes expert_bytes() bytes in the layout above.
  // Called once per block of every MoE layer, concurrently for different blocks; what it writes
  // must depend on (layer, expert) only, so the store's bytes do not depend on `threads`.
  using BlockFill = std::function<void(int layer, int expert, std::byte* block)>;
  // Allocates the store for `geo` and fills every block with `fill` on `threads` threads (the
  // calling thread among them; 0: std::thread::hardware_concurrency()).
  static Result<std::unique_ptr<ExpertStore>> create_filled(const model::DecoderGeometry& geo,
                                                            DType dtype, const BlockFill& fill,
                                                            int threads = 0);

  DType dtype() const { return dtype_; }
  std::size_t expert_elements() const { return 3 * std::size_t(F_) * std::size_t(C_); }
  std::size_t expert_bytes() const { return expert_elements() * dtype_size(dtype_); }
  int experts() const { return E_; }
  int hidden() const { return C_; }
  int width() const { return F_; }
  bool has_layer(int layer) const { return layer_base_[layer] >= 0; }
  int moe_layers() const { return moe_layers_; }
  int layers() const { return static_cast<int>(layer_base_.size()); }
  std::size_t bytes() const { return buffer_.size(); }

  // The packed block of expert e in layer l (a bug if l is dense).
  const std::byte* block(int layer, int expert) const;
  // Views of gate/up/down inside any block with this store's layout (host block or device slot).
  ExpertRef ref_in(const void* block) const;
  ExpertRef ref(int layer, int expert) const { return ref_in(block(layer, expert)); }

 private:
  ExpertStore() : budget_(mem::MemTier::kPinnedHost) {}
  // The layout and the (uninitialised) buffer for `geo`.
  static Result<std::unique_ptr<ExpertStore>> allocate(const model::DecoderGeometry& geo,
                                                       DType dtype);
  int C_ = 0, F_ = 0, E_ = 0, moe_layers_ = 0;
  DType dtype_ = DType::kF32;
  std::vector<std::int64_t> layer_base_;  // [L] first block index of the layer, -1 dense
  mem::MemoryBudget budget_;
  mem::Buffer buffer_;
};

}  // namespace ferry::serve
