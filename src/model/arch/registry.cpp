// SPDX-License-Identifier: Apache-2.0
// The list of architectures; lookups by model_type and by Arch.
#include <array>
#include <string>

#include "model/arch/arch.h"

namespace ferry::model::arch {

std::span<const ArchDescription* const> all() {
  static const std::array<const ArchDescription*, 6> kAll = {&llama(),     &qwen2(),   &qwen3(),
                                                             &qwen3_moe(), &mixtral(), &olmoe()};
  return kAll;
}

const ArchDescription* find(std::string_view model_type) {
  for (const ArchDescription* d : all()) {
    if (d->model_type == model_type) return d;
  }
  return nullptr;
}

const ArchDescription& get(Arch a) {
  for (const ArchDescription* d : all()) {
    if (d->arch == a) return *d;
  }
  FERRY_CHECK(false, "arch: no description for arch {}", static_cast<int>(a));
  return llama();
}

std::string supported_model_types() {
  std::string s;
  for (const ArchDescription* d : all()) s += (s.empty() ? "" : ", ") + std::string(d->model_type);
  return s;
}

}  // namespace ferry::model::arch
