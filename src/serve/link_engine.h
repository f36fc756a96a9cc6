// SPDX-License-Identifier: Apache-2.0
// LinkEngine: the CUDA serving engine's transfer engine — the CUDA transfer engine behind a thin
// layer that (1) counts every copy in its own counters, including the copies a replayed CUDA
// graph makes without calling copy() (count_replayed: model_runner_cuda.cpp adds each replay's
// captured bytes), and (2) paces one stream's host->device copies to a link rate (link pacing:
// `ferry bench serve --device cuda --link-gbps G`, EngineConfig::link_pace_gbps).
// Pacing: a host->device copy on the paced stream (the engine's copy stream: pager misses and
// static's bulk layer copies) is split into chunks of at most chunk_bytes, bracketed on that
// stream by the link_pace kernels (kernels/cuda/serve_link_pace.cu): a timer mark before the
// first chunk and, after each chunk, a wait until mark + link_pace_ns(chunk). The stream is
// in-order, so no chunk completes, and nothing queued after it starts, sooner than its bytes /
// rate after it could begin: the copy stream moves at most `gbps` GB/s whatever the real link
// does (it cannot make the link faster). Copies on other streams (step inputs, pointer tables,
// row lists: bytes per step, not per expert) are not paced. Pacing needs a CUDA stream.
// Memory: pacing holds one 256 B device buffer (the timer mark), outside the engine's budget.
// Thread-safety: as the CUDA transfer engine (copies from one thread per stream); the mark is
// used by the paced stream only. Tests: tests/unit/serve/link_engine_test.cpp (counting, chunks,
// refusals), tests/gpu/serve_gpu_test.cpp ServeLinkPace.* (measured rate <= the paced rate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/result.h"
#include "mem/budget.h"
#include "mem/buffer.h"
#include "mem/transfer_engine.h"

namespace ferry::serve {

// ceil(bytes / (gbps * 1e9) s) in ns: a paced chunk never takes less than its bytes at the rate.
std::uint64_t link_pace_ns(std::size_t bytes, double gbps);

struct LinkPace {
  double gbps = 0;                        // <= 0: off
  std::size_t chunk_bytes = 16ull << 20;  // paced chunk (> 0)
  mem::Stream* stream = nullptr;          // the paced stream (a CUDA stream); required when on
};

struct LinkPaceStats {
  std::uint64_t copies = 0, chunks = 0, bytes = 0;  // paced host->device copies
};

class LinkEngine final : public mem::TransferEngine {
 public:
  // inner: the engine copies go through (owned). invalid_argument: pacing with a rate that is not
  // finite, a zero chunk or no CUDA stream.
  static Result<std::unique_ptr<LinkEngine>> create(std::unique_ptr<mem::TransferEngine> inner,
                                                    const LinkPace& pace = {});
  Device device() const override { return inner_->device(); }
  Status copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
              mem::Stream& stream) override;
  Status zero(void* dst, std::size_t bytes, mem::Stream& stream) override {
    return inner_->zero(dst, bytes, stream);
  }
  // A replayed graph moved `bytes` of `kind` (captured copies are not calls of copy()).
  void count_replayed(mem::CopyKind kind, std::size_t bytes) { count(kind, bytes); }
  bool paced() const { return pace_.gbps > 0; }
  const LinkPace& pace() const { return pace_; }
  const LinkPaceStats& pace_stats() const { return stats_; }

 private:
  explicit LinkEngine(std::unique_ptr<mem::TransferEngine> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<mem::TransferEngine> inner_;
  LinkPace pace_;
  LinkPaceStats stats_;
  mem::MemoryBudget mark_budget_{mem::MemTier::kDevice};
  mem::Buffer mark_;  // [1] u64: the pacing kernels' timer mark (device)
};

}  // namespace ferry::serve
