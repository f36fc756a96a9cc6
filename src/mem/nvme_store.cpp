// SPDX-License-Identifier: Apache-2.0
// NvmeStore: record table + ticket table under one mutex; I/O through io_uring (resubmitting the
// remainder of partial transfers) or synchronous pread/pwrite. See nvme_store.h for the rules.
#include "mem/nvme_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <vector>

#ifdef FERRY_HAVE_URING
#include <liburing.h>
#endif

#include "core/check.h"
#include "core/log.h"

namespace ferry::mem {

struct NvmeStore::Ring {
#ifdef FERRY_HAVE_URING
  io_uring ring{};
#endif
  unsigned in_ring = 0;  // submitted, completion not yet reaped
};

struct NvmeStore::Pending {
  RecordId rec;
  bool is_write = false;
  std::byte* buf = nullptr;
  std::size_t done_bytes = 0;
  bool done = false;
  Status status;
};

struct NvmeStore::Tables {
  mutable std::mutex mu;
  std::vector<RecordState> state;
  std::vector<std::uint32_t> inflight;   // ring I/Os per record
  std::vector<std::uint32_t> free_list;  // popped from the back
  std::unordered_map<std::uint64_t, Pending> pending;
  std::uint64_t next_ticket = 1;
  std::size_t in_use = 0;
};

namespace {
std::atomic<std::uint64_t> g_store_seq{0};

std::string_view op_name(bool is_write) { return is_write ? "write" : "read"; }

// One submission moves at most this much; larger records complete through resubmission (the
// kernel caps a single read/write near 2 GiB and an SQE length is 32 bits).
constexpr std::size_t kMaxIoChunkBytes = std::size_t{1} << 30;

#ifdef FERRY_HAVE_URING
// Turns an SQE whose io_uring_submit failed into a no-op with ticket 0 (ignored when reaped),
// so a later submit cannot flush a stale request for a ticket that already reported failure.
void neutralize(io_uring_sqe* sqe) {
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, 0);
}
#endif
}  // namespace

NvmeStore::NvmeStore(MemoryBudget& budget) : budget_(budget) {}

Result<std::unique_ptr<NvmeStore>> NvmeStore::open(const NvmeStoreOptions& opts,
                                                   MemoryBudget& budget) {
  FERRY_CHECK(budget.tier() == MemTier::kNvme, "mem: nvme store charged to a {} budget",
              to_string(budget.tier()));
  if (opts.dir.empty() || opts.record_bytes == 0 || opts.capacity_records == 0 ||
      opts.capacity_records > UINT32_MAX || opts.queue_depth == 0) {
    return invalid_argument(
        "mem: nvme store needs a dir, record_bytes > 0, 0 < capacity_records < 2^32 and "
        "queue_depth > 0 (dir '{}', record_bytes {}, capacity {}, queue_depth {})",
        opts.dir, opts.record_bytes, opts.capacity_records, opts.queue_depth);
  }
  auto log = log::get("mem");
  std::unique_ptr<NvmeStore> s(new NvmeStore(budget));
  s->record_bytes_ = opts.record_bytes;
  s->record_stride_ = stride_for(opts.record_bytes);
  s->capacity_ = opts.capacity_records;
  s->queue_depth_ = opts.queue_depth;
  s->t_ = std::make_unique<Tables>();
  s->t_->state.assign(s->capacity_, RecordState::kFree);
  s->t_->inflight.assign(s->capacity_, 0);
  for (std::size_t i = s->capacity_; i > 0; --i) {
    s->t_->free_list.push_back(static_cast<std::uint32_t>(i - 1));
  }

  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec) return io_error("mem: nvme store cannot create {}: {}", opts.dir, ec.message());
  s->path_ = fmt::format("{}/{}.{}.{}.ferry", opts.dir, opts.name, ::getpid(), g_store_seq++);

  const int base_flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (opts.direct_io) {
    s->fd_ = ::open(s->path_.c_str(), base_flags | O_DIRECT, 0600);
    if (s->fd_ >= 0) {
      s->direct_io_ = true;
    } else if (errno == EINVAL) {
      ::unlink(s->path_.c_str());  // some filesystems create the file before refusing O_DIRECT
      log->warn("nvme store: filesystem at {} refuses O_DIRECT; falling back to buffered I/O",
                opts.dir);
    } else {
      return errno_status("mem: nvme store open", s->path_, errno);
    }
  }
  if (s->fd_ < 0) {
    s->fd_ = ::open(s->path_.c_str(), base_flags, 0600);
    if (s->fd_ < 0) return errno_status("mem: nvme store open", s->path_, errno);
  }

  if (opts.preallocate) {
    const int rc =
        ::posix_fallocate(s->fd_, 0, static_cast<off_t>(s->capacity_ * s->record_stride_));
    if (rc == ENOSPC) {
      return resource_exhausted(
          "mem: nvme store cannot preallocate {} for {} records in {}: no "
          "space left on device",
          format_bytes(s->capacity_ * s->record_stride_), s->capacity_, opts.dir);
    }
    if (rc != 0)
      log->warn("nvme store: preallocation in {} failed: {}", opts.dir, std::strerror(rc));
  }

  if (!opts.use_io_uring) {
    log->info("nvme store: io_uring disabled by option; using pread/pwrite");
  } else {
#ifdef FERRY_HAVE_URING
    auto ring = std::make_unique<Ring>();
    if (const int rc = io_uring_queue_init(opts.queue_depth, &ring->ring, 0); rc < 0) {
      log->warn("nvme store: io_uring unavailable ({}); falling back to synchronous pread/pwrite",
                std::strerror(-rc));
    } else {
      s->ring_ = std::move(ring);
    }
#else
    log->warn("nvme store: built without liburing; falling back to synchronous pread/pwrite");
#endif
  }
  log->debug("nvme store: {} records of {} at {} (io_uring {}, O_DIRECT {})", s->capacity_,
             format_bytes(s->record_stride_), s->path_, s->ring_ != nullptr, s->direct_io_);
  return s;
}

