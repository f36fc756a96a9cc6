// SPDX-License-Identifier: Apache-2.0
// The mem GPU tests' fixture: a CUDA stream set and transfer engine (skips without a CUDA
// device), and the pattern kernel's mismatch count of device bytes read back to the host.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include <gtest/gtest.h>

#include "core/check.h"
#include "mem/buffer.h"
#include "mem/device_info.h"
#include "mem/device_pattern.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"

namespace ferry::mem::testing {

class MemGpuFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaInfo info = query_cuda_info();
    if (!info.compiled || info.devices.empty()) GTEST_SKIP() << "no CUDA device";
    auto ss = StreamSet::create(Device::kCuda, 0);
    ASSERT_TRUE(ss.ok()) << ss.status().to_string();
    ss_ = std::make_unique<StreamSet>(std::move(ss).value());
    auto te = cuda_transfer_engine(0);
    ASSERT_TRUE(te.ok()) << te.status().to_string();
    te_ = std::move(te).value();
  }

  // Verifies `bytes` of device memory against pattern `seed` with the kernel; returns mismatches.
  std::uint64_t device_mismatches(const std::byte* d, std::size_t bytes, std::uint32_t seed) {
    MemoryBudget dev(MemTier::kDevice), pin(MemTier::kPinnedHost);
    auto d_count = Buffer::allocate(MemTier::kDevice, sizeof(std::uint64_t), dev);
    auto h_count = Buffer::allocate(MemTier::kPinnedHost, sizeof(std::uint64_t), pin);
    FERRY_CHECK_OK(d_count.status());
    FERRY_CHECK_OK(h_count.status());
    auto* dc = reinterpret_cast<std::uint64_t*>(d_count->data());
    FERRY_CHECK_OK(count_pattern_mismatches(d, bytes, seed, dc, ss_->compute()));
    FERRY_CHECK_OK(te_->d2h(h_count->data(), dc, sizeof(std::uint64_t), ss_->compute()));
    FERRY_CHECK_OK(ss_->compute().synchronize());
    std::uint64_t n = 0;
    std::memcpy(&n, h_count->data(), sizeof n);
    return n;
  }

  std::unique_ptr<StreamSet> ss_;
  std::unique_ptr<TransferEngine> te_;
};

}  // namespace ferry::mem::testing
