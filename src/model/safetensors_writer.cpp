// SPDX-License-Identifier: Apache-2.0
#include "model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <set>
#include <vector>

#include "core/json.h"

namespace ferry::model {
namespace {

// Owns the temporary file until commit(); unlinks it on any failure path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path)
      : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {}
  ~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return errno_status("model: create", tmp_, errno);
    return {};
  }

  Status write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno_status("model: write", tmp_, errno);
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return {};
  }

  Status commit() {
    if (::fsync(fd_) != 0) return errno_status("model: fsync", tmp_, errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return errno_status("model: close", tmp_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return errno_status("model: rename", path_, errno);
    }
    committed_ = true;
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
    return {};
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

Status write_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return invalid_argument("model: {}: invalid tensor name \"{}\"", path, t.name);
    }
    if (!names.insert(t.name).second) {
      return invalid_argument("model: {}: duplicate tensor name {}", path, t.name);
    }
    if (t.view.device != Device::kCpu) {
      return invalid_argument("model: {}: tensor {} is not in CPU memory", path, t.name);
    }
    if (!t.view.is_contiguous()) {
      return invalid_argument("model: {}: tensor {} is not contiguous", path, t.name);
    }
    if (t.view.numel() > 0 && t.view.data == nullptr) {
      return invalid_argument("model: {}: tensor {} has no data", path, t.name);
    }
  }

  // Decreasing element size keeps every tensor aligned to its element size without gaps.
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    const std::size_t sa = dtype_size(a->view.dtype), sb = dtype_size(b->view.dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    Json shape = Json::array();
    for (int i = 0; i < t->view.ndim; ++i) shape.push_back(t->view.shape[i]);
    const std::uint64_t n = t->view.bytes();
    header[t->name] = {{"dtype", std::string(to_safetensors(t->view.dtype))},
                       {"shape", std::move(shape)},
                       {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFileWriter w(path);
  FERRY_TRY(w.open());
  std::uint8_t len[8];
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  FERRY_TRY(w.write(len, sizeof len));
  FERRY_TRY(w.write(text.data(), text.size()));
  for (const NamedTensor* t : order) FERRY_TRY(w.write(t->view.data, t->view.bytes()));
  return w.commit();
}

}  // namespace ferry::model
