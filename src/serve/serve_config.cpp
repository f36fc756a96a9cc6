// SPDX-License-Identifier: Apache-2.0
#include "serve/serve_config.h"

namespace ferry::serve {

std::string_view to_string(ExpertMode m) {
  switch (m) {
    case ExpertMode::kResident:
      return "resident";
    case ExpertMode::kStatic:
      return "static";
    case ExpertMode::kCpuExperts:
      return "cpu-experts";
    case ExpertMode::kPaged:
      return "paged";
  }
  return "?";
}

std::string_view to_string(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kLfu:
      return "lfu";
    case EvictionPolicy::kLfru:
      return "lfru";
  }
  return "?";
}

std::string_view to_string(CpuExpertKernel k) {
  switch (k) {
    case CpuExpertKernel::kDefault:
      return "default";
    case CpuExpertKernel::kExact:
      return "exact";
    case CpuExpertKernel::kFast:
      return "fast";
  }
  return "?";
}

Result<ExpertMode> parse_expert_mode(std::string_view s) {
  for (ExpertMode m :
       {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kCpuExperts, ExpertMode::kPaged}) {
    if (s == to_string(m)) return m;
  }
  return invalid_argument("serve: unknown expert mode '{}' (resident, static, cpu-experts, paged)",
                          s);
}

namespace {
// The storage dtypes a serving flag takes (experts, dense weights, K/V): f32 or bf16.
Result<DType> parse_f32_or_bf16(std::string_view what, std::string_view s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  return invalid_argument("serve: unknown {} dtype '{}' (f32, bf16)", what, s);
}
}  // namespace

Result<DType> parse_expert_dtype(std::string_view s) { return parse_f32_or_bf16("expert", s); }
Result<DType> parse_dense_dtype(std::string_view s) { return parse_f32_or_bf16("dense", s); }
Result<DType> parse_kv_dtype(std::string_view s) { return parse_f32_or_bf16("kv", s); }

Result<EvictionPolicy> parse_eviction_policy(std::string_view s) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kLfru}) {
    if (s == to_string(p)) return p;
  }
  return invalid_argument("serve: unknown eviction policy '{}' (lru, lfu, lfru)", s);
}

Result<CpuExpertKernel> parse_cpu_expert_kernel(std::string_view s) {
  if (s == "fast") return CpuExpertKernel::kFast;
  if (s == "exact") return CpuExpertKernel::kExact;
  return invalid_argument("serve: unknown cpu expert kernel '{}' (fast, exact)", s);
}

}  // namespace ferry::serve
