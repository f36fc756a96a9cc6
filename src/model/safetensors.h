// SPDX-License-Identifier: Apache-2.0
// safetensors reading: a fully validated header parser that works on bytes (so it can be fuzzed,
// tests/fuzz/safetensors_fuzz.cpp) and SafetensorsFile, an mmap of one file whose tensors are
// handed out as zero-copy ConstTensorViews over the mapping.
//
// Format: u64 little-endian header length N, N bytes of JSON, then the data region. The JSON maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets relative to the
// data region) plus an optional "__metadata__" string->string map.
// Validation (each failure is a kCorrupt Status naming the file and the tensor/key):
//   - N <= 100 MiB and 8 + N <= file size; the header is a JSON object;
//   - every dtype is known (safetensors dtypes ferry has no type for -> kUnimplemented);
//   - shape is an array of non-negative integers; product * dtype size == end - begin, computed
//     without overflow; begin <= end <= data region size;
//   - no two non-empty tensors overlap. Gaps between tensors are ALLOWED (the reference Rust
//     reader rejects them; we only need every byte we hand out to belong to one tensor).
// Tensor data inside the mapping is not necessarily aligned to its element size (the header length
// decides that); `aligned()` says so and the loader copies unaligned tensors.
// Tests: tests/unit/model/safetensors_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"
#include "model/mapped_file.h"
#include "tensor/tensor_view.h"

namespace ferry::model {

inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;  // any rank; views support up to kMaxDims
  std::uint64_t begin = 0;          // byte offsets relative to the data region
  std::uint64_t end = 0;

  std::uint64_t size_bytes() const { return end - begin; }
  std::int64_t numel() const;
};

struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;               // N
  std::uint64_t data_offset = 0;                // 8 + N: where the data region starts in the file
  std::uint64_t data_bytes = 0;                 // file size - data_offset
  std::vector<TensorInfo> tensors;              // sorted by begin offset (file order), ties by name
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::unordered_map<std::string, std::size_t> by_name;  // name -> index into tensors

  const TensorInfo* find(std::string_view name) const;
};

// Parses and validates the header of a whole safetensors file held in `file`. `what` names the
// file in errors (its path).
Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   std::string_view what);

// "[64, 32]"
std::string shape_string(std::span<const std::int64_t> shape);

// Checks a tensor against what the caller expects. Errors read
//   "model: tensor q.weight: expected shape [64, 64], found [64, 32] (in /path/model.safetensors)"
Status check_tensor(const TensorInfo& t, DType dtype, std::span<const std::int64_t> shape,
                    std::string_view file);
Status check_tensor_shape(const TensorInfo& t, std::span<const std::int64_t> shape,
                          std::string_view file);

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  // Takes ownership of an existing mapping (used by tests and by open()).
  static Result<SafetensorsFile> from_mapping(MappedFile map);

  const std::string& path() const { return map_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }

  // The tensor's bytes inside the mapping.
  std::span<const std::byte> bytes(const TensorInfo& t) const;
  // True when the tensor's data pointer is aligned to its element size.
  bool aligned(const TensorInfo& t) const;
  // Zero-copy view (CPU) over the mapping; kUnimplemented for rank > kMaxDims.
  Result<ConstTensorView> view(const TensorInfo& t) const;
  // Looks a tensor up by name: kNotFound when absent.
  Result<ConstTensorView> view(std::string_view name) const;
  // Looks up and checks dtype and shape.
  Result<ConstTensorView> view(std::string_view name, DType dtype,
                               std::span<const std::int64_t> shape) const;

 private:
  MappedFile map_;
  SafetensorsHeader header_;
};

// A view over raw bytes with the tensor's dtype and shape (rank <= kMaxDims).
Result<ConstTensorView> make_view(const void* data, const TensorInfo& t, std::string_view file);

}  // namespace ferry::model