NvmeStore::~NvmeStore() {
  std::lock_guard lock(t_->mu);
  if (ring_ != nullptr) {
    while (ring_->in_ring > 0) reap_one_locked();
#ifdef FERRY_HAVE_URING
    io_uring_queue_exit(&ring_->ring);
#endif
  }
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
  if (t_->in_use > 0) budget_.release(t_->in_use * record_stride_);
}

Result<RecordId> NvmeStore::allocate() {
  std::lock_guard lock(t_->mu);
  if (t_->free_list.empty()) {
    return resource_exhausted("mem: nvme store {} full: need 1 record of {}, free 0 of {} records",
                              path_, format_bytes(record_stride_), capacity_);
  }
  FERRY_TRY(budget_.reserve(record_stride_, "nvme spill record"));
  const RecordId id{t_->free_list.back()};
  t_->free_list.pop_back();
  t_->state[id.index] = RecordState::kAllocated;
  ++t_->in_use;
  return id;
}

void NvmeStore::free(RecordId id) {
  std::lock_guard lock(t_->mu);
  FERRY_CHECK(id.index < capacity_ && t_->state[id.index] != RecordState::kFree,
              "mem: nvme store free of record {} that is not allocated", id.index);
  FERRY_CHECK(t_->inflight[id.index] == 0,
              "mem: nvme store free of record {} with {} I/Os in "
              "flight",
              id.index, t_->inflight[id.index]);
  t_->state[id.index] = RecordState::kFree;
  t_->free_list.push_back(id.index);
  --t_->in_use;
  budget_.release(record_stride_);
}

std::size_t NvmeStore::records_in_use() const {
  std::lock_guard lock(t_->mu);
  return t_->in_use;
}

std::size_t NvmeStore::in_flight() const {
  std::lock_guard lock(t_->mu);
  return ring_ != nullptr ? ring_->in_ring : 0;
}

