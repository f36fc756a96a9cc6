// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the safetensors header parser (model/safetensors.h): any byte string must
// yield either a validated header or a Status, never a crash, hang or sanitizer report. When the
// header validates, every tensor's byte range is touched to prove it lies inside the input.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto h = ferry::model::parse_safetensors_header(file, "fuzz");
  if (!h.ok()) return 0;
  unsigned sum = 0;
  for (const auto& t : h->tensors) {
    const auto bytes = file.subspan(h->data_offset + t.begin, t.size_bytes());
    for (std::byte b : bytes) sum += std::to_integer<unsigned>(b);
    (void)ferry::model::make_view(bytes.data(), t, "fuzz");
  }
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
