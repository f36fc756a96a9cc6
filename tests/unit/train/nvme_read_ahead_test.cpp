// SPDX-License-Identifier: Apache-2.0
// NvmeReadAhead (src/train/stream/nvme_read_ahead.h): the backward's NVMe boundaries are read on
// the reader's own thread before anyone asks, in the given order, each into its staging buffer;
// a buffer is not overwritten before its read was released; a new sequence drops an unfinished
// one; a disk error is the take's status; destruction with reads pending returns. With one buffer
// (what the stream executor uses) and with two.
#include "train/stream/nvme_read_ahead.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mem/buffer.h"
#include "mem/event.h"
#include "tests/unit/train/test_util.h"

namespace ferry::train::stream {
namespace {

constexpr std::size_t kRecordBytes = 3 * 4096 + 100;  // stride 4 pages
constexpr int kRecords = 5;

// kRecords records, record r filled with byte (r + 1) * 37, and `buffers` staging buffers.
class ReadAheadFixture {
 public:
  explicit ReadAheadFixture(int buffers) {
    auto store = mem::NvmeStore::open({.dir = testing::temp_dir("read_ahead"),
                                       .record_bytes = kRecordBytes,
                                       .capacity_records = kRecords + 1},
                                      nvme_);
    FERRY_CHECK_OK(store.status());
    store_ = std::move(store).value();
    const std::size_t stride = store_->record_stride();
    mem::Buffer src = allocate(stride);
    for (int r = 0; r < kRecords; ++r) {
      auto id = store_->allocate();
      FERRY_CHECK_OK(id.status());
      records_.push_back(*id);
      std::memset(src.data(), fill(r), stride);
      FERRY_CHECK_OK(store_->write(*id, src.data()));
    }
    auto unwritten = store_->allocate();
    FERRY_CHECK_OK(unwritten.status());
    unwritten_ = *unwritten;
    std::vector<std::byte*> staging;
    std::vector<const mem::Event*> free;
    for (int k = 0; k < buffers; ++k) {
      staging_.push_back(allocate(stride));
      std::memset(staging_.back().data(), 0, stride);
      staging.push_back(staging_.back().data());
      events_.push_back(std::make_unique<mem::Event>());  // host events: complete when recorded
      free.push_back(events_.back().get());
    }
    ra_ = std::make_unique<NvmeReadAhead>(*store_, std::move(staging), std::move(free));
  }

  static int fill(int r) { return (r + 1) * 37; }
  // Every byte of `p` is record r's.
  bool holds(const std::byte* p, int r) const {
    for (std::size_t i = 0; i < store_->record_stride(); ++i) {
      if (std::to_integer<int>(p[i]) != (fill(r) & 0xff)) return false;
    }
    return true;
  }
  // Polls (up to 10 s) until staging buffer k holds record r.
  bool lands(int k, int r) const {
    for (int i = 0; i < 10000; ++i) {
      if (holds(staging_[static_cast<std::size_t>(k)].data(), r)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  std::vector<mem::RecordId> order(const std::vector<int>& rs) const {
    std::vector<mem::RecordId> out;
    for (int r : rs) out.push_back(records_[static_cast<std::size_t>(r)]);
    return out;
  }

  NvmeReadAhead& ra() { return *ra_; }
  void destroy() { ra_.reset(); }
  mem::RecordId unwritten() const { return unwritten_; }

 private:
  mem::Buffer allocate(std::size_t bytes) {
    auto b = mem::Buffer::allocate(mem::MemTier::kPageableHost, bytes, host_);
    FERRY_CHECK_OK(b.status());
    return std::move(b).value();
  }

  mem::MemoryBudget nvme_{mem::MemTier::kNvme};
  mem::MemoryBudget host_{mem::MemTier::kPageableHost};
  std::unique_ptr<mem::NvmeStore> store_;
  std::vector<mem::RecordId> records_;
  mem::RecordId unwritten_;
  std::vector<mem::Buffer> staging_;
  std::vector<std::unique_ptr<mem::Event>> events_;
  std::unique_ptr<NvmeReadAhead> ra_;
};

class NvmeReadAheadBuffers : public ::testing::TestWithParam<int> {};

TEST_P(NvmeReadAheadBuffers, ReadsLandAheadInOrderAndWaitForTheirBufferToBeReleased) {
  const int k = GetParam();
  ReadAheadFixture f(k);
  const std::vector<int> seq = {3, 1, 4, 0, 2};
  f.ra().begin(f.order(seq));
  // Ahead: the first k reads land without anyone taking them.
  for (int m = 0; m < k; ++m) EXPECT_TRUE(f.lands(m, seq[static_cast<std::size_t>(m)])) << m;
  for (int m = 0; m < static_cast<int>(seq.size()); ++m) {
    const int r = seq[static_cast<std::size_t>(m)];
    auto landed = f.ra().take(m);
    ASSERT_TRUE(landed.ok()) << landed.status().to_string();
    EXPECT_TRUE(f.holds(landed->data, r)) << "read " << m;
    EXPECT_GE(landed->disk_s, 0.0);
    // Not released yet: read m + k, which would reuse this buffer, must not start.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(f.holds(landed->data, r)) << "read " << m << " overwritten before its release";
    f.ra().release(m);
  }
}

INSTANTIATE_TEST_SUITE_P(OneAndTwo, NvmeReadAheadBuffers, ::testing::Values(1, 2));

// An aborted micro-batch leaves a sequence half taken and unreleased: the next begin() starts
// over with the new order (the stream executor begins one per micro-batch).
TEST(NvmeReadAhead, BeginDropsAnUnfinishedSequence) {
  ReadAheadFixture f(1);
  f.ra().begin(f.order({2, 3, 4}));
  ASSERT_TRUE(f.ra().take(0).ok());
  f.ra().begin(f.order({0, 1}));
  for (int m = 0; m < 2; ++m) {
    auto landed = f.ra().take(m);
    ASSERT_TRUE(landed.ok()) << landed.status().to_string();
    EXPECT_TRUE(f.holds(landed->data, m));
    f.ra().release(m);
  }
}

// A read the store refuses (a record never written) is that take's status, not an abort; the
// reads after it go on.
TEST(NvmeReadAhead, ADiskErrorIsTheTakesStatus) {
  ReadAheadFixture f(1);
  std::vector<mem::RecordId> seq = f.order({1});
  seq.insert(seq.begin(), f.unwritten());
  f.ra().begin(seq);
  auto bad = f.ra().take(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().to_string();
  f.ra().release(0);
  auto good = f.ra().take(1);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_TRUE(f.holds(good->data, 1));
}

// Destroyed with reads waiting for a release that never comes: returns (the thread stops).
TEST(NvmeReadAhead, DestroyedWithReadsPendingReturns) {
  ReadAheadFixture f(1);
  f.ra().begin(f.order({0, 1, 2, 3}));
  ASSERT_TRUE(f.ra().take(0).ok());
  f.destroy();
}

}  // namespace
}  // namespace ferry::train::stream
