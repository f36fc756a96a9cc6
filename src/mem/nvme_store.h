// SPDX-License-Identifier: Apache-2.0
// NvmeStore: a directory-backed spill store for fixed-size records (boundary activations,
// optimizer state) — the kNvme tier. One file per store, record i at offset i * record_stride().
//
//   NvmeStoreOptions o{.dir = "/nvme/ferry", .record_bytes = 8 << 20, .capacity_records = 64};
//   FERRY_ASSIGN_OR_RETURN(auto store, NvmeStore::open(o, nvme_budget));
//   FERRY_ASSIGN_OR_RETURN(RecordId r, store->allocate());          // charges the budget
//   FERRY_ASSIGN_OR_RETURN(NvmeTicket t, store->submit_write(r, h_src));
//   ... overlap other work ...
//   FERRY_TRY(store->wait(t));                                       // h_src reusable now
//
// I/O path: io_uring with O_DIRECT when available (FERRY_HAVE_URING and the kernel allows it);
// otherwise pread/pwrite, executed synchronously inside submit_*, so the ticket is already
// complete when returned. When the filesystem refuses O_DIRECT (tmpfs: EINVAL) the store reopens
// with buffered I/O. Every fallback is logged as a warning on the "mem" logger and visible through
// io_uring_active() / direct_io_active().
//
// Rules (the same on every path, so CI on tmpfs catches what an NVMe drive would refuse):
//   - every transfer moves record_stride() bytes = record_bytes rounded up to kIoAlignBytes;
//     caller buffers are kIoAlignBytes-aligned and at least record_stride() long
//     (invalid_argument otherwise);
//   - a buffer passed to submit_* must stay valid and untouched until its ticket is waited on;
//   - each ticket is waited on exactly once (waiting on an unknown ticket is a bug);
//   - reading a record never written is invalid_argument; ordering a read after a write of the
//     same record is the caller's job (wait for the write first);
//   - allocate() charges record_stride() to the kNvme budget (resource_exhausted when over
//     budget or when all capacity_records are in use); free() and the destructor release it.
// Failures: ENOSPC -> resource_exhausted; other errno and short reads/writes -> kIo, naming the
// record, the file and the byte counts. Thread-safe: one mutex guards the ring and the tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"
#include "mem/budget.h"

namespace ferry::mem {

struct NvmeStoreOptions {
  std::string dir;               // created if missing
  std::string name = "spill";    // file: <dir>/<name>.<pid>.<seq>.ferry, removed on close
  std::size_t record_bytes = 0;  // > 0
  std::size_t capacity_records = 0;
  bool use_io_uring = true;  // false forces pread/pwrite
  bool direct_io = true;     // false forces buffered I/O
  unsigned queue_depth = 32;
  // posix_fallocate the whole file at open: ENOSPC surfaces at open instead of mid-run.
  bool preallocate = false;
};

struct RecordId {
  std::uint32_t index = 0;
  friend bool operator==(RecordId, RecordId) = default;
};

struct NvmeTicket {
  std::uint64_t id = 0;
};

class NvmeStore {
 public:
  static constexpr std::size_t kIoAlignBytes = 4096;
  // What one transfer of a record of record_bytes moves: record_bytes rounded up to kIoAlignBytes
  // (record_stride() of a store opened with it; callers that predict its traffic use this too).
  static constexpr std::size_t stride_for(std::size_t record_bytes) {
    return (record_bytes + kIoAlignBytes - 1) / kIoAlignBytes * kIoAlignBytes;
  }

  static Result<std::unique_ptr<NvmeStore>> open(const NvmeStoreOptions& opts,
                                                 MemoryBudget& budget);
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;
  // Completes all in-flight I/O, releases every record's charge, closes and removes the file.
  ~NvmeStore();

  Result<RecordId> allocate();
  void free(RecordId id);  // a record with I/O in flight is a bug

  Result<NvmeTicket> submit_write(RecordId id, const std::byte* h_src);
  Result<NvmeTicket> submit_read(RecordId id, std::byte* h_dst);
  // Blocks until the ticket's I/O completes; returns its outcome. Consumes the ticket.
  Status wait(NvmeTicket ticket);
  // Non-blocking: true when wait() would return without blocking.
  bool is_complete(NvmeTicket ticket);

  Status write(RecordId id, const std::byte* h_src);  // submit + wait
  Status read(RecordId id, std::byte* h_dst);         // submit + wait

  std::size_t record_bytes() const { return record_bytes_; }
  std::size_t record_stride() const { return record_stride_; }
  std::size_t capacity_records() const { return capacity_; }
  std::size_t records_in_use() const;
  std::size_t in_flight() const;
  bool io_uring_active() const { return ring_ != nullptr; }
  bool direct_io_active() const { return direct_io_; }
  const std::string& path() const { return path_; }

 private:
  struct Ring;  // io_uring state (nvme_store.cpp)
  struct Pending;
  enum class RecordState : std::uint8_t { kFree, kAllocated, kWritten };

  explicit NvmeStore(MemoryBudget& budget);
  Result<NvmeTicket> submit(RecordId id, std::byte* buf, bool is_write);
  Status check_record(RecordId id, const std::byte* buf, bool is_write) const;
  Status sync_io(RecordId id, std::byte* buf, bool is_write);
  Status finish(const Pending& p, long long result) const;
  void reap_one_locked();

  MemoryBudget& budget_;
  std::string path_;
  std::size_t record_bytes_ = 0;
  std::size_t record_stride_ = 0;
  std::size_t capacity_ = 0;
  int fd_ = -1;
  bool direct_io_ = false;
  unsigned queue_depth_ = 0;
  std::unique_ptr<Ring> ring_;
  struct Tables;
  std::unique_ptr<Tables> t_;
};

}  // namespace ferry::mem
