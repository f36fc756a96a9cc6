// SPDX-License-Identifier: Apache-2.0
// CPU build: the device tier is EMULATED with aligned host memory (so device buffers are directly
// addressable by host code and the CPU transfer engine's memcpy), and the pinned tier is plain
// mmap'd pages (there is no driver to page-lock for). Same API and the same budget checks as the
// CUDA build, so pagers and executors run unchanged in CI.
#include "mem/tier_alloc.h"

namespace ferry::mem::detail {

Result<std::byte*> device_alloc(std::size_t bytes, int device, std::string_view what) {
  if (device != 0) {
    return invalid_argument("mem: emulated device tier has only device 0, not {} (for {})", device,
                            what);
  }
  return pageable_alloc(bytes, what);
}

void device_free(std::byte* p, std::size_t /*bytes*/, int /*device*/) { pageable_free(p); }

bool device_tier_emulated() { return true; }

Result<std::byte*> pinned_alloc(std::size_t bytes, PinnedMode /*mode*/, bool /*write_combined*/,
                                std::string_view what) {
  return map_pages(bytes, "pinned-host", what);
}

void pinned_free(std::byte* p, std::size_t bytes, PinnedMode /*mode*/) { unmap_pages(p, bytes); }

}  // namespace ferry::mem::detail
