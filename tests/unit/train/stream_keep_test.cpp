// SPDX-License-Identifier: Apache-2.0
// Kept layer internals in the streaming executor (ActivationPolicy::keep, `+keep:LIST`; #7):
//   - bit-identical losses, gradient norms, weights and AdamW states vs the in-memory reference
//     after 3 steps with gradient accumulation 2 and active clipping, with keeps under device,
//     host, NVMe, every:K (kept layers inside a recomputed span, at its top, and both) and mixes,
//     dense and MoE (the qwen3_moe fixture: MoE layers 0 and 2, dense 1), f32 and bf16 GEMMs,
//     bf16 gradients, accumulation 1 and 3;
//   - exact pass counts: per micro-batch L forwards + the spans' recomputes + one re-forward per
//     layer not kept (internals-only: internals_forwards, and ModelCompute's own count), L
//     backwards, and the kept count in kept_layers; weight bytes unchanged;
//   - the device plan grows by exactly ModelCompute::kept_layer_bytes per kept layer, and the
//     executor allocates exactly the plan (peak == planned);
//   - the +keep:LIST spelling (round trips through keep_list / describe, errors) and a ferry-plan
//     document's keep_internals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "mem/budget.h"
#include "model/model_compute.h"
#include "test_util.h"
#include "train/stream/activation_policy.h"
#include "train/stream/device_plan.h"
#include "train/stream/plan_policy.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

std::string nvme_dir() { return testing::temp_dir("stream_keep_nvme"); }

// Layer passes of one micro-batch under policy p: the forward, each span's recompute, and a
// re-forward before each backward of a layer that is not kept.
std::uint64_t forwards_per_micro(const ActivationPolicy& p) {
  std::uint64_t n = static_cast<std::uint64_t>(p.layers());
  for (const Span& s : p.spans()) n += static_cast<std::uint64_t>(s.end - s.start - 1);
  return n + static_cast<std::uint64_t>(p.layers() - p.kept_count());
}

void check_keeps(const model::LoadedModel& m, const std::vector<std::string>& policies,
                 const RunSpec& spec) {
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 5);
  const RunResult ref = run_reference(m, spec, data);
  bool clipped = false;
  for (const StepOutcome& o : ref.outcomes) clipped |= o.applied && o.clip < 1.0;
  EXPECT_TRUE(clipped) << "the test should exercise clipping";
  const int L = m.geometry.layers;
  for (const std::string& name : policies) {
    auto pol = parse_policy(name, L);
    ASSERT_TRUE(pol.ok()) << pol.status().to_string();
    ASSERT_GT(pol->kept_count(), 0) << name;
    const RunResult st = run_stream(m, spec, data, name);
    ASSERT_EQ(st.losses.size(), ref.losses.size()) << name;
    for (std::size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_EQ(st.losses[i], ref.losses[i]) << name << " step " << i;
      EXPECT_EQ(st.outcomes[i].grad_norm, ref.outcomes[i].grad_norm) << name << " step " << i;
    }
    expect_same_state(*ref.state, *st.state, name);
    const auto micro = static_cast<std::uint64_t>(spec.steps * spec.accum);
    EXPECT_EQ(st.stats.layer_forwards, micro * forwards_per_micro(*pol)) << name;
    EXPECT_EQ(st.stats.layer_backwards, micro * static_cast<std::uint64_t>(L)) << name;
    EXPECT_EQ(st.stats.kept_layers, micro * static_cast<std::uint64_t>(pol->kept_count())) << name;
    // The re-forwards of the layers not kept are internals-only (layer_forward_internals), the
    // forward's and the spans' recomputes full: counted by the executor and by ModelCompute.
    EXPECT_EQ(st.stats.internals_forwards,
              micro * static_cast<std::uint64_t>(L - pol->kept_count()))
        << name;
    EXPECT_EQ(st.compute_internals_forwards, st.stats.internals_forwards) << name;
    EXPECT_EQ(st.peak, st.planned) << name;
  }
}

