// SPDX-License-Identifier: Apache-2.0
// safetensors reader/writer: round trip for every dtype, and one test per malformed-input class.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include "model/safetensors_writer.h"
#include "unit/model/model_test_util.h"

namespace ferry::model {
namespace {

using testing::raw_safetensors;
using testing::TempDir;
using testing::write_text;

Result<SafetensorsFile> open_raw(const TempDir& dir, const std::string& bytes) {
  const std::string p = dir.file("x.safetensors");
  write_text(p, bytes);
  return SafetensorsFile::open(p);
}

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const std::vector<DType> dtypes = {DType::kF32, DType::kF64, DType::kBF16,
                                     DType::kF16, DType::kI8,  DType::kU8,
                                     DType::kI32, DType::kI64, DType::kBool};
  // Each tensor gets distinct bytes: element i of tensor k has byte pattern (k*31 + i*7 + j).
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<NamedTensor> tensors;
  for (std::size_t k = 0; k < dtypes.size(); ++k) {
    const std::int64_t rows = 3, cols = static_cast<std::int64_t>(k) + 2;
    const std::size_t n = static_cast<std::size_t>(rows * cols) * dtype_size(dtypes[k]);
    std::vector<std::uint8_t> b(n);
    for (std::size_t j = 0; j < n; ++j) b[j] = static_cast<std::uint8_t>(k * 31 + j * 7 + 1);
    if (dtypes[k] == DType::kBool) {
      for (auto& x : b) x &= 1;
    }
    storage.push_back(std::move(b));
    tensors.push_back({"t." + std::string(to_string(dtypes[k])),
                       ConstTensorView::contiguous(storage.back().data(), dtypes[k], Device::kCpu,
                                                   {rows, cols})});
  }
  // A scalar and an empty tensor too.
  const float scalar = 2.5f;
  tensors.push_back(
      {"scalar", ConstTensorView::contiguous(&scalar, DType::kF32, Device::kCpu, {})});
  tensors.push_back(
      {"empty", ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu, {0, 4})});
  const std::string path = dir.file("all.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}, {"note", "x"}}).ok());

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->header().header_bytes % 8, 0u);
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
  EXPECT_EQ(f->header().metadata.at("note"), "x");
  EXPECT_EQ(f->tensors().size(), tensors.size());
  for (const NamedTensor& t : tensors) {
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.view.dtype);
    EXPECT_TRUE(f->aligned(*info)) << t.name;
    auto v = f->view(t.name);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->ndim, t.view.ndim);
    EXPECT_EQ(v->shape_string(), t.view.shape_string());
    EXPECT_EQ(v->bytes(), t.view.bytes());
    if (t.view.bytes() > 0) {
      EXPECT_EQ(std::memcmp(v->data, t.view.data, t.view.bytes()), 0) << t.name;
    }
  }
}

TEST(Safetensors, WriterRejectsDuplicateNames) {
  TempDir dir;
  const float x = 1.0f;
  const auto v = ConstTensorView::contiguous(&x, DType::kF32, Device::kCpu, {1});
  const std::vector<NamedTensor> ts = {{"a", v}, {"a", v}};
  const Status s = write_safetensors(dir.file("d.safetensors"), ts);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("duplicate tensor name a"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors")));
}

TEST(Safetensors, LookupChecksNameDtypeShape) {
  TempDir dir;
  std::vector<float> q(64 * 32, 0.5f);
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const std::vector<NamedTensor> ts = {
      {name, ConstTensorView::contiguous(q.data(), DType::kF32, Device::kCpu, {64, 32})}};
  const std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(write_safetensors(path, ts).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());

  const std::vector<std::int64_t> good = {64, 32}, bad = {64, 64};
  EXPECT_TRUE(f->view(name, DType::kF32, good).ok());

  auto missing = f->view("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.0.self_attn.k_proj.weight"),
            std::string::npos);

  auto wrong_dtype = f->view(name, DType::kBF16, good);
  EXPECT_EQ(wrong_dtype.status().message(),
            "model: tensor " + name + ": expected dtype bf16, found f32 (in " + path + ")");

  auto wrong_shape = f->view(name, DType::kF32, bad);
  EXPECT_EQ(
      wrong_shape.status().message(),
      "model: tensor " + name + ": expected shape [64, 64], found [64, 32] (in " + path + ")");
}

TEST(SafetensorsBad, TruncatedFile) {
  TempDir dir;
  auto f = open_raw(dir, std::string("\x10\x00\x00", 3));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("x.safetensors"), std::string::npos);
  // Empty file too.
  EXPECT_EQ(open_raw(dir, "").status().code(), StatusCode::kCorrupt);
}

