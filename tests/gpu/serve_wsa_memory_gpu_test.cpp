// SPDX-License-Identifier: Apache-2.0
// The GPU memory a resizable CUDA engine really holds (MV-WSA, docs/serve_wsa.md "Memory of a
// resizable engine"): on a built-in MoE whose maxima are large (4 layers x 32 experts of 6 MiB =
// 768 MiB of slots, a KV reservation of 512 MiB) but whose live pools are small, the GPU memory
// cudaMemGetInfo measures
//   - after create is about device_held_bytes() (live pools + a granule per layer + weights and
//     scratch), far below the maxima the pools are laid out for;
//   - moves with every resize by what device_held_bytes() moves (grow: taken, shrink: given
//     back), within the driver's own rounding;
// and the resized engine gives the token ids and logits bits of a fixed engine at the starting
// caps. Skips without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "scoped_env.h"
#include "serve/builtin_model.h"
#include "serve/engine.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;

class ServeWsaMemoryCuda : public CudaTest {};

std::ptrdiff_t device_used() {
  std::size_t free_b = 0, total_b = 0;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  return std::ptrdiff_t(total_b - free_b);
}

std::vector<GenerationRequest> requests(int vocab) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::int32_t> p;
    for (int j = 0; j < 8 + 6 * i; ++j) p.push_back((j * 29 + i * 7 + 1) % vocab);
    reqs.push_back({.prompt = p, .max_new_tokens = 12 + i});
  }
  reqs[3].sampling = {.temperature = 0.7f, .top_k = 16, .seed = 5};
  return reqs;
}

