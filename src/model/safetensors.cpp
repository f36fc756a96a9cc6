// SPDX-License-Identifier: Apache-2.0
#include "model/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/json.h"

namespace ferry::model {
namespace {

// Dtypes the safetensors format defines but ferry has no element type for.
constexpr std::array<std::string_view, 12> kKnownUnsupportedDtypes = {
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
    "I16",     "U16",     "U32",     "U64",     "C64",     "F8_E4M3FNUZ"};

std::uint64_t load_le_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// A JSON value that is a non-negative integer (not a float, not a bool).
bool as_u64(const Json& j, std::uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<std::uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    const std::int64_t v = j.get<std::int64_t>();
    if (v < 0) return false;
    *out = static_cast<std::uint64_t>(v);
    return true;
  }
  return false;
}

Result<TensorInfo> parse_entry(const std::string& name, const Json& e, std::uint64_t data_bytes,
                               std::string_view what) {
  if (name.empty()) return corrupt("model: {}: header has a tensor with an empty name", what);
  if (!e.is_object()) return corrupt("model: {}: tensor {}: entry is not an object", what, name);
  TensorInfo t;
  t.name = name;

  const auto dt_it = e.find("dtype");
  if (dt_it == e.end() || !dt_it->is_string()) {
    return corrupt("model: {}: tensor {}: missing or non-string \"dtype\"", what, name);
  }
  const std::string& dt_name = dt_it->get_ref<const std::string&>();
  const auto dt = dtype_from_safetensors(dt_name);
  if (!dt) {
    if (std::find(kKnownUnsupportedDtypes.begin(), kKnownUnsupportedDtypes.end(), dt_name) !=
        kKnownUnsupportedDtypes.end()) {
      return unimplemented("model: {}: tensor {}: dtype {} is not supported by ferry", what, name,
                           dt_name);
    }
    return corrupt(
        "model: {}: tensor {}: unknown dtype \"{}\" (known: F32, F64, BF16, F16, I8, U8, I32, "
        "I64, BOOL)",
        what, name, dt_name);
  }
  t.dtype = *dt;

  const auto sh_it = e.find("shape");
  if (sh_it == e.end() || !sh_it->is_array()) {
    return corrupt("model: {}: tensor {}: missing or non-array \"shape\"", what, name);
  }
  std::uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : *sh_it) {
    std::uint64_t v = 0;
    if (!as_u64(d, &v) || v > static_cast<std::uint64_t>(INT64_MAX)) {
      return corrupt("model: {}: tensor {}: shape entry {} is not a non-negative integer", what,
                     name, d.dump());
    }
    t.shape.push_back(static_cast<std::int64_t>(v));
    if (__builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  std::uint64_t expect_bytes = 0;
  if (overflow ||
      __builtin_mul_overflow(numel, std::uint64_t{dtype_size(t.dtype)}, &expect_bytes)) {
    return corrupt("model: {}: tensor {}: shape {} overflows 64-bit byte count", what, name,
                   shape_string(t.shape));
  }

  const auto off_it = e.find("data_offsets");
  if (off_it == e.end() || !off_it->is_array() || off_it->size() != 2) {
    return corrupt("model: {}: tensor {}: \"data_offsets\" must be an array [begin, end]", what,
                   name);
  }
  if (!as_u64((*off_it)[0], &t.begin) || !as_u64((*off_it)[1], &t.end)) {
    return corrupt("model: {}: tensor {}: data_offsets {} are not non-negative integers", what,
                   name, off_it->dump());
  }
  if (t.begin > t.end) {
    return corrupt("model: {}: tensor {}: data_offsets begin {} > end {}", what, name, t.begin,
                   t.end);
  }
  if (t.end > data_bytes) {
    return corrupt(
        "model: {}: tensor {}: data_offsets [{}, {}] past the end of the data region ({} bytes)",
        what, name, t.begin, t.end, data_bytes);
  }
  if (t.end - t.begin != expect_bytes) {
    return corrupt(
        "model: {}: tensor {}: shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}",
        what, name, shape_string(t.shape), to_string(t.dtype), expect_bytes, t.begin, t.end,
        t.end - t.begin);
  }
  return t;
}

}  // namespace

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  const auto it = by_name.find(std::string(name));
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   std::string_view what) {
  if (file.size() < 8) {
    return corrupt("model: {}: truncated: {} bytes, fewer than the 8-byte header length", what,
                   file.size());
  }
  SafetensorsHeader h;
  h.header_bytes = load_le_u64(file.data());
  if (h.header_bytes > kMaxSafetensorsHeaderBytes) {
    return corrupt("model: {}: header length {} exceeds the {} byte limit", what, h.header_bytes,
                   kMaxSafetensorsHeaderBytes);
  }
  if (h.header_bytes > file.size() - 8) {
    return corrupt("model: {}: header length {} runs past the end of the file ({} bytes)", what,
                   h.header_bytes, file.size());
  }
  h.data_offset = 8 + h.header_bytes;
  h.data_bytes = file.size() - h.data_offset;

  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), h.header_bytes);
  auto parsed = parse_json(text, what);
  if (!parsed.ok()) {
    return corrupt("model: {}: safetensors header is not valid JSON", what);
  }
  const Json& j = *parsed;
  if (!j.is_object()) return corrupt("model: {}: safetensors header is not a JSON object", what);

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return corrupt("model: {}: __metadata__ is not an object", what);
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return corrupt("model: {}: __metadata__ value for key {} is not a string", what, mk);
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(TensorInfo t, parse_entry(key, value, h.data_bytes, what));
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  // Overlap check over non-empty ranges (empty tensors occupy no bytes).
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin == t.end) continue;
    if (prev != nullptr && t.begin < prev->end) {
      return corrupt("model: {}: tensors {} [{}, {}) and {} [{}, {}) overlap", what, prev->name,
                     prev->begin, prev->end, t.name, t.begin, t.end);
    }
    prev = &t;
  }
  for (std::size_t i = 0; i < h.tensors.size(); ++i) h.by_name.emplace(h.tensors[i].name, i);
  return h;
}

