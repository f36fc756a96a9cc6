// SPDX-License-Identifier: Apache-2.0
// safetensors writing. The file is streamed to "<path>.tmp.<pid>", fsynced, renamed over `path`
// and the directory fsynced, so a crash never leaves a half-written checkpoint under the final
// name (same protocol as core/file_util.h write_file_atomic, but without building the whole file
// in memory).
// Layout: the JSON header is padded with spaces to a multiple of 8 bytes, and tensors are laid out
// contiguously (no gaps, so the reference Rust/Python readers accept the file) in order of
// decreasing element size, then name; every tensor therefore starts at an offset that is a
// multiple of its element size, and the mmap reader can hand out aligned zero-copy views.
// Tests: tests/unit/model/safetensors_test.cpp (round trip for every dtype).
#pragma once

#include <map>
#include <span>
#include <string>

#include "core/status.h"
#include "tensor/tensor_view.h"

namespace ferry::model {

struct NamedTensor {
  std::string name;
  ConstTensorView view;  // CPU, contiguous; read while writing, not retained
};

// Errors: duplicate or empty names, "__metadata__" as a tensor name, non-CPU or non-contiguous
// views (kInvalidArgument); I/O failures (kIo). `tensors` may be in any order.
Status write_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry::model
