// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (kernels/cuda/pdl.cuh, on by default on sm_90+): a chain of
// dependent decode kernels — rms_norm, the small-m GEMM, each reading the previous one's output and
// overwriting what the one before it read — launched back to back (each kernel may be scheduled
// while its predecessor drains), and the same chain captured in a CUDA graph and replayed, give
// exactly the bits of the chain run with a stream synchronize after every launch (where nothing can
// overlap). A kernel that touched memory before its pdl_wait() would read a stale input or clobber
// one still being read, and the bits would differ. With FERRY_PDL=0 (or a device below sm_90) the
// test checks the same equality over plain launches and says that PDL was off. Skips, saying so,
// without a CUDA device.
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "kernels/cuda/launchers.h"
#include "mem/graph.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry {
namespace {

using kernels::cuda::Elt;
using testing::CudaTest;
using testing::DeviceBuf;

class KernelsPdl : public CudaTest {};

constexpr std::int64_t kC = 2048, kRows = 2, kSteps = 48;

TEST_F(KernelsPdl, DependentChainGivesTheSerializedBits) {
  std::cout << "[kernels_pdl] programmatic dependent launch "
            << (kernels::cuda::pdl_enabled() ? "on" : "off (FERRY_PDL=0 or device < sm_90)")
            << "\n";
  std::mt19937 rng(39);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x0(static_cast<std::size_t>(kRows * kC)), w(static_cast<std::size_t>(kC * kC));
  std::vector<float> g(static_cast<std::size_t>(kC));
  for (float& v : x0) v = nd(rng);
  for (float& v : w) v = nd(rng) * 0.02f;
  for (float& v : g) v = 1.0f + 0.1f * nd(rng);
  DeviceBuf dw(w.size() * 4), dg(g.size() * 4), da(x0.size() * 4), db(x0.size() * 4);
  DeviceBuf drstd(kRows * 4);
  testing::up(dw.p, w);
  testing::up(dg.p, g);

  // a -> rms_norm -> b -> small-m GEMM -> a, kSteps times; a holds the result.
  auto chain = [&](bool sync_each) -> cudaError_t {
    for (std::int64_t s = 0; s < kSteps; ++s) {
      cudaError_t e = kernels::cuda::launch_rms_norm(Elt::kF32, db.p, drstd.as<float>(), da.p, dg.p,
                                                     kRows, kC, 1e-6f, raw_stream());
      if (e != cudaSuccess) return e;
      if (sync_each && (e = cudaStreamSynchronize(raw_stream())) != cudaSuccess) return e;
      e = kernels::cuda::launch_small_m_gemm_f32(da.as<float>(), db.as<float>(), dw.as<float>(),
                                                 nullptr, kRows, kC, kC, kC, kC, kC, 1.0f, 0.0f,
                                                 raw_stream());
      if (e != cudaSuccess) return e;
      if (sync_each && (e = cudaStreamSynchronize(raw_stream())) != cudaSuccess) return e;
    }
    return cudaSuccess;
  };

  testing::up(da.p, x0);
  ASSERT_EQ(chain(/*sync_each=*/true), cudaSuccess);
  sync();
  const auto want = testing::down<float>(da.p, x0.size());

  for (int rep = 0; rep < 3; ++rep) {
    testing::up(da.p, x0);
    ASSERT_EQ(chain(/*sync_each=*/false), cudaSuccess);
    sync();
    ASSERT_TRUE(testing::same_bits(testing::down<float>(da.p, x0.size()), want))
        << "back-to-back launches, repetition " << rep;
  }

  auto graph = mem::Graph::capture(stream(), [&]() -> Status {
    return chain(false) == cudaSuccess ? ok_status() : internal_error("chain launch failed");
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  for (int rep = 0; rep < 3; ++rep) {
    testing::up(da.p, x0);
    FERRY_ASSERT_OK(graph->launch(stream()));
    sync();
    ASSERT_TRUE(testing::same_bits(testing::down<float>(da.p, x0.size()), want))
        << "graph replay " << rep;
  }
}

}  // namespace
}  // namespace ferry