TEST(StreamKeep, DenseMatchesInMemoryBitForBit) {
  const std::string dir = testing::temp_dir("stream_keep_dense");
  auto m = dense_model(dir + "/model");
  const std::string nv = nvme_dir();
  check_keeps(*m,
              {"device+keep:top:2", "device+keep:0-3", "host+keep:1,3", "nvme:" + nv + "+keep:0",
               // every:2 = drdr: spans (0,2), (2,4). Layer 1 tops a span, layer 0 is recomputed
               // in its span (its kept workspace rewritten by the recompute), layer 2 both ways.
               "every:2+keep:1", "every:2+keep:0", "every:2+keep:0,2-3", "every:4+keep:top:4",
               "every:3:host+keep:1-2", "mix:dhrn:" + nv + "+keep:1-2", "mix:hrrd+keep:0,2"},
              {});
}

TEST(StreamKeep, MoeMatchesInMemoryBitForBit) {
  auto m = moe_model();
  ASSERT_GT(m->geometry.experts, 0);
  const std::string nv = nvme_dir();
  check_keeps(*m,
              {"device+keep:top:3", "device+keep:1", "host+keep:0", "every:2+keep:0,2",
               "every:3+keep:1", "mix:nrh:" + nv + "+keep:0-1"},
              {});
}

// bf16 GEMMs (the CPU twin): the down projection's bf16 copy in gemm.x16 is reused only by the
// backward right after its own forward, else re-rounded: a kept layer's backward after other
// layers' forwards must not read theirs.
TEST(StreamKeep, Bf16GemmsMatchInMemoryBitForBit) {
  const std::string dir = testing::temp_dir("stream_keep_bf16");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  check_keeps(*dense, {"device+keep:top:2", "every:2+keep:0-1", "mix:hrrd+keep:1"}, spec);
  check_keeps(*moe, {"host+keep:0-2", "every:2+keep:1"}, spec);
}

TEST(StreamKeep, GradientAccumulationAndBf16GradientsMatchInMemory) {
  const std::string dir = testing::temp_dir("stream_keep_accum");
  auto m = dense_model(dir + "/model");
  for (int accum : {1, 3}) {
    RunSpec spec;
    spec.accum = accum;
    SCOPED_TRACE("accum " + std::to_string(accum));
    check_keeps(*m, {"device+keep:top:1", "every:2:host+keep:0,3"}, spec);
  }
  RunSpec g16;
  g16.bf16_grads = true;
  check_keeps(*m, {"every:2+keep:1-2"}, g16);
}

// The 7B A/B's configuration (#7 review): Kahan bf16 master with 8-bit states (bf16 weights, so
// bf16 weight views with bf16 GEMMs), bf16 gradients, and the device optimizer tail on every layer
// and on layers 0-1: still the in-memory reference's bits with keeps.
TEST(StreamKeep, DeviceTailAndBf16MasterMatchInMemoryBitForBit) {
  const std::string dir = testing::temp_dir("stream_keep_tail");
  auto m = dense_model(dir + "/model");
  RunSpec spec;
  spec.gemm_precision = model::GemmPrecision::kBf16;
  spec.mode = {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  spec.bf16_grads = true;
  for (const int K : {2, kDeviceUpdateAllLayers}) {
    spec.device_update_layers = K;
    SCOPED_TRACE("tail " + std::to_string(K));
    check_keeps(*m, {"host+keep:0,3", "every:2+keep:1-2", "device+keep:top:4"}, spec);
  }
}

// Keeping changes no transfer: the same weight, gradient and activation bytes as without.
TEST(StreamKeep, MovesTheSameBytesAsWithoutKeeps) {
  const std::string dir = testing::temp_dir("stream_keep_bytes");
  auto m = dense_model(dir + "/model");
  const RunSpec spec{.steps = 1, .accum = 2};
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m->geometry.vocab, 11);
  for (const std::string base : {"device", "every:2:host"}) {
    const RunResult plain = run_stream(*m, spec, data, base);
    const RunResult kept = run_stream(*m, spec, data, base + "+keep:0-3");
    EXPECT_EQ(kept.stats.weight_h2d, plain.stats.weight_h2d) << base;
    EXPECT_EQ(kept.stats.grad_d2h, plain.stats.grad_d2h) << base;
    EXPECT_EQ(kept.stats.grad_h2d, plain.stats.grad_h2d) << base;
    EXPECT_EQ(kept.stats.act_d2h, plain.stats.act_d2h) << base;
    EXPECT_EQ(kept.stats.act_h2d, plain.stats.act_h2d) << base;
    EXPECT_EQ(kept.stats.layer_forwards + 4 * 2, plain.stats.layer_forwards) << base;
    EXPECT_EQ(kept.stats.kept_layers, 4u * 2) << base;
    EXPECT_EQ(plain.stats.kept_layers, 0u) << base;
  }
}