Status check_tensor_shape(const TensorInfo& t, std::span<const std::int64_t> shape,
                          std::string_view file) {
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    return invalid_argument("model: tensor {}: expected shape {}, found {} (in {})", t.name,
                            shape_string(shape), shape_string(t.shape), file);
  }
  return {};
}

Status check_tensor(const TensorInfo& t, DType dtype, std::span<const std::int64_t> shape,
                    std::string_view file) {
  if (t.dtype != dtype) {
    return invalid_argument("model: tensor {}: expected dtype {}, found {} (in {})", t.name,
                            to_string(dtype), to_string(t.dtype), file);
  }
  return check_tensor_shape(t, shape, file);
}

Result<ConstTensorView> make_view(const void* data, const TensorInfo& t, std::string_view file) {
  if (t.shape.size() > static_cast<std::size_t>(kMaxDims)) {
    return unimplemented("model: tensor {}: rank {} > {} is not supported (in {})", t.name,
                         t.shape.size(), kMaxDims, file);
  }
  ConstTensorView v;
  v.data = data;
  v.dtype = t.dtype;
  v.device = Device::kCpu;
  v.ndim = static_cast<int>(t.shape.size());
  std::int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = s;
    s *= t.shape[i];
  }
  return v;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  return from_mapping(std::move(map));
}

Result<SafetensorsFile> SafetensorsFile::from_mapping(MappedFile map) {
  SafetensorsFile f;
  FERRY_ASSIGN_OR_RETURN(f.header_, parse_safetensors_header(map.bytes(), map.path()));
  f.map_ = std::move(map);
  return f;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  return map_.bytes().subspan(header_.data_offset + t.begin, t.size_bytes());
}

bool SafetensorsFile::aligned(const TensorInfo& t) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(bytes(t).data());
  return addr % dtype_size(t.dtype) == 0;
}

Result<ConstTensorView> SafetensorsFile::view(const TensorInfo& t) const {
  return make_view(bytes(t).data(), t, path());
}

Result<ConstTensorView> SafetensorsFile::view(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return not_found("model: tensor {} not found in {}", name, path());
  return view(*t);
}

Result<ConstTensorView> SafetensorsFile::view(std::string_view name, DType dtype,
                                              std::span<const std::int64_t> shape) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return not_found("model: tensor {} not found in {}", name, path());
  FERRY_TRY(check_tensor(*t, dtype, shape, path()));
  return view(*t);
}

}  // namespace ferry::model
