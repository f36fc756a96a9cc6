// SPDX-License-Identifier: Apache-2.0
// NvmeStore: random records round-trip on the io_uring path and the forced pread/pwrite path,
// with and without O_DIRECT; budget/capacity exhaustion and OS write failures are Status values;
// alignment rules hold on every path; many concurrent tickets from several threads.
#include "mem/nvme_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include "core/log.h"
#include "mem/buffer.h"

namespace ferry::mem {
namespace {

std::string test_dir(const char* base) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string d = fmt::format("{}/ferry_nvme_test.{}.{}.{}", base, ::getpid(),
                              info->test_suite_name(), info->name());
  // Parameterized names contain '/': keep the directory one level deep so remove_all cleans it.
  for (std::size_t k = std::string_view(base).size() + 1; k < d.size(); ++k) {
    if (d[k] == '/') d[k] = '_';
  }
  return d;
}

bool dir_accepts_o_direct(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ::unlink(probe.c_str());
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

struct Bufs {
  MemoryBudget budget{MemTier::kPageableHost};
  std::vector<Buffer> bufs;
  Bufs(std::size_t n, std::size_t bytes) {
    for (std::size_t i = 0; i < n; ++i) {
      Result<Buffer> b = Buffer::allocate(MemTier::kPageableHost, bytes, budget);
      FERRY_CHECK_OK(b.status());
      bufs.push_back(std::move(b).value());
    }
  }
};

void fill_random(std::byte* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

struct PathParam {
  bool uring;
  bool direct;
  const char* base;
};

class NvmeRoundTrip : public ::testing::TestWithParam<PathParam> {};

TEST_P(NvmeRoundTrip, RandomRecordsSurviveWriteThenRead) {
  const PathParam p = GetParam();
  if (p.base == std::string("/dev/shm") && !std::filesystem::is_directory("/dev/shm")) {
    GTEST_SKIP() << "no /dev/shm";
  }
  const std::string dir = test_dir(p.base);
  MemoryBudget nvme(MemTier::kNvme);
  NvmeStoreOptions o{.dir = dir,
                     .record_bytes = 10000,
                     .capacity_records = 16,
                     .use_io_uring = p.uring,
                     .direct_io = p.direct,
                     .queue_depth = 4};
  auto store = NvmeStore::open(o, nvme);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  NvmeStore& s = **store;
#ifdef FERRY_HAVE_URING
  if (p.uring) {
    EXPECT_TRUE(s.io_uring_active()) << "io_uring refused by this kernel?";
  }
#endif
  if (!p.uring) {
    EXPECT_FALSE(s.io_uring_active());
  }
  // O_DIRECT is active exactly when requested and the filesystem accepts it (probed here).
  EXPECT_EQ(s.direct_io_active(), p.direct && dir_accepts_o_direct(dir));
  EXPECT_EQ(s.record_stride(), 12288u);

  constexpr std::size_t kN = 12;
  Bufs src(kN, s.record_stride()), dst(kN, s.record_stride());
  std::vector<RecordId> ids;
  std::vector<NvmeTicket> tickets;
  for (std::size_t i = 0; i < kN; ++i) {
    fill_random(src.bufs[i].data(), s.record_stride(), static_cast<std::uint32_t>(i * 31 + 7));
    auto id = s.allocate();
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    auto t = s.submit_write(*id, src.bufs[i].data());  // 12 in flight through a depth-4 ring
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tickets.push_back(*t);
  }
  EXPECT_EQ(nvme.bytes_used(), kN * s.record_stride());
  for (NvmeTicket t : tickets) ASSERT_TRUE(s.wait(t).ok());
  tickets.clear();
  for (std::size_t i = kN; i-- > 0;) {  // reverse order
    auto t = s.submit_read(ids[i], dst.bufs[i].data());
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tickets.push_back(*t);
  }
  for (NvmeTicket t : tickets) ASSERT_TRUE(s.wait(t).ok());
  for (std::size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(std::memcmp(src.bufs[i].data(), dst.bufs[i].data(), s.record_stride()), 0) << i;
  }
  EXPECT_EQ(s.in_flight(), 0u);
  store = Status(StatusCode::kCancelled, "closed");  // destroys the store
  EXPECT_EQ(nvme.bytes_used(), 0u);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, NvmeRoundTrip,
    ::testing::Values(PathParam{true, true, "/tmp"}, PathParam{false, true, "/tmp"},
                      PathParam{false, false, "/tmp"}, PathParam{true, true, "/dev/shm"},
                      PathParam{false, true, "/dev/shm"}),
    [](const auto& param_info) {
      return fmt::format("{}_{}_{}", param_info.param.uring ? "uring" : "pread",
                         param_info.param.direct ? "direct" : "buffered",
                         param_info.param.base == std::string("/tmp") ? "tmp" : "shm");
    });

TEST(NvmeStore, FallbacksAreLogged) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = log::get("mem");
  const auto old_level = logger->level();
  logger->set_level(spdlog::level::info);
  logger->sinks().push_back(sink);
  MemoryBudget nvme(MemTier::kNvme);
  {
    auto store = NvmeStore::open({.dir = test_dir("/dev/shm"),
                                  .record_bytes = 4096,
                                  .capacity_records = 1,
                                  .use_io_uring = false},
                                 nvme);
    ASSERT_TRUE(store.ok());
    EXPECT_NE(out.str().find("io_uring disabled by option"), std::string::npos) << out.str();
    if (!(*store)->direct_io_active()) {
      EXPECT_NE(out.str().find("refuses O_DIRECT"), std::string::npos) << out.str();
    }
  }
  logger->sinks().pop_back();
  logger->set_level(old_level);
  std::filesystem::remove_all(test_dir("/dev/shm"));
}

TEST(NvmeStore, BudgetAndCapacityExhaustionAreStatus) {
  const std::string dir = test_dir("/tmp");
  MemoryBudget nvme(MemTier::kNvme, 3 * 4096);
  auto store = NvmeStore::open({.dir = dir, .record_bytes = 4096, .capacity_records = 4}, nvme);
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*store)->allocate().ok());
  auto over = (*store)->allocate();
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("nvme budget exceeded"), std::string::npos)
      << over.status().message();
  EXPECT_NE(over.status().message().find("free 0 B"), std::string::npos);
  ASSERT_TRUE(nvme.set_limit(MemoryBudget::kUnlimited).ok());
  ASSERT_TRUE((*store)->allocate().ok());
  auto full = (*store)->allocate();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("free 0 of 4 records"), std::string::npos)
      << full.status().message();
  EXPECT_EQ(nvme.bytes_used(), 4u * 4096u);
  (*store)->free(RecordId{2});
  EXPECT_EQ(nvme.bytes_used(), 3u * 4096u);
  EXPECT_EQ((*store)->allocate()->index, 2u);
  std::filesystem::remove_all(dir);
}