// The device plan counts each kept layer's workspace (ModelCompute::kept_layer_bytes, by the
// layer's kind), and the executor allocates exactly that.
TEST(StreamKeep, DevicePlanGrowsByKeptLayerBytesAndIsWhatTheExecutorAllocates) {
  const std::string dir = testing::temp_dir("stream_keep_plan");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  kernels::Backend& be = kernels::cpu_backend();
  const std::string nv = nvme_dir();
  for (const model::LoadedModel* m : {dense.get(), moe.get()}) {
    const model::DecoderGeometry& geo = m->geometry;
    const int L = geo.layers;
    auto s = TrainState::from_loaded(*m, {}, 1);
    ASSERT_TRUE(s.ok());
    auto arena = HostArena::create(**s);
    ASSERT_TRUE(arena.ok());
    const ModelSizes sizes = model_sizes(**arena);
    for (const std::string& base :
         {std::string("device"), std::string("every:2"), std::string("host"), "nvme:" + nv}) {
      auto plain = parse_policy(base, L);
      ASSERT_TRUE(plain.ok());
      for (const std::string& list :
           {std::string("top:1"), std::string("0"), std::string("0-" + std::to_string(L - 1))}) {
        const std::string name = base + "+keep:" + list;
        auto pol = parse_policy(name, L);
        ASSERT_TRUE(pol.ok()) << pol.status().to_string();
        for (std::int64_t tokens : {std::int64_t{1}, kBatch * kSeq}) {
          auto p0 = plan_device(geo, sizes, *plain, 3, tokens, be);
          auto pk = plan_device(geo, sizes, *pol, 3, tokens, be);
          ASSERT_TRUE(p0.ok() && pk.ok()) << name;
          std::size_t extra = 0;
          for (int l = 0; l < L; ++l) {
            if (!pol->kept(l)) continue;
            auto k = model::ModelCompute::kept_layer_bytes(geo, l, tokens, be,
                                                           model::GemmPrecision::kF32);
            ASSERT_TRUE(k.ok());
            extra += *k;
          }
          EXPECT_EQ(pk->total_bytes(), p0->total_bytes() + extra) << name << " T " << tokens;
          EXPECT_EQ(pk->kept_bytes, extra) << name;
          EXPECT_EQ(p0->kept_bytes, 0u) << name;
          EXPECT_EQ(pk->compute_bytes, p0->compute_bytes + extra) << name;
        }
        // The executor allocates exactly the plan at its batch.
        StreamOptions so{.policy = *pol, .prefetch = 2};
        auto ex = StreamExecutor::create(**s, kBatch, kSeq, so, be);
        ASSERT_TRUE(ex.ok()) << ex.status().to_string();
        auto want = plan_device(geo, sizes, *pol, 3, kBatch * kSeq, be);
        ASSERT_TRUE(want.ok());
        EXPECT_EQ((*ex)->device_planned_bytes(), want->total_bytes()) << name;
        EXPECT_EQ((*ex)->device_kept_bytes(), want->kept_bytes) << name;
        EXPECT_EQ((*ex)->device_peak_bytes(), want->total_bytes()) << name;
      }
    }
  }
  // Keeping costs device memory: under the same budget a kept policy fits fewer sequences.
  const model::DecoderGeometry& geo = dense->geometry;
  auto s = TrainState::from_loaded(*dense, {}, 1);
  ASSERT_TRUE(s.ok());
  auto arena = HostArena::create(**s);
  ASSERT_TRUE(arena.ok());
  const ModelSizes sizes = model_sizes(**arena);
  auto plain = parse_policy("every:2", geo.layers);
  auto kept = parse_policy("every:2+keep:0-3", geo.layers);
  ASSERT_TRUE(plain.ok() && kept.ok());
  auto p8 = plan_device(geo, sizes, *plain, 3, 8 * 32, be);
  ASSERT_TRUE(p8.ok());
  auto a = largest_batch(geo, sizes, *plain, 3, 32, p8->total_bytes(), be);
  auto b = largest_batch(geo, sizes, *kept, 3, 32, p8->total_bytes(), be);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 8);
  EXPECT_LT(*b, *a);
}

