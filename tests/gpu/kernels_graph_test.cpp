// SPDX-License-Identifier: Apache-2.0
// mem::Graph on a CUDA stream around backend ops (rms_norm -> gemm -> swiglu -> add, a slice of a
// decoder layer): after an eager warm-up, the captured graph replayed on new input contents
// gives the same bits as the eager ops on those contents, replays are repeatable, and a capture
// whose function fails returns that error and leaves the stream usable.
#include "mem/graph.h"

#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {
namespace {

constexpr DType kBf = DType::kBF16;

class KernelsGraph : public CudaTest {};

TEST_F(KernelsGraph, ReplayEqualsEagerOnNewInputs) {
  const std::int64_t t = 96, c = 512, f = 1024;
  DeviceTensor x(random_tensor({t, c}, kBf, 1)), nw(random_tensor({c}, kBf, 2, 0.5, 1.5)),
      wg(random_tensor({f, c}, kBf, 3, -0.05, 0.05)),
      wu(random_tensor({f, c}, kBf, 4, -0.05, 0.05)),
      wd(random_tensor({c, f}, kBf, 5, -0.05, 0.05));
  DeviceTensor h(std::vector<std::int64_t>{t, c}, kBf), g(std::vector<std::int64_t>{t, f}, kBf),
      u(std::vector<std::int64_t>{t, f}, kBf), a(std::vector<std::int64_t>{t, f}, kBf),
      d(std::vector<std::int64_t>{t, c}, kBf), y(std::vector<std::int64_t>{t, c}, kBf);
  auto layer = [&]() -> Status {
    FERRY_TRY(cuda().rms_norm({.out = h.view(), .in = x.cview(), .weight = nw.cview()}, stream()));
    FERRY_TRY(
        cuda().gemm({.out = g.view(), .a = h.cview(), .b = wg.cview(), .trans_b = true}, stream()));
    FERRY_TRY(
        cuda().gemm({.out = u.view(), .a = h.cview(), .b = wu.cview(), .trans_b = true}, stream()));
    FERRY_TRY(cuda().swiglu({.out = a.view(), .gate = g.cview(), .up = u.cview()}, stream()));
    FERRY_TRY(
        cuda().gemm({.out = d.view(), .a = a.cview(), .b = wd.cview(), .trans_b = true}, stream()));
    return cuda().add({.out = y.view(), .a = x.cview(), .b = d.cview()}, stream());
  };
  // Eager warm-up: per-stream GEMM workspace and autotuning happen outside the capture.
  FERRY_ASSERT_OK(layer());
  sync();
  const HostTensor y_first = y.download();

  auto graph = mem::Graph::capture(stream(), layer);
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  sync();
  EXPECT_TRUE(same_bits(y_first, y.download())) << "capture must not execute";

  x.upload(random_tensor({t, c}, kBf, 11));
  FERRY_ASSERT_OK(graph->launch(stream()));
  sync();
  const HostTensor y_graph = y.download();
  EXPECT_FALSE(same_bits(y_first, y_graph)) << "the replay did not see the new input";
  FERRY_ASSERT_OK(layer());
  sync();
  EXPECT_TRUE(same_bits(y_graph, y.download())) << "graph replay differs from eager";
  for (int i = 0; i < 5; ++i) FERRY_ASSERT_OK(graph->launch(stream()));
  sync();
  EXPECT_TRUE(same_bits(y_graph, y.download()));
}

TEST_F(KernelsGraph, FailedCaptureReturnsItsErrorAndTheStreamStillWorks) {
  DeviceTensor x(random_tensor({4, 64}, kBf, 1)), w(random_tensor({64}, kBf, 2)),
      y(std::vector<std::int64_t>{4, 64}, kBf);
  auto r = mem::Graph::capture(stream(), [&]() -> Status {
    FERRY_TRY(cuda().rms_norm({.out = y.view(), .in = x.cview(), .weight = w.cview()}, stream()));
    return invalid_argument("stop here");
  });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stop here"), std::string::npos);
  FERRY_ASSERT_OK(
      cuda().rms_norm({.out = y.view(), .in = x.cview(), .weight = w.cview()}, stream()));
  sync();
}

}  // namespace
}  // namespace ferry::testing
