// SPDX-License-Identifier: Apache-2.0
// The CPU transfer engine, host events and the host StreamSet: copies land at once, events are
// complete after record, byte counters add up, host <-> NVMe goes through tickets, and a build
// without CUDA reports CUDA engines/events as unavailable instead of crashing.
#include "mem/transfer_engine.h"

#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "mem/buffer.h"
#include "mem/event.h"
#include "mem/stream_set.h"

namespace ferry::mem {
namespace {

TEST(HostTransferEngine, CopiesThroughTheEmulatedDeviceTierWithCompleteEvents) {
  if (!detail::device_tier_emulated()) {
    GTEST_SKIP() << "CUDA build: the GPU test covers real device memory";
  }
  MemoryBudget dev(MemTier::kDevice), pin(MemTier::kPinnedHost);
  auto d = Buffer::allocate(MemTier::kDevice, 4096, dev);
  auto h_in = Buffer::allocate(MemTier::kPinnedHost, 4096, pin);
  auto h_out = Buffer::allocate(MemTier::kPinnedHost, 4096, pin);
  ASSERT_TRUE(d.ok() && h_in.ok() && h_out.ok());
  EXPECT_TRUE(d->emulated());
  for (int i = 0; i < 4096; ++i) h_in->data()[i] = static_cast<std::byte>(i * 7);

  auto ss = StreamSet::create(Device::kCpu);
  ASSERT_TRUE(ss.ok());
  TransferEngine& te = host_transfer_engine();
  const auto h2d0 = te.counters().h2d_bytes.load(), d2h0 = te.counters().d2h_bytes.load();
  auto ev = Event::create(Device::kCpu);
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(te.h2d(d->data(), h_in->data(), 4096, ss->h2d()).ok());
  ASSERT_TRUE(ev->record(ss->h2d()).ok());
  ASSERT_TRUE(ss->compute().wait(*ev).ok());
  EXPECT_TRUE(*ev->query());
  ASSERT_TRUE(ss->order(ss->compute(), ss->d2h()).ok());
  ASSERT_TRUE(te.d2h(h_out->data(), d->data(), 4096, ss->d2h()).ok());
  ASSERT_TRUE(ss->synchronize().ok());
  EXPECT_EQ(std::memcmp(h_in->data(), h_out->data(), 4096), 0);
  EXPECT_EQ(te.counters().h2d_bytes.load() - h2d0, 4096u);
  EXPECT_EQ(te.counters().d2h_bytes.load() - d2h0, 4096u);
}

TEST(HostTransferEngine, DeviceToDeviceAndZeroBytes) {
  std::vector<int> a(100), b(100, -1);
  std::iota(a.begin(), a.end(), 0);
  TransferEngine& te = host_transfer_engine();
  ASSERT_TRUE(te.d2d(b.data(), a.data(), 50 * sizeof(int), Stream::host()).ok());
  EXPECT_EQ(b[49], 49);
  EXPECT_EQ(b[50], -1);
  ASSERT_TRUE(te.h2d(nullptr, nullptr, 0, Stream::host()).ok());
}

TEST(HostTransferEngine, HostToNvmeAndBackThroughTickets) {
  const std::string dir = fmt::format("/tmp/ferry_te_test.{}", ::getpid());
  MemoryBudget nvme(MemTier::kNvme), pin(MemTier::kPinnedHost);
  auto store = NvmeStore::open({.dir = dir, .record_bytes = 8192, .capacity_records = 2}, nvme);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto src = Buffer::allocate(MemTier::kPinnedHost, 8192, pin);
  auto dst = Buffer::allocate(MemTier::kPinnedHost, 8192, pin);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (int i = 0; i < 8192; ++i) src->data()[i] = static_cast<std::byte>(i ^ 0x5a);
  TransferEngine& te = host_transfer_engine();
  const RecordId id = *(*store)->allocate();
  auto w = te.host_to_nvme(**store, id, src->data());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(te.nvme_wait(**store, *w).ok());
  auto r = te.nvme_to_host(**store, id, dst->data());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(te.nvme_wait(**store, *r).ok());
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 8192), 0);
  std::filesystem::remove_all(dir);
}

TEST(HostEvents, UnrecordedIsCompleteAndMovesKeepState) {
  Event e;
  EXPECT_TRUE(*e.query());
  EXPECT_TRUE(e.synchronize().ok());
  Event moved = std::move(e);
  EXPECT_EQ(moved.device(), Device::kCpu);
  EXPECT_TRUE(Stream::host().wait(moved).ok());
  EXPECT_TRUE(Stream::host().synchronize().ok());
}

TEST(StreamSet, ReferencesSurviveMoves) {
  auto r = StreamSet::create(Device::kCpu);
  ASSERT_TRUE(r.ok());
  StreamSet a = std::move(r).value();
  Stream* h2d = &a.h2d();
  StreamSet b = std::move(a);
  EXPECT_EQ(&b.h2d(), h2d);
  EXPECT_EQ(b.h2d().device(), Device::kCpu);
}

TEST(CudaPieces, UnavailableWithoutCudaOrDevice) {
  auto te = cuda_transfer_engine(0);
  auto ev = Event::create(Device::kCuda, 0);
  auto ss = StreamSet::create(Device::kCuda, 0);
#ifdef FERRY_HAVE_CUDA
  if (te.ok()) GTEST_SKIP() << "a CUDA device is present: covered by gpu_test";
#endif
  ASSERT_FALSE(te.ok());
  EXPECT_EQ(te.status().code(), StatusCode::kUnavailable);
#ifndef FERRY_HAVE_CUDA
  EXPECT_EQ(ev.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ss.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(ss.status().message().find("built without CUDA"), std::string::npos);
#endif
}

TEST(HostTransferEngineDeathTest, CudaStreamIsABug) {
  Stream fake(Device::kCuda, 0, nullptr);
  int x = 0, y = 0;
  EXPECT_DEATH((void)host_transfer_engine().h2d(&x, &y, sizeof x, fake), "given a cuda stream");
}

}  // namespace
}  // namespace ferry::mem
