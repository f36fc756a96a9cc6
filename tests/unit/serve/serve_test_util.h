// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the serve tests: HF fixtures (tests/data/models/<arch>), an engine run that
// records every sampled logits row, and small config builders.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/model_binding.h"
#include "model/safetensors.h"
#include "serve/builtin_model.h"
#include "serve/dense_weights.h"
#include "serve/engine.h"
#include "serve/routing_trace.h"
#include "serve/slot_resolve.h"

namespace ferry::serve::testing {

// The tiny random Qwen3-MoE the engine tests share: 2 layers, 8 experts, top-2.
// One slot-resolve call over a test's own arrays (SlotStateLayout), slots of 96 bytes at
// slot_base with up at 32 and down at 64: the layout the twin and kernel tests share.
inline SlotResolveArgs test_resolve_args(const std::vector<std::int32_t>& ids, int E, int max_cap,
                                         std::int32_t* state, const void** table, std::int32_t* log,
                                         unsigned char* slot_base) {
  return {.ids = ids.data(),
          .n = std::int64_t(ids.size()),
          .E = E,
          .max_cap = max_cap,
          .state = state,
          .table = table,
          .log = log,
          .slot_base = slot_base,
          .expert_bytes = 96,
          .up_offset = 32,
          .down_offset = 64};
}

// The attention part of a geometry (what a KvCache and paged attention read).
inline model::DecoderGeometry kv_geometry(int layers, int H, int G, int D) {
  model::DecoderGeometry g;
  g.layers = layers;
  g.heads = H;
  g.kv_heads = G;
  g.head_dim = D;
  return g;
}

inline BuiltinMoeSpec tiny_moe_spec() {
  return {.layers = 2,
          .hidden = 64,
          .heads = 4,
          .kv_heads = 2,
          .head_dim = 16,
          .experts = 8,
          .top_k = 2,
          .expert_width = 32};
}

// That model, by seed.
inline std::unique_ptr<BuiltinModel> tiny_builtin_moe(std::uint64_t seed) {
  auto m = make_builtin_moe(tiny_moe_spec(), seed);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// Three requests of different lengths (one sampled) that, at 8 tokens per step and 3 running,
// mix prefill chunks with other requests' decodes: the byte-identity workloads.
inline std::vector<GenerationRequest> mixed_requests(int vocab) {
  std::vector<GenerationRequest> r(3);
  for (int i = 0; i < 11; ++i) r[0].prompt.push_back((i * 37 + 5) % vocab);
  for (int i = 0; i < 6; ++i) r[1].prompt.push_back((i * 91 + 17) % vocab);
  for (int i = 0; i < 14; ++i) r[2].prompt.push_back((i * 53 + 101) % vocab);
  r[0].max_new_tokens = 7;
  r[1].max_new_tokens = 9;
  r[2].max_new_tokens = 6;
  r[2].sampling = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 42};
  return r;
}

inline std::string fixture_dir(const std::string& arch) {
  return std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch;
}

struct Fixture {
  std::unique_ptr<model::LoadedModel> model;
  std::unique_ptr<model::SafetensorsFile> expected;
  std::vector<std::int32_t> i32(const std::string& name) const {
    auto v = expected->view(name);
    EXPECT_TRUE(v.ok()) << name;
    if (!v.ok()) return {};
    std::vector<std::int32_t> out(static_cast<std::size_t>(v->numel()));
    std::memcpy(out.data(), v->data, out.size() * sizeof(std::int32_t));
    return out;
  }
  std::vector<float> f32(const std::string& name) const {
    auto v = expected->view(name);
    EXPECT_TRUE(v.ok()) << name;
    if (!v.ok()) return {};
    std::vector<float> out(static_cast<std::size_t>(v->numel()));
    EXPECT_TRUE(ferry::convert_elements(v->data, v->dtype, out.data(), DType::kF32, out.size()));
    return out;
  }
};

inline Fixture load_fixture(const std::string& arch) {
  Fixture f;
  auto m = model::load_model_f32(fixture_dir(arch));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (m.ok()) f.model = std::move(*m);
  auto e = model::SafetensorsFile::open(fixture_dir(arch) + "/expected.safetensors");
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (e.ok()) f.expected = std::make_unique<model::SafetensorsFile>(std::move(*e));
  return f;
}

// Everything an engine run produced, keyed by request id: tokens and each sampled logits row.
struct RunRecord {
  std::map<RequestId, std::vector<std::int32_t>> tokens;
  std::map<RequestId, std::vector<std::vector<float>>> logits;
  bool operator==(const RunRecord&) const = default;
};

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two runs gave the same token ids and the same bits in every sampled logits row.
inline void expect_same_bits(const RunRecord& got, const RunRecord& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  for (const auto& [id, rows] : want.logits) {
    const auto& g = got.logits.at(id);
    ASSERT_EQ(g.size(), rows.size()) << what;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(same_bits(g[i], rows[i])) << what << " request " << id << " row " << i;
    }
  }
}

