// SPDX-License-Identifier: Apache-2.0
// Helpers for the model tests: a self-deleting temp folder, raw safetensors byte assembly (so bad
// files can be written byte by byte), and small file writers.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace ferry::model::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ferry_model_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
}

// 8-byte little-endian length + header text + data.
inline std::string raw_safetensors(std::string_view header, std::string_view data,
                                   std::uint64_t declared_len = UINT64_MAX) {
  const std::uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out += data;
  return out;
}

}  // namespace ferry::model::testing