TEST(SafetensorsBad, HeaderLengthPastEof) {
  TempDir dir;
  auto f = open_raw(dir, raw_safetensors("{}", "", /*declared_len=*/1000));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("header length 1000 runs past the end"), std::string::npos)
      << f.status().message();
  // A huge declared length must not be trusted (no allocation, no overflow).
  auto g = open_raw(dir, raw_safetensors("{}", "", /*declared_len=*/UINT64_MAX - 1));
  EXPECT_EQ(g.status().code(), StatusCode::kCorrupt);
}

TEST(SafetensorsBad, HeaderNotJson) {
  TempDir dir;
  auto f = open_raw(dir, raw_safetensors("{\"a\": [1, 2", ""));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("not valid JSON"), std::string::npos);
  auto g = open_raw(dir, raw_safetensors("[1, 2]", ""));
  EXPECT_EQ(g.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(g.status().message().find("not a JSON object"), std::string::npos);
}

TEST(SafetensorsBad, DataOffsetsPastEnd) {
  TempDir dir;
  auto f = open_raw(
      dir, raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                           std::string(8, '\0')));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("tensor w: data_offsets [0, 16] past the end of the data "
                                      "region (8 bytes)"),
            std::string::npos)
      << f.status().message();
}

TEST(SafetensorsBad, OverlappingOffsets) {
  TempDir dir;
  auto f =
      open_raw(dir, raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                    std::string(12, '\0')));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("overlap"), std::string::npos) << f.status().message();
}

TEST(Safetensors, GapsAndUnsortedOffsetsAreAllowed) {
  TempDir dir;
  const std::vector<float> a = {1, 2}, b = {3, 4};
  // b first in the file, then 8 bytes of gap, then a.
  const std::string data = bytes_of(b) + std::string(8, '\0') + bytes_of(a);
  auto f = open_raw(
      dir, raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                           data));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto va = f->view("a");
  ASSERT_TRUE(va.ok());
  // "a" starts at byte 16 of the data region, which need not be 4-byte aligned in memory (the
  // header length decides): read it bytewise.
  float a1 = 0;
  std::memcpy(&a1, static_cast<const std::byte*>(va->data) + sizeof(float), sizeof(float));
  EXPECT_EQ(a1, 2.0f);
  EXPECT_EQ(f->tensors().front().name, "b");  // file order
}

TEST(SafetensorsBad, ShapeSizeMismatch) {
  TempDir dir;
  auto f = open_raw(
      dir, raw_safetensors(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})",
                           std::string(8, '\0')));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("shape [2, 3] of bf16 needs 12 bytes"), std::string::npos)
      << f.status().message();
}

TEST(SafetensorsBad, ShapeOverflow) {
  TempDir dir;
  auto f = open_raw(
      dir,
      raw_safetensors(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
          ""));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("overflows"), std::string::npos) << f.status().message();
}

TEST(SafetensorsBad, NegativeOrFractionalShape) {
  TempDir dir;
  auto f = open_raw(
      dir,
      raw_safetensors(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", ""));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  auto g = open_raw(
      dir,
      raw_safetensors(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 0]}})", ""));
  EXPECT_EQ(g.status().code(), StatusCode::kCorrupt);
}

TEST(SafetensorsBad, UnknownDtype) {
  TempDir dir;
  auto f = open_raw(
      dir, raw_safetensors(R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})",
                           std::string(4, '\0')));
  EXPECT_EQ(f.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(f.status().message().find("tensor w: unknown dtype \"F33\""), std::string::npos)
      << f.status().message();
  auto g = open_raw(
      dir, raw_safetensors(R"({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})",
                           std::string(1, '\0')));
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
}

TEST(SafetensorsBad, BadMetadataAndEntries) {
  TempDir dir;
  EXPECT_EQ(open_raw(dir, raw_safetensors(R"({"__metadata__": {"a": 1}})", "")).status().code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(open_raw(dir, raw_safetensors(R"({"w": 3})", "")).status().code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(open_raw(dir, raw_safetensors(R"({"w": {"dtype": "F32", "shape": [0]}})", ""))
                .status()
                .code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(
      open_raw(dir, raw_safetensors(
                        R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", ""))
          .status()
          .code(),
      StatusCode::kCorrupt);
}

TEST(Safetensors, ParsesFromMemory) {
  const std::vector<float> a = {1, 2, 3};
  const std::string bytes = raw_safetensors(
      R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", bytes_of(a));
  auto h = parse_safetensors_header(
      std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), "mem");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_NE(h->find("a"), nullptr);
  EXPECT_EQ(h->find("a")->numel(), 3);
  EXPECT_EQ(h->data_bytes, 12u);
}

}  // namespace
}  // namespace ferry::model