// A batch the kept workspaces push over the device budget is refused before anything runs, naming
// the largest batch that fits, what the keeps hold and the batch that fits without them; a budget
// that holds not even batch 1 with the keeps (but does without) says to keep fewer layers.
TEST(StreamKeep, BudgetRefusalNamesTheKeptBytesAndTheBatchWithoutThem) {
  const std::string dir = testing::temp_dir("stream_keep_budget");
  auto dense = dense_model(dir + "/model");
  kernels::Backend& be = kernels::cpu_backend();
  const model::DecoderGeometry& geo = dense->geometry;
  auto s = TrainState::from_loaded(*dense, {}, 1);
  ASSERT_TRUE(s.ok());
  auto arena = HostArena::create(**s);
  ASSERT_TRUE(arena.ok());
  const ModelSizes sizes = model_sizes(**arena);
  constexpr std::int64_t S = 32;
  auto plain = parse_policy("every:2", geo.layers);
  auto kept = parse_policy("every:2+keep:0-3", geo.layers);
  ASSERT_TRUE(plain.ok() && kept.ok());
  auto p8 = plan_device(geo, sizes, *plain, 3, 8 * S, be);
  auto k8 = plan_device(geo, sizes, *kept, 3, 8 * S, be);
  ASSERT_TRUE(p8.ok() && k8.ok());
  auto best = largest_batch(geo, sizes, *kept, 3, S, p8->total_bytes(), be);
  ASSERT_TRUE(best.ok());
  ASSERT_GE(*best, 1);
  ASSERT_LT(*best, 8);
  StreamOptions so{.policy = *kept, .prefetch = 2, .device_budget_bytes = p8->total_bytes()};
  auto refused = StreamExecutor::create(**s, 8, S, so, be);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = refused.status().message();
  EXPECT_NE(msg.find("the largest batch that fits is " + std::to_string(*best)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the kept internals of 4 layers (0-3) take " +
                     mem::format_bytes(k8->kept_bytes) + " of it at batch 8"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("without the keeps batch 8 fits"), std::string::npos) << msg;
  // Batch 1 does not fit with the keeps, but does without them.
  auto p1 = plan_device(geo, sizes, *plain, 3, S, be);
  auto k1 = plan_device(geo, sizes, *kept, 3, S, be);
  ASSERT_TRUE(p1.ok() && k1.ok());
  ASSERT_LT(p1->total_bytes(), k1->total_bytes());
  so.device_budget_bytes = p1->total_bytes();
  auto none = StreamExecutor::create(**s, 1, S, so, be);
  ASSERT_FALSE(none.ok());
  const std::string nmsg = none.status().message();
  EXPECT_NE(nmsg.find("does not fit even batch 1"), std::string::npos) << nmsg;
  EXPECT_NE(nmsg.find("without the keeps batch 1 fits"), std::string::npos) << nmsg;
  EXPECT_NE(nmsg.find("keep fewer layers"), std::string::npos) << nmsg;
}

TEST(StreamKeep, ParsesKeepSuffixes) {
  auto top = parse_policy("every:4+keep:top:2", 8);
  ASSERT_TRUE(top.ok()) << top.status().to_string();
  EXPECT_EQ(top->describe(), "every:4+keep:top:2 = drrrdrrr keep 6-7");
  EXPECT_EQ(top->kept_count(), 2);
  EXPECT_EQ(top->keep, (std::vector<bool>{false, false, false, false, false, false, true, true}));
  // Keeping changes no weight stream and no boundary home.
  auto plain = parse_policy("every:4", 8);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(weight_schedule(*top), weight_schedule(*plain));
  EXPECT_EQ(top->homes, plain->homes);
  EXPECT_TRUE(plain->keep.empty());
  EXPECT_EQ(plain->kept_count(), 0);
  EXPECT_FALSE(plain->kept(3));

  auto list = parse_policy("device+keep:0,4-6", 8);
  ASSERT_TRUE(list.ok()) << list.status().to_string();
  EXPECT_EQ(list->keep, (std::vector<bool>{true, false, false, false, true, true, true, false}));
  EXPECT_EQ(keep_list(list->keep), "0,4-6");
  EXPECT_EQ(list->describe(), "device+keep:0,4-6 = dddddddd keep 0,4-6");
  // keep_list spells what parses back to the same set.
  for (const std::string l : {"0", "7", "1,3,5", "0-7", "2-3,5", "0,2-4,6-7"}) {
    auto p = parse_policy("host+keep:" + l, 8);
    ASSERT_TRUE(p.ok()) << l << ": " << p.status().to_string();
    EXPECT_EQ(keep_list(p->keep), l);
    auto again = parse_policy("host+keep:" + keep_list(p->keep), 8);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->keep, p->keep);
  }
  EXPECT_EQ(keep_list(parse_policy("mix:dhrn:/tmp/x+keep:top:4", 4)->keep), "0-3");
  auto nv = parse_policy("nvme:/tmp/a+b+keep:1", 3);  // a '+' in the directory
  ASSERT_TRUE(nv.ok()) << nv.status().to_string();
  EXPECT_EQ(nv->nvme_dir, "/tmp/a+b");
  EXPECT_EQ(nv->keep, (std::vector<bool>{false, true, false}));
  auto every_nvme = parse_policy("every:2:nvme:/tmp/y+keep:top:1", 4);
  ASSERT_TRUE(every_nvme.ok());
  EXPECT_EQ(every_nvme->nvme_dir, "/tmp/y");

  // Errors say what is wrong.
  auto error_of = [](const std::string& spec, int layers) {
    auto p = parse_policy(spec, layers);
    EXPECT_FALSE(p.ok()) << spec;
    if (p.ok()) return std::string();
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << spec;
    return p.status().message();
  };
  auto has = [](const std::string& msg, const std::string& what) {
    return msg.find(what) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of("device+keep:8", 8), "keep layer 8 outside [0, 8)"));
  EXPECT_TRUE(has(error_of("device+keep:6-9", 8), "keep layer 8 outside [0, 8)"));
  EXPECT_TRUE(has(error_of("device+keep:1,1", 8), "keep layer 1 listed twice"));
  EXPECT_TRUE(has(error_of("device+keep:1-3,2", 8), "keep layer 2 listed twice"));
  EXPECT_TRUE(has(error_of("device+keep:3-1", 8), "keep range 3-1 runs backwards"));
  EXPECT_TRUE(has(error_of("device+keep:top:0", 8), "keep top:0 outside [1, 8]"));
  EXPECT_TRUE(has(error_of("device+keep:top:9", 8), "keep top:9 outside [1, 8]"));
  for (const std::string bad :
       {"device+keep:", "device+keep:a", "device+keep:1,", "device+keep:,1", "device+keep:1-",
        "device+keep:-1", "device+keep:top:", "device+keep:top:x", "device+keep:1;2"}) {
    EXPECT_TRUE(has(error_of(bad, 8), "is not a keep list")) << bad;
  }
  EXPECT_TRUE(has(error_of("device+keep", 8), "expected +keep:LIST"));
  EXPECT_TRUE(has(error_of("device+keeps:1", 8), "expected +keep:LIST"));
  EXPECT_TRUE(has(error_of("sometimes+keep:1", 8), "not a boundary home"));
  // validate() checks the length of a hand-built keep.
  ActivationPolicy hand = *parse_policy("device", 4);
  hand.keep = {true, false};
  EXPECT_FALSE(validate(hand).ok());
}

