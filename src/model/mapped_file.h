// SPDX-License-Identifier: Apache-2.0
// MappedFile: a read-only, private mmap of a whole file (the kMappedFile tier). Move-only RAII;
// the mapping lives until the object is destroyed, so views into bytes() must not outlive it.
// An empty file maps to an empty span (mmap of length 0 is not allowed, so nothing is mapped).
// Thread-safety: const access from many threads is fine; the bytes never change.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "core/result.h"

namespace ferry::model {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace ferry::model
