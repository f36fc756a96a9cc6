// SPDX-License-Identifier: Apache-2.0
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ferry::model {

Result<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("model: file {} does not exist", path);
    return errno_status("model: open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status("model: stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("model: {} is not a regular file", path);
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<std::size_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return errno_status("model: mmap", path, err);
    }
    m.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace ferry::model
