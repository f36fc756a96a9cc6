// SPDX-License-Identifier: Apache-2.0
// Sharded checkpoints through model.safetensors.index.json, and their failure modes.
#include "model/checkpoint.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/safetensors_writer.h"
#include "unit/model/model_test_util.h"

namespace ferry::model {
namespace {

using testing::TempDir;
using testing::write_text;

struct TwoShards {
  TempDir dir;
  std::vector<float> a{1, 2, 3, 4}, b{5, 6}, c{7};
  TwoShards() {
    const std::vector<NamedTensor> s1 = {
        {"a", ConstTensorView::contiguous(a.data(), DType::kF32, Device::kCpu, {2, 2})},
        {"b", ConstTensorView::contiguous(b.data(), DType::kF32, Device::kCpu, {2})}};
    const std::vector<NamedTensor> s2 = {
        {"c", ConstTensorView::contiguous(c.data(), DType::kF32, Device::kCpu, {1})}};
    FERRY_CHECK_OK(write_safetensors(dir.file("model-00001-of-00002.safetensors"), s1));
    FERRY_CHECK_OK(write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2));
  }
  void write_index(const std::string& weight_map) const {
    write_text(dir.file("model.safetensors.index.json"),
               R"({"metadata": {"total_size": 28}, "weight_map": )" + weight_map + "}");
  }
};

TEST(Checkpoint, OpensShardedIndex) {
  TwoShards t;
  t.write_index(R"({"a": "model-00001-of-00002.safetensors",
                    "b": "model-00001-of-00002.safetensors",
                    "c": "model-00002-of-00002.safetensors"})");
  auto ck = Checkpoint::open(t.dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->shards().size(), 2u);
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c"}));
  const std::vector<std::int64_t> shape = {1};
  auto c = ck->view("c", DType::kF32, shape);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->as<float>()[0], 7.0f);
  auto a = ck->view("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->as<float>()[3], 4.0f);
  EXPECT_EQ(ck->view("zz").status().code(), StatusCode::kNotFound);
}

TEST(Checkpoint, IndexPointingToMissingShard) {
  TwoShards t;
  t.write_index(R"({"a": "model-00001-of-00002.safetensors",
                    "c": "model-00009-of-00009.safetensors"})");
  auto ck = Checkpoint::open(t.dir.path());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ck.status().message().find("model-00009-of-00009.safetensors"), std::string::npos)
      << ck.status().message();
  EXPECT_NE(ck.status().message().find("does not exist"), std::string::npos);
}

TEST(Checkpoint, IndexNamesTensorNotInItsShard) {
  TwoShards t;
  t.write_index(R"({"a": "model-00002-of-00002.safetensors",
                    "c": "model-00002-of-00002.safetensors"})");
  auto ck = Checkpoint::open(t.dir.path());
  EXPECT_EQ(ck.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ck.status().message().find("tensor a"), std::string::npos) << ck.status().message();
}

TEST(Checkpoint, DuplicateTensorAcrossShardsIsReported) {
  TwoShards t;
  const std::vector<NamedTensor> s3 = {
      {"c", ConstTensorView::contiguous(t.c.data(), DType::kF32, Device::kCpu, {1})},
      {"e", ConstTensorView::contiguous(t.c.data(), DType::kF32, Device::kCpu, {1})}};
  FERRY_CHECK_OK(write_safetensors(t.dir.file("extra.safetensors"), s3));
  t.write_index(R"({"a": "model-00001-of-00002.safetensors",
                    "c": "model-00002-of-00002.safetensors",
                    "e": "extra.safetensors"})");
  auto ck = Checkpoint::open(t.dir.path());
  EXPECT_EQ(ck.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(ck.status().message().find("tensor c appears in two shards"), std::string::npos)
      << ck.status().message();
}

TEST(Checkpoint, BadIndexFiles) {
  TwoShards t;
  write_text(t.dir.file("model.safetensors.index.json"), "{not json");
  EXPECT_EQ(Checkpoint::open(t.dir.path()).status().code(), StatusCode::kCorrupt);
  write_text(t.dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  auto no_map = Checkpoint::open(t.dir.path());
  EXPECT_EQ(no_map.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(no_map.status().message().find("weight_map"), std::string::npos);
  t.write_index(R"({"a": "../model-00001-of-00002.safetensors"})");
  EXPECT_EQ(Checkpoint::open(t.dir.path()).status().code(), StatusCode::kCorrupt);
  t.write_index(R"({"a": 3})");
  EXPECT_EQ(Checkpoint::open(t.dir.path()).status().code(), StatusCode::kCorrupt);
}

TEST(Checkpoint, EmptyFolderIsNotFound) {
  TempDir dir;
  auto ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ck.status().message().find("model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace ferry::model
