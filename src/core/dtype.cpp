// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include <cmath>

namespace ferry {

std::size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view to_string(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

std::string_view to_safetensors(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
  if (n == "F32") return DType::kF32;
  if (n == "F64") return DType::kF64;
  if (n == "BF16") return DType::kBF16;
  if (n == "F16") return DType::kF16;
  if (n == "I8") return DType::kI8;
  if (n == "U8") return DType::kU8;
  if (n == "I32") return DType::kI32;
  if (n == "I64") return DType::kI64;
  if (n == "BOOL") return DType::kBool;
  return std::nullopt;
}

bool is_float(DType dt) {
  return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kBF16 || dt == DType::kF16;
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: value = man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

std::uint16_t f32_to_f16(float f) {
  const std::uint32_t b = f32_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  const std::uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in f16: round |f| / 2^-24 to nearest even integer.
    const float a = bits_to_f32(abs);
    const float scaled = a * 16777216.0f;    // exact: a power-of-two scale
    const float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r));
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t v = abs - 0x38000000u;  // exponent 127 -> 15
  const std::uint32_t lsb = (v >> 13) & 1u;
  v += 0x0fffu + lsb;
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

namespace {
double load_f(const void* p, DType dt, std::size_t i) {
  switch (dt) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    default:
      return 0.0;
  }
}
void store_f(void* p, DType dt, std::size_t i, double v) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    // Via f32 first: f64 -> f32 -> bf16 can double-round, but every source we convert from is
    // f32-representable in practice; the f32 path is the one PyTorch uses for .to(bfloat16).
    case DType::kBF16:
      static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DType::kF16:
      static_cast<std::uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      break;
    default:
      break;
  }
}
}  // namespace

bool convert_elements(const void* src, DType src_dt, void* dst, DType dst_dt, std::size_t n) {
  if (src_dt == dst_dt) {
    std::memmove(dst, src, n * dtype_size(src_dt));
    return true;
  }
  if (!is_float(src_dt) || !is_float(dst_dt)) return false;
  if (src_dt == DType::kBF16 && dst_dt == DType::kF32) {
    const auto* s = static_cast<const std::uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return true;
  }
  if (src_dt == DType::kF32 && dst_dt == DType::kBF16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return true;
  }
  for (std::size_t i = 0; i < n; ++i) store_f(dst, dst_dt, i, load_f(src, src_dt, i));
  return true;
}

}  // namespace ferry
