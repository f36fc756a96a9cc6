// SPDX-License-Identifier: Apache-2.0
// mem::Graph on the host stream: capture does not run the function, each launch runs it once,
// moved-from and default graphs are empty, and a graph refuses a stream of another device.
// CUDA graphs are tested in tests/gpu/kernels_graph_test.cpp.
#include "mem/graph.h"

#include <gtest/gtest.h>

namespace ferry::mem {
namespace {

TEST(HostGraph, CaptureRecordsAndEachLaunchReplaysOnce) {
  int runs = 0;
  auto g = Graph::capture(Stream::host(), [&] {
    ++runs;
    return ok_status();
  });
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(runs, 0);  // like a CUDA capture, recording does not execute
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(g->launch(Stream::host()).ok());
  EXPECT_EQ(runs, 3);
}

TEST(HostGraph, LaunchReturnsTheFunctionsError) {
  auto g = Graph::capture(Stream::host(), [] { return io_error("disk gone"); });
  ASSERT_TRUE(g.ok());
  const Status s = g->launch(Stream::host());
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_NE(s.message().find("disk gone"), std::string::npos);
}

TEST(HostGraph, EmptyAndMovedFromGraphsRefuseToLaunch) {
  Graph empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.launch(Stream::host()).code(), StatusCode::kInvalidArgument);
  auto g = Graph::capture(Stream::host(), [] { return ok_status(); });
  ASSERT_TRUE(g.ok());
  Graph moved = std::move(*g);
  EXPECT_FALSE(moved.empty());
  EXPECT_TRUE(g->empty());
  EXPECT_EQ(g->launch(Stream::host()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(moved.launch(Stream::host()).ok());
}

TEST(HostGraph, RefusesAStreamOfAnotherDevice) {
  auto g = Graph::capture(Stream::host(), [] { return ok_status(); });
  ASSERT_TRUE(g.ok());
  Stream cuda_like(Device::kCuda, 0, nullptr);  // never used: the device check comes first
  const Status s = g->launch(cuda_like);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.message();
}

TEST(HostGraph, CaptureWithoutAFunctionIsAnError) {
  EXPECT_EQ(Graph::capture(Stream::host(), nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::mem
