// SPDX-License-Identifier: Apache-2.0
// The configurator's profile saved to a file and loaded in another process
// (serve/wsa/split_profile.h; serve_split_engine_bench --save-profile / --configurator-profile):
//   - the engine's profile (a fixed split observed by a LiveSplit that never decides, agentic
//     sessions re-sending their history with the prefix cache on: the bench's fixed-50 run at a
//     tiny size) loads back equal field by field, and allocate() picks the same split, with the
//     same modelled step time to the bit, from the file as from the in-process profile;
//   - the engine's profile is the observed curves: the same whether LiveSplitConfig::reuse_prior
//     is on or off (the prior is a forecast for live decisions: decision_problem());
//   - the simulator's 50/50 profile (more layers and experts) likewise;
//   - priced by a step model (wsa::priced_by, the engine bench's --model-step-ms /
//     --model-miss-ms), the engine's profile carries that model's prices of the run's own steps;
//   - a missing file, another kind of JSON, a truncated file, a wrong type, curves of unequal
//     length are refused with a status; a non-finite value is refused at save.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/live_split.h"
#include "serve/wsa/split_profile.h"
#include "serve/wsa/split_sim.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& stem)
      : path_((std::filesystem::temp_directory_path() /
               (stem + "_" + std::to_string(::getpid()) + ".json"))
                  .string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

bool same_double_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Saves `p`, loads it back and checks: equal problem and meta, the same allocation and the same
// modelled step time bits.
void expect_round_trip_gives_same_split(const wsa::SplitProblem& p, const std::string& stem) {
  TempFile f(stem);
  wsa::SplitProfile prof{.problem = p,
                         .meta = {{"workload", {{"sessions", 4}, {"turns", 3}}}, {"note", stem}}};
  const Status saved = wsa::save_split_profile(f.path(), prof);
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  auto loaded = wsa::load_split_profile(f.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_TRUE(loaded->problem == p);
  EXPECT_EQ(loaded->meta, prof.meta);
  auto want = wsa::allocate(p);
  auto got = wsa::allocate(loaded->problem);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want) << wsa::to_string(*got) << " vs " << wsa::to_string(*want);
  EXPECT_TRUE(same_double_bits(wsa::modelled_step_s(loaded->problem, *got),
                               wsa::modelled_step_s(p, *want)));
  std::printf("%s: %zu layers x %d experts, %d kv points, prefix %zu points -> %s\n", stem.c_str(),
              p.expert_misses.size(), p.experts(), p.kv_max_blocks() + 1, p.kv_prefix_misses.size(),
              wsa::to_string(*want).c_str());
}

constexpr int kBlockTokens = 4;

wsa::AgenticSpec tiny_agentic_spec() {
  return {.sessions = 4,
          .turns = 3,
          .prefix_tokens = 24,
          .user_min = 3,
          .user_max = 8,
          .output_min = 4,
          .output_max = 9,
          .moe_layers = 2,
          .experts = 8,
          .top_k = 2,
          .seed = 5};
}

// Runs the sessions, each turn re-sending its real history (as serve_split_engine_bench does);
// `before_step` (if set) is called before every Engine::step(), where the engine calls its step
// hook (LiveSplit's observation of the previous step).
void run_history(Engine& eng, const wsa::AgenticWorkload& w, int vocab,
                 const std::function<void(Engine&)>& before_step = {}) {
  std::map<RequestId, std::pair<int, int>> turn_of;
  std::map<int, std::vector<std::int32_t>> prompt_of;
  auto submit = [&](int s, int t, std::vector<std::int32_t> prompt) {
    prompt_of[s] = prompt;
    auto id = eng.submit(
        {.prompt = std::move(prompt), .max_new_tokens = w.turns(s)[std::size_t(t)].output});
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    turn_of[*id] = {s, t};
  };
  for (int s = 0; s < w.sessions(); ++s) submit(s, 0, w.turn_prompt(s, 0, vocab));
  while (!eng.idle()) {
    if (before_step) before_step(eng);
    auto ev = eng.step();
    ASSERT_TRUE(ev.ok()) << ev.status().to_string();
    for (const TokenEvent& e : *ev) {
      if (e.finish == FinishReason::kNone) continue;
      auto o = eng.take_output(e.id);
      ASSERT_TRUE(o.ok());
      const auto [s, t] = turn_of.at(e.id);
      if (t + 1 >= static_cast<int>(w.turns(s).size())) continue;
      submit(s, t + 1, w.next_turn_prompt(s, t, prompt_of[s], o->tokens, vocab));
    }
  }
}

// The bench's fixed-50 profile run: a fixed split on a resizable engine (so a LiveSplit can
// attach), observed by a LiveSplit that never decides; `reuse_prior` is the LiveSplitConfig
// option (the bench leaves it at its default, on). Returns the observed problem (the profile)
// and the decision problem at the end of the run.
// `price` (if set) rewrites the LiveSplitConfig before attach (e.g. wsa::priced_by), `before_step`
// is run_history's; max_batch_tokens is the engine's chunk (24: the run has full chunks).
struct ProfileRun {
  wsa::SplitProblem observed, decision;
  std::uint64_t moves = 0;
  std::size_t expert_bytes = 0;
};
ProfileRun profile_run(
    bool reuse_prior,
    const std::function<wsa::LiveSplitConfig(wsa::LiveSplitConfig, std::size_t)>& price = {},
    const std::function<void(Engine&)>& before_step = {}, int max_batch_tokens = 24) {
  ProfileRun out;
  auto m = testing::tiny_builtin_moe(23);
  EXPECT_TRUE(m);
  if (!m) return out;
  const wsa::AgenticWorkload w(tiny_agentic_spec());
  auto probe =
      KvCache::create(m->geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  EXPECT_TRUE(probe.ok());
  if (!probe.ok()) return out;
  const std::size_t kb = (*probe)->block_bytes();
  const std::size_t eb =
      3 * std::size_t(m->geometry.hidden) * std::size_t(m->geometry.expert_width) * sizeof(float);
  const int floor = (w.max_context() + kBlockTokens - 1) / kBlockTokens;
  const std::size_t budget = 2 * 5 * eb + std::size_t(floor + 6) * kb;
  EngineConfig ec;
  ec.max_batch_tokens = max_batch_tokens;
  ec.max_running = 3;
  ec.pager.mode = ExpertMode::kPaged;
  ec.pager.layer_slots = {3, 3};
  ec.pager.resizable = true;
  ec.kv = {.block_tokens = kBlockTokens,
           .budget_bytes = budget - 6 * eb,
           .max_budget_bytes = budget,
           .prefix_cache = true};
  ec.kv_preempt = true;
  auto eng = Engine::create(m->geometry, m->params, ec);
  EXPECT_TRUE(eng.ok()) << eng.status().to_string();
  if (!eng.ok()) return out;
  wsa::LiveSplitConfig lc{.budget_bytes = budget,
                          .concurrency = 1,
                          .max_context_tokens = w.max_context(),
                          .decide_every_steps = 1 << 30,
                          .decide_accesses_per_expert = 0.0,
                          .link_bytes_per_s = 1e9,
                          .reuse_prior = reuse_prior};
  out.expert_bytes = (*eng)->experts().store()->expert_bytes();
  if (price) lc = price(lc, out.expert_bytes);
  auto ls = wsa::LiveSplit::attach(**eng, lc);
  EXPECT_TRUE(ls.ok()) << ls.status().to_string();
  if (!ls.ok()) return out;
  run_history(**eng, w, m->geometry.vocab, before_step);
  out.moves = (*ls)->stats().moves;
  out.observed = (*ls)->problem(**eng);
  out.decision = (*ls)->decision_problem(**eng);
  return out;
}

TEST(WsaProfile, EngineProfileRoundTripGivesTheSameConfiguratorSplit) {
  const ProfileRun r = profile_run(true);
  EXPECT_EQ(r.moves, 0u);
  const wsa::SplitProblem& p = r.observed;
  ASSERT_EQ(p.expert_misses.size(), 2u);
  EXPECT_GT(p.curve_steps, 0);
  EXPECT_FALSE(p.kv_prefix_misses.empty());
  EXPECT_GT(p.prefix_block_cost_s, 0);
  expect_round_trip_gives_same_split(p, "ferry_wsa_profile_engine");
}

// The profile is the curves as observed: a finished run's prefix curve already holds every lookup
// the workload made, so the reuse prior (a forecast of lookups still to come, for live decisions)
// must not enter it. At the end of a run every final history is released and pending, and the
// prior values all of them as if their sessions came back: on the CPU engine's phased 12 x 6 run
// it added 0.44 missing blocks per step below 3,565 blocks and the configurator kept 3,631 blocks
// for histories never looked up again (0.937x the best fixed run; docs/serve_wsa.md, session 29).
// Before 2026-12-06 problem() carried the prior whenever LiveSplitConfig::reuse_prior was on
// (the default, as in the bench), and the two profiles below differed.
TEST(WsaProfile, EngineProfileIsTheObservedCurvesWithoutTheReusePrior) {
  const ProfileRun with = profile_run(true);
  const ProfileRun without = profile_run(false);
  ASSERT_FALSE(with.observed.kv_prefix_misses.empty());
  // The same run either way (the observer never decides), so the same profile to the bit.
  EXPECT_TRUE(with.observed == without.observed);
  EXPECT_EQ(with.observed.kv_prefix_misses, without.observed.kv_prefix_misses);
  // The decision problem keeps the prior: at least the observed misses everywhere, more below
  // the pending working set (the final histories, released and not looked up since).
  EXPECT_TRUE(without.decision == without.observed);
  const std::vector<double>& obs = with.observed.kv_prefix_misses;
  const std::vector<double>& dec = with.decision.kv_prefix_misses;
  ASSERT_EQ(dec.size(), obs.size());
  for (std::size_t k = 0; k < obs.size(); ++k) ASSERT_GE(dec[k], obs[k]) << "k " << k;
  EXPECT_GT(dec.front(), obs.front());
  std::printf("profile prefix misses per step at 0 blocks: observed %.4f, with the prior %.4f\n",
              obs.front(), dec.front());
}

// A run scored by a step model (serve_split_engine_bench --model-step-ms / --model-miss-ms: a
// step's base + a price per miss, nothing per token) must be profiled at that model's prices:
// the configurator minimises the profile's T. wsa::priced_by gives LiveSplit the model; the test
// prices the same run's steps itself, from the engine's counters before every step (where the
// engine calls LiveSplit's hook), by the scoring model, and the profile must carry exactly those
// prices: a miss at miss_s, a prompt block at block_tokens x PrefillCost's price of the scored
// steps, a KV block missing for a step at 0 (nothing per token). At chunks of 24 tokens the run
// has full chunks (the price is full minus decode-only steps: the step's base cancels); at 4,096
// none (the proportional share of the steps' time: the base counts). Before the bench priced by
// its step model (session 29), its LiveSplit kept 0.2 ms a token and a miss at expert bytes /
// link: a prompt block at 4.17 ms where the scoring model pays 1.12 (docs/serve_wsa.md).
TEST(WsaProfile, EngineProfileIsPricedByTheStepModel) {
  const wsa::StepModel model{.step_s = 1.6e-3, .token_s = 0, .miss_s = 0.197e-3};
  for (const int chunk : {24, 4096}) {
    SCOPED_TRACE("max_batch_tokens " + std::to_string(chunk));
    wsa::PrefillCost scored(chunk);
    std::uint64_t misses = 0, prefill = 0, decode = 0;
    auto score_last_step = [&](Engine& eng) {
      const std::uint64_t m = eng.experts().pager()->counters().misses;
      const EngineStats& st = eng.stats();
      const double dp = double(st.prefill_tokens - prefill), dd = double(st.decode_tokens - decode);
      scored.add(model.step_s + model.miss_s * double(m - misses), dp + dd, dp);
      misses = m, prefill = st.prefill_tokens, decode = st.decode_tokens;
    };
    auto price = [&](wsa::LiveSplitConfig c, std::size_t eb) {
      return wsa::priced_by(c, model, eb);
    };
    const ProfileRun r = profile_run(true, price, score_last_step, chunk);
    const wsa::SplitProblem& p = r.observed;
    ASSERT_FALSE(p.kv_prefix_misses.empty());
    EXPECT_NEAR(p.miss_cost_s, model.miss_s, 1e-12 * model.miss_s);
    EXPECT_EQ(p.kv_block_cost_s, 0.0);
    const double want = kBlockTokens * scored.per_token_s(0);
    EXPECT_GT(want, 0);
    EXPECT_NEAR(p.prefix_block_cost_s, want, 1e-9 * want);
    // The per-cap price (ChunkMisses: full chunks' and decode steps' misses at every cap, as
    // the set model counts them) at the run's own caps (3 slots per layer) is the price of the
    // pager's misses up to what the pager misses beyond the set model: a full chunk touches all
    // 8 experts of a layer, more than its 3 slots, and the pager's token groups then reload some
    // (here 2.3 % of the price, the curve below it; the scaled CPU engine: docs/serve_wsa.md).
    // No full chunk, no curves.
    if (chunk == 24) {
      ASSERT_EQ(p.recompute_misses.size(), 2u);
      const wsa::Split own{.slots = {3, 3}};
      const double at_own = wsa::prefix_block_cost_at(p, own);
      EXPECT_LE(at_own, want * (1 + 1e-12));
      EXPECT_GT(at_own, 0.95 * want);
    } else {
      EXPECT_TRUE(p.recompute_misses.empty());
    }
    // The same run priced as the bench priced it before (the link, 0.2 ms a token) is not it.
    const ProfileRun old = profile_run(true, {}, {}, chunk);
    EXPECT_TRUE(old.observed.expert_misses == p.expert_misses);
    EXPECT_GT(std::abs(old.observed.prefix_block_cost_s - want), 0.1 * want);
    std::printf(
        "chunk %d: prompt block %.4f ms by the step model (profile %.4f), %.4f ms as "
        "priced before; miss %.4f ms (before %.6f)\n",
        chunk, want * 1e3, p.prefix_block_cost_s * 1e3, old.observed.prefix_block_cost_s * 1e3,
        p.miss_cost_s * 1e3, old.observed.miss_cost_s * 1e3);
  }
}

TEST(WsaProfile, SimulatorProfileRoundTripGivesTheSameConfiguratorSplit) {
  const wsa::AgenticWorkload w({.sessions = 6,
                                .turns = 3,
                                .prefix_tokens = 160,
                                .user_min = 8,
                                .user_max = 32,
                                .output_min = 8,
                                .output_max = 32,
                                .moe_layers = 6,
                                .experts = 32,
                                .top_k = 4,
                                .seed = 11});
  wsa::SimConfig cfg;
  cfg.expert_bytes = 1000;
  cfg.kv_bytes_per_token = 10;
  cfg.block_tokens = 4;
  cfg.max_running = 4;
  cfg.max_batch_tokens = 64;
  cfg.link_bytes_per_s = 1e6;
  cfg.prefix_cache = true;
  cfg.kv_floor_blocks = 4 * ((w.max_context() + 3) / 4);
  cfg.budget_bytes = 6 * 14 * 1000 + std::size_t(cfg.kv_floor_blocks) * 40 * 2;
  const wsa::SplitProblem skel = wsa::sim_problem(cfg, 6, 32, 4);
  auto half = wsa::fraction_split(skel, 0.5);
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  auto r = wsa::simulate(cfg, w, *half, false);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->profile.expert_misses.size(), 6u);
  expect_round_trip_gives_same_split(r->profile, "ferry_wsa_profile_sim");
}

wsa::SplitProblem small_problem() {
  wsa::SplitProblem p;
  p.budget_bytes = 10'000;
  p.expert_bytes = 1'000;
  p.kv_block_bytes = 100;
  p.min_slots = 1;
  p.expert_misses = {{3, 2, 1.5, 0.1}, {3, 1, 0.5, 0.25}};
  p.kv_short = {5, 4, 3, 2.5, 2, 0};
  p.kv_floor_blocks = 1;
  p.miss_cost_s = 1e-3 / 3;  // not a short decimal: the round trip must keep every bit
  p.kv_block_cost_s = 2e-4;
  p.curve_steps = 17.25;
  return p;
}

TEST(WsaProfile, BadFilesAreRefusedWithAStatus) {
  expect_round_trip_gives_same_split(small_problem(), "ferry_wsa_profile_small");
  TempFile f("ferry_wsa_profile_bad");
  EXPECT_EQ(wsa::load_split_profile(f.path() + ".missing").status().code(), StatusCode::kNotFound);
  write_text(f.path(), "{\"kind\": \"something else\", \"version\": 1}");
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kCorrupt);
  write_text(f.path(), "{\"kind\": 7}");
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kCorrupt);
  ASSERT_TRUE(wsa::save_split_profile(f.path(), {.problem = small_problem()}).ok());
  std::string text;
  {
    std::ifstream in(f.path());
    std::getline(in, text);
  }
  write_text(f.path(), text.substr(0, text.size() / 2));  // truncated
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kCorrupt);
  nlohmann::json j = nlohmann::json::parse(text);
  j["version"] = 2;
  write_text(f.path(), j.dump());
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kCorrupt);
  j["version"] = 1;
  j["problem"]["kv_short"] = "no";  // wrong type
  write_text(f.path(), j.dump());
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kCorrupt);
  j["problem"] = wsa::split_problem_to_json(small_problem());
  j["problem"]["expert_misses"][1] = {3, 2};  // unequal curve lengths
  write_text(f.path(), j.dump());
  EXPECT_EQ(wsa::load_split_profile(f.path()).status().code(), StatusCode::kInvalidArgument);
  wsa::SplitProblem inf = small_problem();
  inf.kv_short[2] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(wsa::save_split_profile(f.path(), {.problem = inf}).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::serve