Status NvmeStore::check_record(RecordId id, const std::byte* buf, bool is_write) const {
  if (id.index >= capacity_ || t_->state[id.index] == RecordState::kFree) {
    return invalid_argument("mem: nvme store {} of record {}: not allocated", op_name(is_write),
                            id.index);
  }
  if (!is_write && t_->state[id.index] != RecordState::kWritten) {
    return invalid_argument("mem: nvme store read of record {}: never written", id.index);
  }
  if (reinterpret_cast<std::uintptr_t>(buf) % kIoAlignBytes != 0) {
    return invalid_argument(
        "mem: nvme store {} of record {}: buffer {} is not {}-byte aligned (O_DIRECT rule, "
        "enforced on every I/O path)",
        op_name(is_write), id.index, static_cast<const void*>(buf), kIoAlignBytes);
  }
  return {};
}

Status NvmeStore::finish(const Pending& p, long long result) const {
  if (result < 0) {
    const int err = static_cast<int>(-result);
    if (err == ENOSPC) {
      return resource_exhausted(
          "mem: nvme store write of record {} to {}: no space left on device "
          "(need {})",
          p.rec.index, path_, format_bytes(record_stride_));
    }
    return io_error("mem: nvme store {} of record {} in {} failed after {} of {} bytes: {}",
                    op_name(p.is_write), p.rec.index, path_, p.done_bytes, record_stride_,
                    std::strerror(err));
  }
  if (p.done_bytes < record_stride_) {
    return io_error("mem: nvme store short {} of record {} in {}: {} of {} bytes",
                    op_name(p.is_write), p.rec.index, path_, p.done_bytes, record_stride_);
  }
  return {};
}