// `ferry bench train --policies` splits on commas: the keep lists' commas are put back.
TEST(StreamKeep, RejoinsKeepListsSplitOnCommas) {
  using V = std::vector<std::string>;
  EXPECT_EQ(rejoin_keep_lists({"device+keep:1", "3", "5-6", "every:2", "host+keep:0", "2"}),
            (V{"device+keep:1,3,5-6", "every:2", "host+keep:0,2"}));
  // A bare number after anything but an index list stays an item of its own (and fails to parse).
  EXPECT_EQ(rejoin_keep_lists({"device+keep:top:1", "3"}), (V{"device+keep:top:1", "3"}));
  EXPECT_EQ(rejoin_keep_lists({"device", "3"}), (V{"device", "3"}));
  EXPECT_EQ(rejoin_keep_lists({"3", "every:4"}), (V{"3", "every:4"}));
  EXPECT_EQ(rejoin_keep_lists({"every:2+keep:1", "x3"}), (V{"every:2+keep:1", "x3"}));
  EXPECT_EQ(rejoin_keep_lists({}), V{});
}

TEST(StreamKeep, ReadsKeepInternalsOfAFerryPlanDocument) {
  auto doc = [](const std::string& keep) {
    return R"({"format": "ferry-plan", "version": 1, "policy": "solved",
      "num_layers": 4, "batch_size": 8, "seq_len": 1024,
      "boundaries": [{"boundary": 0, "home": "gpu"}, {"boundary": 1, "home": "recompute"},
                     {"boundary": 2, "home": "host"}, {"boundary": 3, "home": "gpu"},
                     {"boundary": 4, "home": "gpu"}])" +
           keep + "}";
  };
  auto mixed = plan_policy_from_text(doc(R"(, "keep_internals": [false, 1, 0, true])"), "p", 4, "");
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_EQ(mixed->policy.keep, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(mixed->policy.describe(), "plan:solved = drhd keep 1,3");
  auto absent = plan_policy_from_text(doc(""), "p", 4, "");
  ASSERT_TRUE(absent.ok()) << absent.status().to_string();
  EXPECT_TRUE(absent->policy.keep.empty());
  auto none = plan_policy_from_text(doc(R"(, "keep_internals": [0, 0, false, 0])"), "p", 4, "");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->policy.kept_count(), 0);
  for (const std::string bad :
       {R"(, "keep_internals": [0, 1, 0])", R"(, "keep_internals": [0, 1, 0, 1, 0])",
        R"(, "keep_internals": 1)", R"(, "keep_internals": [0, 2, 0, 1])",
        R"(, "keep_internals": [0, "yes", 0, 1])", R"(, "keep_internals": [0, 1.0, 0, 1])",
        // Integers that only truncate to 0/1 in an int (2^32 + 1, 2^32, -(2^32) + 1).
        R"(, "keep_internals": [0, 4294967297, 0, 1])",
        R"(, "keep_internals": [0, 4294967296, 0, 1])",
        R"(, "keep_internals": [0, -4294967295, 0, 1])"}) {
    auto p = plan_policy_from_text(doc(bad), "p", 4, "");
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kCorrupt) << bad;
    EXPECT_NE(p.status().message().find("keep_internals"), std::string::npos)
        << p.status().message();
  }
}

}  // namespace
}  // namespace ferry::train::stream
