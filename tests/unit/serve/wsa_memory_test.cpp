// SPDX-License-Identifier: Apache-2.0
// The memory a resizable engine really holds (MV-WSA, docs/serve_wsa.md "Memory of a resizable
// engine"): its expert slots and KV blocks live in virtual reservations (mem::VirtualRegion) of
// which only the live caps / blocks are committed, so
//   - through grows and shrinks of both pools while serving, each pool's committed bytes are its
//     live size rounded up to a granule per layer, the engine's held bytes never pass the budget
//     by more than that rounding, the slot and KV addresses never move, and the tokens equal a
//     fixed engine's;
//   - with the default 2 MiB granule the reservation is the maxima (E slots per layer, the whole
//     budget of blocks) while what is held stays within a granule per layer of the live bytes.
#include <algorithm>
#include <optional>
#include <vector>

#include "scoped_env.h"
#include "serve/builtin_model.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

constexpr int kBlockTokens = 4;
constexpr std::size_t kPage = 4096;

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::int32_t> p;
    for (int j = 0; j < 6 + 5 * i; ++j) p.push_back((j * 41 + i * 13 + 3) % 256);
    reqs.push_back({.prompt = p, .max_new_tokens = 10 + i});
  }
  return reqs;
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

EngineConfig resizable_config(std::size_t budget, std::size_t kv_bytes, std::size_t gran) {
  EngineConfig cfg;
  cfg.max_batch_tokens = 24;
  cfg.max_running = 3;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 4;
  cfg.pager.resizable = true;
  cfg.pager.granularity_bytes = gran;
  cfg.kv = {.block_tokens = kBlockTokens,
            .budget_bytes = kv_bytes,
            .max_budget_bytes = budget,
            .granularity_bytes = gran};
  cfg.device_budget_bytes = budget;
  return cfg;
}

Result<std::map<RequestId, std::vector<std::int32_t>>> run(
    Engine& eng, const std::vector<GenerationRequest>& reqs,
    const std::function<void(int)>& at_step = {}) {
  FERRY_ASSIGN_OR_RETURN(const std::vector<RequestId> ids,
                         testing::submit_and_step(eng, reqs, at_step));
  std::map<RequestId, std::vector<std::int32_t>> tokens;
  for (RequestId id : ids) {
    FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng.take_output(id));
    tokens[id] = out.tokens;
  }
  return tokens;
}

// What a fixed engine at the resized engines' starting caps (4 slots per layer) generates, and
// its expert and KV block sizes.
struct FixedRun {
  std::map<RequestId, std::vector<std::int32_t>> tokens;
  std::size_t expert_bytes = 0, block_bytes = 0;
};
Result<FixedRun> fixed_engine(const BuiltinModel& m, const std::vector<GenerationRequest>& reqs) {
  EngineConfig cfg;
  cfg.max_batch_tokens = 24;
  cfg.max_running = 3;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 4;
  cfg.kv = {.block_tokens = kBlockTokens, .budget_bytes = 8 << 20};
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> eng, Engine::create(m.geometry, m.params, cfg));
  FixedRun r{.expert_bytes = eng->experts().store()->expert_bytes(),
             .block_bytes = eng->kv().block_bytes()};
  FERRY_ASSIGN_OR_RETURN(r.tokens, run(*eng, reqs));
  return r;
}

// The resize schedule the memory tests serve through (grows, shrinks, uneven caps, KV moving
// used blocks down); nullopt at the steps where it does not resize.
std::optional<Status> scheduled_resize(Engine& eng, const model::DecoderGeometry& geo, int step) {
  const auto caps = [&](std::vector<int> per_moe) {
    std::vector<int> c(std::size_t(geo.layers), 0);
    for (int l = 0, i = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l]) c[std::size_t(l)] = per_moe[std::size_t(i++ % int(per_moe.size()))];
    }
    return c;
  };
  switch (step) {
    case 2:  // experts grow to 6, KV stays
      return eng.resize_pools(caps({6}), 40);
    case 4:  // experts shrink to 4, KV grows to 60
      return eng.resize_pools(caps({4}), 60);
    case 6:  // uneven caps, KV shrinks (used blocks move down first)
      return eng.resize_pools(caps({8, 4, 4, 6}), 38);
    case 8:  // both shrink
      return eng.resize_pools(caps({5}), 37);
    case 10:  // both grow
      return eng.resize_pools(caps({7, 6}), 45);
    default:
      return std::nullopt;
  }
}

