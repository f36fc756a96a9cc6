// SPDX-License-Identifier: Apache-2.0
#include "serve/link_engine.h"

#include <algorithm>
#include <cmath>

#include "serve/device_ops.h"

namespace ferry::serve {

std::uint64_t link_pace_ns(std::size_t bytes, double gbps) {
  // bytes / (gbps * 1e9) s = bytes / gbps ns, rounded up.
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(bytes) / gbps));
}

Result<std::unique_ptr<LinkEngine>> LinkEngine::create(std::unique_ptr<mem::TransferEngine> inner,
                                                       const LinkPace& pace) {
  if (inner == nullptr) return invalid_argument("serve: link engine without a transfer engine");
  std::unique_ptr<LinkEngine> e(new LinkEngine(std::move(inner)));
  if (pace.gbps > 0 || std::isnan(pace.gbps)) {
    if (!std::isfinite(pace.gbps)) {
      return invalid_argument("serve: link pacing rate {} GB/s is not a finite number", pace.gbps);
    }
    if (pace.chunk_bytes == 0) return invalid_argument("serve: link pacing chunk of 0 bytes");
    if (pace.stream == nullptr || pace.stream->device() != Device::kCuda ||
        e->inner_->device() != Device::kCuda) {
      return invalid_argument(
          "serve: link pacing paces a CUDA copy stream (the CPU engine's emulated link is paced "
          "by mem::set_host_link_rate: bench serve --link-gbps without --device cuda)");
    }
    FERRY_ASSIGN_OR_RETURN(e->mark_,
                           mem::Buffer::allocate(mem::MemTier::kDevice, 256, e->mark_budget_,
                                                 {.what = "link pacing mark"}));
    e->pace_ = pace;
  }
  return e;
}

Status LinkEngine::copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
                        mem::Stream& stream) {
  const bool pace = pace_.gbps > 0 && kind == mem::CopyKind::kHostToDevice && bytes > 0 &&
                    stream.native() == pace_.stream->native();
  if (!pace) {
    FERRY_TRY(inner_->copy(dst, src, bytes, kind, stream));
    count(kind, bytes);
    return ok_status();
  }
  auto* mark = reinterpret_cast<unsigned long long*>(mark_.data());
  FERRY_TRY(device::link_pace_mark(mark, stream));
  for (std::size_t at = 0; at < bytes; at += pace_.chunk_bytes) {
    const std::size_t n = std::min(pace_.chunk_bytes, bytes - at);
    FERRY_TRY(inner_->copy(static_cast<std::byte*>(dst) + at,
                           static_cast<const std::byte*>(src) + at, n, kind, stream));
    FERRY_TRY(device::link_pace_wait(mark, link_pace_ns(n, pace_.gbps), stream));
    ++stats_.chunks;
  }
  ++stats_.copies;
  stats_.bytes += bytes;
  count(kind, bytes);
  return ok_status();
}

}  // namespace ferry::serve