// A model's parameters with the dense linear weights (dense_weights.h for_each_dense_linear)
// rounded to bf16 and widened back to f32 (exact): what the f32 engine must run on to give the bf16
// dense engine's bits. Tied views stay tied. Everything else points at the source's memory.
struct RoundedDense {
  model::ModelParams params;
  std::vector<std::unique_ptr<std::vector<float>>> keep;
};
inline std::unique_ptr<RoundedDense> round_dense_to_bf16(const model::ModelParams& src) {
  auto r = std::make_unique<RoundedDense>();
  r->params = src;
  std::map<const void*, const float*> done;
  for_each_dense_linear(r->params, [&](ConstTensorView& v) {
    if (v.data == nullptr) return;
    EXPECT_EQ(v.dtype, DType::kF32);
    auto it = done.find(v.data);
    if (it == done.end()) {
      const auto* in = static_cast<const float*>(v.data);
      auto& w = *r->keep.emplace_back(
          std::make_unique<std::vector<float>>(static_cast<std::size_t>(v.numel())));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(f32_to_bf16(in[i]));
      it = done.emplace(v.data, w.data()).first;
    }
    v.data = it->second;
  });
  return r;
}

// Submits all requests at once and steps until idle.
// Submits every request, then steps until idle, calling `at_step(step)` (if set) before each
// step (resizes between steps); the requests' ids in order.
inline Result<std::vector<RequestId>> submit_and_step(
    Engine& eng, const std::vector<GenerationRequest>& reqs,
    const std::function<void(int)>& at_step = {}) {
  std::vector<RequestId> ids;
  for (const auto& q : reqs) {
    FERRY_ASSIGN_OR_RETURN(RequestId id, eng.submit(q));
    ids.push_back(id);
  }
  for (int step = 0; !eng.idle(); ++step) {
    if (at_step) at_step(step);
    FERRY_TRY(eng.step().status());
  }
  return ids;
}

inline Result<RunRecord> run_engine(Engine& eng, const std::vector<GenerationRequest>& reqs) {
  RunRecord rec;
  eng.set_logits_observer([&rec](RequestId id, int, std::span<const float> row) {
    rec.logits[id].emplace_back(row.begin(), row.end());
  });
  std::vector<RequestId> ids;
  for (const auto& r : reqs) {
    FERRY_ASSIGN_OR_RETURN(RequestId id, eng.submit(r));
    ids.push_back(id);
  }
  FERRY_TRY(eng.run_until_idle());
  for (RequestId id : ids) {
    FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng.take_output(id));
    rec.tokens[id] = out.tokens;
  }
  eng.set_logits_observer(nullptr);
  return rec;
}

// A replayer behind the per-layer hook path: forwards on_route, but does not force ahead, so
// the runners ask it after each MoE layer's router (the CUDA runner: one host round trip per MoE
// layer). Against a plain TraceReplayer (forced ahead) it must give the same bits.
struct PerLayerReplayer : RoutingHook {
  explicit PerLayerReplayer(RoutingTrace t, bool strict = true) : rep(std::move(t), strict) {}
  Status on_route(const RouteKey& k, std::span<std::int32_t> ids) override {
    return rep.on_route(k, ids);
  }
  TraceReplayer rep;
};

// A recorded trace made to differ from the router: positions p % 3 == 0 keep the recording
// (forced == the router's choice: its weights must stay), p % 3 == 1 route to each expert + 1
// mod E (distinct stays distinct: new weights), p % 3 == 2 are dropped (non-strict replay keeps
// the router's choice there; strict replay fails on them).
inline RoutingTrace varied_trace(const RoutingTrace& recorded) {
  RoutingTrace t{.experts = recorded.experts, .top_k = recorded.top_k};
  for (const auto& [key, ids] : recorded.routes) {
    if (key.position % 3 == 2) continue;
    std::vector<std::int32_t> v = ids;
    if (key.position % 3 == 1) {
      for (auto& e : v) e = (e + 1) % recorded.experts;
    }
    t.routes[key] = std::move(v);
  }
  return t;
}

}  // namespace ferry::serve::testing