TEST(WsaMemory, CommittedBytesFollowCapsAndBlocksAndStayWithinTheBudget) {
  auto m = testing::tiny_builtin_moe(31);
  ASSERT_TRUE(m);
  const model::DecoderGeometry& geo = m->geometry;
  const auto reqs = requests();
  auto fixed = fixed_engine(*m, reqs);  // the engine the resized one must equal
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  const std::map<RequestId, std::vector<std::int32_t>>& want = fixed->tokens;
  const std::size_t eb = fixed->expert_bytes, kb = fixed->block_bytes;
  const std::size_t layer_block = kb / std::size_t(geo.layers);  // one layer's K and V of a block
  int moe = 0;
  for (bool b : geo.layer_is_moe) moe += b;

  // One budget of 8 slots per layer + 60 blocks, starting at 4 slots and 40 blocks; 4 KiB granules
  // so a tiny model's pools span several (an expert is a whole number of pages: its slots commit
  // exactly).
  ASSERT_EQ(eb % kPage, 0u);
  const std::size_t budget = std::size_t(moe) * 8 * eb + 60 * kb;
  // Granules (FERRY_VMM=off in the environment would hold the pools whole: the test below).
  ferry::testing::ScopedEnv vmm_default("FERRY_VMM", nullptr);
  auto eng_r = Engine::create(geo, m->params, resizable_config(budget, 40 * kb, kPage));
  ASSERT_TRUE(eng_r.ok()) << eng_r.status().to_string();
  Engine& eng = **eng_r;
  ExpertPager& pager = *eng.experts().pager();
  ASSERT_TRUE(pager.resizable());
  ASSERT_TRUE(eng.kv().resizable());
  std::vector<std::byte*> slot_bases;
  for (int l = 0; l < geo.layers; ++l) slot_bases.push_back(pager.slot_base(l));
  std::byte* const kv_base = eng.kv().data();
  // Reserved: E slots per MoE layer (each from a granule), the whole budget of blocks.
  EXPECT_EQ(pager.reserved_bytes(), std::size_t(moe) * std::size_t(geo.experts) * eb);
  EXPECT_GE(eng.kv().reserved_bytes(), std::size_t(eng.kv().capacity_blocks()) * kb);

  const std::size_t rounding = std::size_t(geo.layers) * kPage;  // KV: < a granule per layer
  std::size_t checks = 0;
  const auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    std::size_t live_slots = 0;
    for (int l = 0; l < geo.layers; ++l) live_slots += std::size_t(pager.capacity(l));
    EXPECT_EQ(pager.held_bytes(), live_slots * eb);
    EXPECT_EQ(pager.live_bytes(), live_slots * eb);
    const std::size_t kv_live = std::size_t(eng.kv().num_blocks()) * layer_block;
    EXPECT_EQ(eng.kv().held_bytes(), std::size_t(geo.layers) * round_up(kv_live, kPage));
    EXPECT_EQ(eng.kv().budget().bytes_used(), eng.kv().held_bytes());
    EXPECT_LE(eng.device_budget().bytes_used(), budget);
    EXPECT_EQ(eng.device_held_bytes(),
              eng.device_budget().bytes_used() +
                  (eng.kv().held_bytes() - std::size_t(eng.kv().num_blocks()) * kb));
    EXPECT_LE(eng.device_held_bytes(), budget + rounding);
    for (int l = 0; l < geo.layers; ++l) EXPECT_EQ(pager.slot_base(l), slot_bases[l]);
    EXPECT_EQ(eng.kv().data(), kv_base);
    ++checks;
  };
  check("created");
  const std::size_t held_at_start = eng.device_held_bytes();
  std::vector<std::size_t> held;
  auto got = run(eng, reqs, [&](int step) {
    const std::optional<Status> st = scheduled_resize(eng, geo, step);
    if (!st) return;
    EXPECT_TRUE(st->ok()) << "step " << step << ": " << st->to_string();
    check("after a resize");
    held.push_back(eng.device_held_bytes());
  });
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, want);
  EXPECT_EQ(checks, 6u) << "a resize step never came: the test lost its teeth";
  ASSERT_EQ(held.size(), 5u);
  // The held bytes really moved both ways (a shrink gave memory back).
  EXPECT_GT(held[0], held_at_start);
  EXPECT_LT(held[1], held[0]);
  EXPECT_LT(held[3], held[2]);
  EXPECT_GT(held[4], held[3]);
  EXPECT_EQ(eng.device_held_peak_bytes(),
            std::max({held_at_start, held[0], held[1], held[2], held[3], held[4]}));
  EXPECT_LE(eng.device_held_peak_bytes(), budget + rounding);
  EXPECT_LE(eng.device_budget().bytes_peak(), budget);
  EXPECT_GT(pager.counters().bytes_moved + eng.kv().blocks_moved(), 0u);
}

