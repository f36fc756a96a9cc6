// SPDX-License-Identifier: Apache-2.0
// LinkEngine on a machine without a GPU (the paced copy stream itself is tested on the device:
// tests/gpu/serve_gpu_test.cpp ServeLinkPace.*): it forwards and counts every copy, adds graph
// replays' bytes, computes a chunk's paced time rounded up (never faster than the rate), and
// refuses pacing without a CUDA stream, with a zero chunk or a rate that is not a number; the CPU
// engine refuses link_pace_gbps (its emulated link has mem/link_pacer.h); a CPU engine reports no
// CUDA graph activity.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "serve/engine.h"
#include "serve/link_engine.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

// The host transfer engine is a process-wide singleton; this forwards to it without owning it.
struct HostForward final : mem::TransferEngine {
  Device device() const override { return Device::kCpu; }
  Status copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
              mem::Stream& stream) override {
    return mem::host_transfer_engine().copy(dst, src, bytes, kind, stream);
  }
  Status zero(void* dst, std::size_t bytes, mem::Stream& stream) override {
    return mem::host_transfer_engine().zero(dst, bytes, stream);
  }
};

TEST(LinkEngine, ForwardsAndCountsCopiesAndReplays) {
  auto e = LinkEngine::create(std::make_unique<HostForward>());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_FALSE((*e)->paced());
  std::vector<char> a(1000, 7), b(1000, 0);
  ASSERT_TRUE((*e)->h2d(b.data(), a.data(), 600, mem::Stream::host()).ok());
  EXPECT_EQ(b[599], 7);
  EXPECT_EQ(b[600], 0);
  ASSERT_TRUE((*e)->d2h(b.data(), a.data(), 10, mem::Stream::host()).ok());
  (*e)->count_replayed(mem::CopyKind::kHostToDevice, 400);
  (*e)->count_replayed(mem::CopyKind::kDeviceToDevice, 8);
  EXPECT_EQ((*e)->counters().h2d_bytes.load(), 1000u);
  EXPECT_EQ((*e)->counters().d2h_bytes.load(), 10u);
  EXPECT_EQ((*e)->counters().d2d_bytes.load(), 8u);
  EXPECT_EQ((*e)->pace_stats().copies, 0u);
}

TEST(LinkEngine, PacedChunkTimeIsRoundedUp) {
  EXPECT_EQ(link_pace_ns(24'000, 24.0), 1000u);  // 24 kB at 24 GB/s: 1 us
  EXPECT_EQ(link_pace_ns(24'001, 24.0), 1001u);  // never under bytes / rate
  EXPECT_EQ(link_pace_ns(16u << 20, 24.0), 699051u);
  EXPECT_EQ(link_pace_ns(1, 1e4), 1u);
  for (std::size_t bytes : {1ul, 4095ul, 9437184ul, 1207959552ul}) {
    for (double gbps : {0.5, 12.0, 24.0, 55.3}) {
      EXPECT_GE(double(link_pace_ns(bytes, gbps)) * gbps, double(bytes)) << bytes << " " << gbps;
    }
  }
}

TEST(LinkEngine, PacingNeedsACudaStreamAChunkAndARate) {
  mem::Stream host = mem::Stream::host();
  auto no_stream = LinkEngine::create(std::make_unique<HostForward>(), {.gbps = 24});
  ASSERT_FALSE(no_stream.ok());
  EXPECT_EQ(no_stream.status().code(), StatusCode::kInvalidArgument);
  auto host_stream =
      LinkEngine::create(std::make_unique<HostForward>(), {.gbps = 24, .stream = &host});
  ASSERT_FALSE(host_stream.ok());
  EXPECT_NE(host_stream.status().message().find("CUDA"), std::string::npos)
      << host_stream.status().message();
  auto zero_chunk = LinkEngine::create(std::make_unique<HostForward>(),
                                       {.gbps = 24, .chunk_bytes = 0, .stream = &host});
  EXPECT_EQ(zero_chunk.status().code(), StatusCode::kInvalidArgument);
  auto nan = LinkEngine::create(std::make_unique<HostForward>(),
                                {.gbps = std::numeric_limits<double>::quiet_NaN()});
  EXPECT_EQ(nan.status().code(), StatusCode::kInvalidArgument);
  auto inf = LinkEngine::create(std::make_unique<HostForward>(),
                                {.gbps = std::numeric_limits<double>::infinity()});
  EXPECT_EQ(inf.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkEngine::create(nullptr).status().code(), StatusCode::kInvalidArgument);
  // Off (<= 0) needs nothing.
  EXPECT_TRUE(LinkEngine::create(std::make_unique<HostForward>(), {.gbps = 0}).ok());
}

TEST(LinkEngine, CpuEngineRefusesCudaPacingAndReportsNoGraphs) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  EngineConfig cfg;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  cfg.link_pace_gbps = 24;
  auto refused = Engine::create(m->geometry, m->params, cfg);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  cfg.link_pace_gbps = 0;
  auto eng = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 4;
  ASSERT_TRUE(testing::run_engine(**eng, {r}).ok());
  EXPECT_EQ((*eng)->graph_stats().eligible_steps, 0u);
  EXPECT_EQ((*eng)->graph_stats().captures + (*eng)->graph_stats().replays, 0u);
  EXPECT_EQ((*eng)->transfer_engine(), nullptr);
}

}  // namespace
}  // namespace ferry::serve