Status NvmeStore::sync_io(RecordId id, std::byte* buf, bool is_write) {
  Pending p{id, is_write, buf, 0, false, {}};
  const off_t base = static_cast<off_t>(id.index) * static_cast<off_t>(record_stride_);
  while (p.done_bytes < record_stride_) {
    const std::size_t left = std::min(record_stride_ - p.done_bytes, kMaxIoChunkBytes);
    const off_t off = base + static_cast<off_t>(p.done_bytes);
    const ssize_t n = is_write ? ::pwrite(fd_, buf + p.done_bytes, left, off)
                               : ::pread(fd_, buf + p.done_bytes, left, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return finish(p, -static_cast<long long>(errno));
    if (n == 0) break;  // EOF (reads) or no progress (writes): reported as short
    p.done_bytes += static_cast<std::size_t>(n);
  }
  return finish(p, 0);
}

Result<NvmeTicket> NvmeStore::submit(RecordId id, std::byte* buf, bool is_write) {
  std::lock_guard lock(t_->mu);
  FERRY_TRY(check_record(id, buf, is_write));
  const std::uint64_t ticket = t_->next_ticket++;
  if (is_write) t_->state[id.index] = RecordState::kWritten;
  if (ring_ == nullptr) {
    Pending p{id, is_write, buf, 0, true, sync_io(id, buf, is_write)};
    t_->pending.emplace(ticket, std::move(p));
    return NvmeTicket{ticket};
  }
#ifdef FERRY_HAVE_URING
  while (ring_->in_ring >= queue_depth_) reap_one_locked();
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  FERRY_CHECK(sqe != nullptr, "mem: nvme store: no free submission entry with {} of {} in ring",
              ring_->in_ring, queue_depth_);
  const off_t off = static_cast<off_t>(id.index) * static_cast<off_t>(record_stride_);
  const auto len = static_cast<unsigned>(std::min(record_stride_, kMaxIoChunkBytes));
  if (is_write) {
    io_uring_prep_write(sqe, fd_, buf, len, off);
  } else {
    io_uring_prep_read(sqe, fd_, buf, len, off);
  }
  io_uring_sqe_set_data64(sqe, ticket);
  if (const int rc = io_uring_submit(&ring_->ring); rc < 0) {
    neutralize(sqe);
    return io_error("mem: nvme store {} of record {}: io_uring_submit: {}", op_name(is_write),
                    id.index, std::strerror(-rc));
  }
  ++ring_->in_ring;
  ++t_->inflight[id.index];
  t_->pending.emplace(ticket, Pending{id, is_write, buf, 0, false, {}});
  return NvmeTicket{ticket};
#else
  FERRY_CHECK(false, "mem: nvme store ring without liburing");
  return NvmeTicket{};
#endif
}

// Reaps one completion (blocking). A partial transfer is resubmitted for its remainder.
void NvmeStore::reap_one_locked() {
#ifdef FERRY_HAVE_URING
  io_uring_cqe* cqe = nullptr;
  int rc = 0;
  do {
    rc = io_uring_wait_cqe(&ring_->ring, &cqe);
  } while (rc == -EINTR);
  FERRY_CHECK(rc == 0, "mem: nvme store: io_uring_wait_cqe failed: {}", std::strerror(-rc));
  const std::uint64_t ticket = io_uring_cqe_get_data64(cqe);
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  if (ticket == 0) return;  // a neutralized request; never counted in in_ring
  --ring_->in_ring;
  auto it = t_->pending.find(ticket);
  FERRY_CHECK(it != t_->pending.end(), "mem: nvme store: completion for unknown ticket {}", ticket);
  Pending& p = it->second;
  if (res > 0) p.done_bytes += static_cast<std::size_t>(res);
  if (res > 0 && p.done_bytes < record_stride_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    FERRY_CHECK(sqe != nullptr, "mem: nvme store: no submission entry for a partial transfer");
    const std::size_t left = std::min(record_stride_ - p.done_bytes, kMaxIoChunkBytes);
    const off_t off = static_cast<off_t>(p.rec.index) * static_cast<off_t>(record_stride_) +
                      static_cast<off_t>(p.done_bytes);
    if (p.is_write) {
      io_uring_prep_write(sqe, fd_, p.buf + p.done_bytes, static_cast<unsigned>(left), off);
    } else {
      io_uring_prep_read(sqe, fd_, p.buf + p.done_bytes, static_cast<unsigned>(left), off);
    }
    io_uring_sqe_set_data64(sqe, ticket);
    if (io_uring_submit(&ring_->ring) >= 0) {
      ++ring_->in_ring;
      return;
    }
    neutralize(sqe);  // reported below as a short transfer
  }
  p.done = true;
  p.status = finish(p, res < 0 ? res : 0);
  --t_->inflight[p.rec.index];
#else
  FERRY_CHECK(false, "mem: nvme store ring without liburing");
#endif
}

Status NvmeStore::wait(NvmeTicket ticket) {
  std::lock_guard lock(t_->mu);
  auto it = t_->pending.find(ticket.id);
  FERRY_CHECK(it != t_->pending.end(), "mem: nvme store: wait on unknown or consumed ticket {}",
              ticket.id);
  while (!it->second.done) {
    reap_one_locked();
    it = t_->pending.find(ticket.id);
  }
  Status s = std::move(it->second.status);
  t_->pending.erase(it);
  return s;
}

bool NvmeStore::is_complete(NvmeTicket ticket) {
  std::lock_guard lock(t_->mu);
  auto it = t_->pending.find(ticket.id);
  FERRY_CHECK(it != t_->pending.end(), "mem: nvme store: query of unknown or consumed ticket {}",
              ticket.id);
#ifdef FERRY_HAVE_URING
  while (!it->second.done && ring_ != nullptr) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_->ring, &cqe) != 0) break;
    reap_one_locked();  // a completion is ready: this does not block
  }
#endif
  return it->second.done;
}

Result<NvmeTicket> NvmeStore::submit_write(RecordId id, const std::byte* h_src) {
  // The kernel only reads from h_src; the non-const pointer is an artifact of sharing Pending.
  return submit(id, const_cast<std::byte*>(h_src), /*is_write=*/true);
}

Result<NvmeTicket> NvmeStore::submit_read(RecordId id, std::byte* h_dst) {
  return submit(id, h_dst, /*is_write=*/false);
}

Status NvmeStore::write(RecordId id, const std::byte* h_src) {
  FERRY_ASSIGN_OR_RETURN(NvmeTicket t, submit_write(id, h_src));
  return wait(t);
}

Status NvmeStore::read(RecordId id, std::byte* h_dst) {
  FERRY_ASSIGN_OR_RETURN(NvmeTicket t, submit_read(id, h_dst));
  return wait(t);
}

}  // namespace ferry::mem
