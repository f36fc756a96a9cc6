// SPDX-License-Identifier: Apache-2.0
// `ferry bench train --json` reports for the from-bench tests (bench_profile_test.cpp,
// host_home_test.cpp, resident_saving_test.cpp): a 4-layer model and policy runs whose windows are
// f0..f3 12 ms (2 of them exposed), loss 5 ms, b3..b0 30 ms (173 ms in all).
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/json.h"
#include "model/config.h"
#include "plan/geometry.h"

namespace ferry::plan::testing {

inline constexpr int kBenchLayers = 4;

// Qwen2.5-0.5B's shapes with kBenchLayers layers.
inline model::ModelConfig four_layer_model() {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = *cfg;
  c.num_hidden_layers = kBenchLayers;
  return c;
}

// One policy's run: its name, mean step, the windows above, 0.5 s of CPU optimizer over the
// report's 5 steps (100 ms per step), and `fields` (batch_size, exposed_ms_per_step, ...) merged
// in.
inline Json bench_run(const std::string& name, double step_ms, const Json& fields) {
  Json measured = Json::array(), exposed = Json::array();
  for (int t = 0; t < 2 * kBenchLayers + 1; ++t) {
    const bool fwd = t < kBenchLayers, loss = t == kBenchLayers;
    measured.push_back(fwd ? 12.0 : loss ? 5.0 : 30.0);
    exposed.push_back(fwd ? 2.0 : 0.0);
  }
  Json run = {{"policy", name},
              {"step_ms_mean", step_ms},
              {"optimizer_busy_s", 0.5},
              {"windows", {{"measured_ms", measured}, {"measured_exposed_ms", exposed}}}};
  run.update(fields);
  return run;
}

// A report at batch 2, 4 timed steps + 1 warm-up.
inline Json bench_report(std::vector<Json> policies, int seq = 256) {
  return {{"bench", "train"},
          {"device", "test"},
          {"geometry", {{"layers", kBenchLayers}}},
          {"batch", 2},
          {"seq", seq},
          {"steps", 4},
          {"warmup", 1},
          {"policies", std::move(policies)}};
}

}  // namespace ferry::plan::testing