// Where the GPU lacks CUDA virtual memory management (forced here with FERRY_VMM=off, read when
// the pools reserve) each resizable pool is one allocation of its whole reservation: it holds its
// maximum from creation on, while the budget's charges, the resizes and the tokens are what they
// are with granules (mem/virtual_region.h, docs/mem_virtual_region.md).
TEST(WsaMemory, WithoutVmmThePoolsHoldTheirMaximaAndServeTheSameTokens) {
  auto m = testing::tiny_builtin_moe(31);
  ASSERT_TRUE(m);
  const model::DecoderGeometry& geo = m->geometry;
  const auto reqs = requests();
  auto fixed = fixed_engine(*m, reqs);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  const std::map<RequestId, std::vector<std::int32_t>>& want = fixed->tokens;
  const std::size_t eb = fixed->expert_bytes, kb = fixed->block_bytes;
  int moe = 0;
  for (bool b : geo.layer_is_moe) moe += b;
  const std::size_t budget = std::size_t(moe) * 8 * eb + 60 * kb;

  struct Served {
    std::map<RequestId, std::vector<std::int32_t>> tokens;
    std::vector<std::size_t> charged, held;  // at creation, then after each resize
    std::size_t reserved = 0, held_peak = 0;
    bool pools_up_front = false;
  };
  const auto serve = [&](const char* ferry_vmm) -> Result<Served> {
    Served s;
    std::unique_ptr<Engine> eng;
    {
      ferry::testing::ScopedEnv env("FERRY_VMM", ferry_vmm);
      FERRY_ASSIGN_OR_RETURN(
          eng, Engine::create(geo, m->params, resizable_config(budget, 40 * kb, kPage)));
    }
    const ExpertPager& pager = *eng->experts().pager();
    s.pools_up_front = pager.held_bytes() == pager.reserved_bytes() &&
                       eng->kv().held_bytes() == eng->kv().reserved_bytes();
    EXPECT_EQ(eng->pools_backed_up_front(), s.pools_up_front);
    s.reserved = eng->pool_reserved_bytes();
    const auto sample = [&] {
      s.charged.push_back(eng->device_budget().bytes_used());
      s.held.push_back(eng->device_held_bytes());
    };
    sample();
    Status resize_error;
    FERRY_ASSIGN_OR_RETURN(s.tokens, run(*eng, reqs, [&](int step) {
                             const std::optional<Status> st = scheduled_resize(*eng, geo, step);
                             if (!st) return;
                             if (!st->ok() && resize_error.ok()) resize_error = *st;
                             sample();
                           }));
    FERRY_TRY(resize_error);
    s.held_peak = eng->device_held_peak_bytes();
    return s;
  };
  auto vmm = serve(nullptr);
  ASSERT_TRUE(vmm.ok()) << vmm.status().to_string();
  auto off = serve("off");
  ASSERT_TRUE(off.ok()) << off.status().to_string();

  EXPECT_FALSE(vmm->pools_up_front);
  EXPECT_TRUE(off->pools_up_front);
  EXPECT_EQ(off->tokens, want);
  EXPECT_EQ(vmm->tokens, want);
  ASSERT_EQ(off->charged.size(), 6u) << "a resize step never came: the test lost its teeth";
  // The budget sees the same live sizes at every point; what is held differs.
  EXPECT_EQ(off->charged, vmm->charged);
  for (std::size_t i = 0; i < off->held.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_LE(off->charged[i], budget);
    // The pools' whole reservations plus what the budget charges outside them (dense weights,
    // workspace): a constant, above every granule-backed figure.
    EXPECT_EQ(off->held[i], off->held[0]);
    EXPECT_GE(off->held[i], off->reserved);
    EXPECT_GT(off->held[i], vmm->held[i]);
  }
  EXPECT_EQ(off->held_peak, off->held[0]);
}

TEST(WsaMemory, DefaultGranuleHoldsTheLiveSizesNotTheMaxima) {
  auto m = testing::tiny_builtin_moe(31);
  ASSERT_TRUE(m);
  const model::DecoderGeometry& geo = m->geometry;
  auto probe = KvCache::create(geo, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t kb = (*probe)->block_bytes();
  constexpr std::size_t kGran = std::size_t{2} << 20;
  // A pool budget of 64 MiB of blocks: the KV reservation spans 16 MiB a layer.
  const std::size_t budget = 64 << 20;
  ferry::testing::ScopedEnv vmm_default("FERRY_VMM", nullptr);  // granules, as above
  auto e = Engine::create(geo, m->params, resizable_config(budget, 40 * kb, 0));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& eng = **e;
  const ExpertPager& pager = *eng.experts().pager();
  int moe = 0;
  for (bool b : geo.layer_is_moe) moe += b;
  const std::size_t eb = eng.experts().store()->expert_bytes();
  // Reserved at the maxima, each layer from a granule.
  EXPECT_EQ(pager.reserved_bytes(),
            std::size_t(moe) * round_up(std::size_t(geo.experts) * eb, kGran));
  EXPECT_EQ(
      eng.kv().reserved_bytes(),
      std::size_t(geo.layers) *
          round_up(std::size_t(eng.kv().capacity_blocks()) * kb / std::size_t(geo.layers), kGran));
  EXPECT_GE(eng.pool_reserved_bytes(), budget);
  // Held: one granule per layer and pool here (both live sizes are under a granule a layer).
  EXPECT_EQ(pager.held_bytes(), std::size_t(moe) * kGran);
  EXPECT_EQ(eng.kv().held_bytes(), std::size_t(geo.layers) * kGran);
  EXPECT_LE(eng.device_held_bytes(),
            eng.device_budget().bytes_used() + std::size_t(moe + geo.layers) * kGran);
  EXPECT_LT(eng.device_held_bytes(), eng.pool_reserved_bytes());
}

}  // namespace
}  // namespace ferry::serve