TEST(NvmeStore, MisalignedBuffersAndUnwrittenReadsAreRefusedOnEveryPath) {
  for (const bool uring : {true, false}) {
    const std::string dir = test_dir("/tmp");
    MemoryBudget nvme(MemTier::kNvme);
    auto store = NvmeStore::open({.dir = dir,
                                  .record_bytes = 100,
                                  .capacity_records = 2,
                                  .use_io_uring = uring,
                                  .direct_io = false},
                                 nvme);
    ASSERT_TRUE(store.ok());
    Bufs b(1, 8192);
    const RecordId id = *(*store)->allocate();
    Status s = (*store)->read(id, b.bufs[0].data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("never written"), std::string::npos) << s.message();
    s = (*store)->write(id, b.bufs[0].data() + 512);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("not 4096-byte aligned"), std::string::npos) << s.message();
    s = (*store)->write(RecordId{1}, b.bufs[0].data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);  // not allocated
    std::filesystem::remove_all(dir);
  }
}

TEST(NvmeStore, ShortReadOfATruncatedFileIsAnIoStatus) {
  for (const bool uring : {true, false}) {
    const std::string dir = test_dir("/tmp");
    MemoryBudget nvme(MemTier::kNvme);
    auto store = NvmeStore::open(
        {.dir = dir, .record_bytes = 8192, .capacity_records = 2, .use_io_uring = uring}, nvme);
    ASSERT_TRUE(store.ok());
    Bufs b(1, 8192);
    const RecordId id = *(*store)->allocate();
    ASSERT_TRUE((*store)->write(id, b.bufs[0].data()).ok());
    ASSERT_EQ(::truncate((*store)->path().c_str(), 4096), 0);  // someone cut the spill file
    const Status s = (*store)->read(id, b.bufs[0].data());
    EXPECT_EQ(s.code(), StatusCode::kIo) << s.to_string();
    EXPECT_NE(s.message().find("short read of record 0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("4096 of 8192 bytes"), std::string::npos) << s.message();
    std::filesystem::remove_all(dir);
  }
}

TEST(NvmeStore, OsWriteFailureIsAStatusNotACrash) {
  // RLIMIT_FSIZE makes the kernel refuse to grow the file (EFBIG) — a stand-in for a full disk.
  const std::string dir = test_dir("/tmp");
  MemoryBudget nvme(MemTier::kNvme);
  auto store = NvmeStore::open(
      {.dir = dir, .record_bytes = 4096, .capacity_records = 8, .use_io_uring = false}, nvme);
  ASSERT_TRUE(store.ok());
  Bufs b(1, 4096);
  RecordId last{};
  for (int i = 0; i < 8; ++i) last = *(*store)->allocate();
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const Status s = (*store)->write(last, b.bufs[0].data());  // offset 7*4096 is past the limit
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(s.code(), StatusCode::kIo) << s.to_string();
  EXPECT_NE(s.message().find("write of record 7"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find((*store)->path()), std::string::npos) << s.message();
  std::filesystem::remove_all(dir);
}

TEST(NvmeStore, ConcurrentTicketsFromSeveralThreads) {
  const std::string dir = test_dir("/tmp");
  MemoryBudget nvme(MemTier::kNvme);
  auto store = NvmeStore::open(
      {.dir = dir, .record_bytes = 4096, .capacity_records = 64, .queue_depth = 8}, nvme);
  ASSERT_TRUE(store.ok());
  NvmeStore& s = **store;
  constexpr int kThreads = 4, kPer = 8;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      Bufs src(kPer, 4096), dst(kPer, 4096);
      std::vector<RecordId> ids;
      std::vector<NvmeTicket> tk;
      for (int i = 0; i < kPer; ++i) {
        fill_random(src.bufs[i].data(), 4096, static_cast<std::uint32_t>(t * 100 + i));
        ids.push_back(*s.allocate());
        tk.push_back(*s.submit_write(ids.back(), src.bufs[i].data()));
      }
      for (auto k : tk) failures += !s.wait(k).ok();
      tk.clear();
      for (int i = 0; i < kPer; ++i) tk.push_back(*s.submit_read(ids[i], dst.bufs[i].data()));
      for (int i = kPer; i-- > 0;) failures += !s.wait(tk[i]).ok();
      for (int i = 0; i < kPer; ++i) {
        failures += std::memcmp(src.bufs[i].data(), dst.bufs[i].data(), 4096) != 0;
        s.free(ids[i]);
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(s.records_in_use(), 0u);
  EXPECT_EQ(nvme.bytes_used(), 0u);
  std::filesystem::remove_all(dir);
}

TEST(NvmeStoreDeathTest, WaitingTwiceOnATicketIsABug) {
  const std::string dir = test_dir("/tmp");
  MemoryBudget nvme(MemTier::kNvme);
  auto store = NvmeStore::open({.dir = dir, .record_bytes = 4096, .capacity_records = 1}, nvme);
  ASSERT_TRUE(store.ok());
  Bufs b(1, 4096);
  const RecordId id = *(*store)->allocate();
  const NvmeTicket t = *(*store)->submit_write(id, b.bufs[0].data());
  ASSERT_TRUE((*store)->wait(t).ok());
  EXPECT_DEATH((void)(*store)->wait(t), "unknown or consumed ticket");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::mem