TEST_F(ServeWsaMemoryCuda, HeldMemoryFollowsResizesNotTheMaxima) {
  const BuiltinMoeSpec spec{.layers = 4,
                            .hidden = 1024,
                            .heads = 8,
                            .kv_heads = 2,
                            .head_dim = 128,
                            .experts = 32,
                            .top_k = 4,
                            .expert_width = 512,
                            .parallel_init = true};
  auto mr = make_builtin_moe_packed(spec, 17, DType::kF32);
  ASSERT_TRUE(mr.ok()) << mr.status().to_string();
  const BuiltinModel& m = **mr;
  const model::DecoderGeometry& geo = m.geometry;
  const auto reqs = requests(geo.vocab);
  constexpr int kStartCap = 6;
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = kStartCap;
  cfg.pager.host_store = m.experts.get();
  cfg.max_batch_tokens = 16;
  cfg.max_running = 3;
  cfg.kv.block_tokens = 16;
  cfg.kv.budget_bytes = 16 << 20;
  cfg.kv_preempt = true;
  testing::RunRecord want;
  {
    auto fixed = Engine::create(geo, m.params, cfg, cuda());
    ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
    auto w = testing::run_engine(**fixed, reqs);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    want = *w;
  }
  const std::size_t eb = m.experts->expert_bytes();
  const std::size_t slot_max = std::size_t(geo.layers) * std::size_t(geo.experts) * eb;
  EngineConfig live_cfg = cfg;
  live_cfg.pager.resizable = true;
  live_cfg.kv.max_budget_bytes = 512 << 20;
  const std::ptrdiff_t before = device_used();
  // Granules, as a GPU with VMM gives them: FERRY_VMM=off in the caller's environment would
  // back the pools whole up front (docs/mem_virtual_region.md), which is not what this measures.
  Result<std::unique_ptr<Engine>> er = [&] {
    ferry::testing::ScopedEnv env("FERRY_VMM", nullptr);
    return Engine::create(geo, m.params, live_cfg, cuda());
  }();
  ASSERT_TRUE(er.ok()) << er.status().to_string();
  Engine& eng = **er;
  if (eng.pools_backed_up_front()) {
    GTEST_SKIP()
        << "this device lacks CUDA virtual memory management: the pools are held whole "
           "(WsaMemory.WithoutVmmThePoolsHoldTheirMaximaAndServeTheSameTokens covers that)";
  }
  const std::ptrdiff_t created = device_used() - before;
  const std::size_t reserved = eng.pool_reserved_bytes();
  std::cout << "[serve_gpu] resizable engine: measured " << created << " B, held "
            << eng.device_held_bytes() << " B, budget charge " << eng.device_budget().bytes_used()
            << " B, pools reserved " << reserved << " B\n";
  EXPECT_GE(reserved, slot_max + (512u << 20) - (16u << 20));
  // Weights, scratch, cuBLAS workspace and context growth are outside the pools; the pools'
  // maxima (~1.25 GiB) are far above what a committed-only engine holds.
  constexpr std::ptrdiff_t kSlack = 96 << 20;
  EXPECT_LE(created, std::ptrdiff_t(eng.device_held_bytes()) + kSlack);
  EXPECT_LT(created, std::ptrdiff_t(reserved) / 2) << "the engine holds its maxima";
  // What the engine holds beside the pools (weights, scratch), and the largest pools of the plan.
  const std::size_t beside =
      eng.device_held_bytes() - eng.experts().pager()->held_bytes() - eng.kv().held_bytes();
  const std::size_t kb = eng.kv().block_bytes();
  const int plan[][2] = {{24, 64}, {8, 1024}, {32, 32}, {4, 256}, {12, 128}};
  std::size_t max_pools = std::size_t(kStartCap) * std::size_t(geo.layers) * eb +
                          std::size_t(eng.kv().num_blocks()) * kb;
  for (const auto& p : plan) {
    max_pools = std::max(max_pools,
                         std::size_t(p[0]) * std::size_t(geo.layers) * eb + std::size_t(p[1]) * kb);
  }

  // Resizes while serving: measured GPU memory moves as held bytes move.
  constexpr std::ptrdiff_t kRound = 24 << 20;  // the driver's rounding of cudaMemGetInfo
  int resizes = 0;
  std::ptrdiff_t worst = 0;
  const auto resize = [&](int cap, int blocks) {
    const std::ptrdiff_t used0 = device_used(), held0 = std::ptrdiff_t(eng.device_held_bytes());
    std::vector<int> caps(std::size_t(geo.layers), 0);
    for (int l = 0; l < geo.layers; ++l) caps[std::size_t(l)] = geo.layer_is_moe[l] ? cap : 0;
    const Status st = eng.resize_pools(caps, std::max(blocks, eng.max_request_blocks()));
    EXPECT_TRUE(st.ok()) << st.to_string();
    const std::ptrdiff_t d_used = device_used() - used0;
    const std::ptrdiff_t d_held = std::ptrdiff_t(eng.device_held_bytes()) - held0;
    worst = std::max(worst, std::abs(d_used - d_held));
    EXPECT_LE(std::abs(d_used - d_held), kRound)
        << "cap " << cap << " blocks " << blocks << ": measured " << d_used << " held " << d_held;
    ++resizes;
  };
  auto got_r = [&]() -> Result<testing::RunRecord> {
    testing::RunRecord rec;
    eng.set_logits_observer([&rec](RequestId id, int, std::span<const float> row) {
      rec.logits[id].emplace_back(row.begin(), row.end());
    });
    std::vector<RequestId> ids;
    for (const auto& q : reqs) {
      FERRY_ASSIGN_OR_RETURN(RequestId id, eng.submit(q));
      ids.push_back(id);
    }
    for (int step = 0; !eng.idle(); ++step) {
      if (step % 2 == 1 && step / 2 < 5) resize(plan[step / 2][0], plan[step / 2][1]);
      FERRY_TRY(eng.step().status());
    }
    for (RequestId id : ids) {
      FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng.take_output(id));
      rec.tokens[id] = out.tokens;
    }
    eng.set_logits_observer(nullptr);
    return rec;
  }();
  ASSERT_TRUE(got_r.ok()) << got_r.status().to_string();
  EXPECT_EQ(resizes, 5) << "the run ended before every resize: the test lost its teeth";
  EXPECT_EQ(got_r->tokens, want.tokens);
  testing::expect_same_bits(*got_r, want, "resized vs fixed");
  std::cout << "[serve_gpu] " << resizes << " resizes, worst |measured - held| delta " << worst
            << " B, held peak " << eng.device_held_peak_bytes() << " B\n";
  // At most a granule per layer and pool above the largest split (2 x 32 MiB: any granule).
  EXPECT_LE(eng.device_held_peak_bytes(),
            beside + max_pools + 2 * std::size_t(geo.layers) * (std::size_t{32} << 20));
}

}  // namespace
}  // namespace ferry::serve
