// SPDX-License-Identifier: Apache-2.0
// ModelCompute's GEMM input reuse (FERRY_GEMM_INPUT_REUSE, model::gemm_input_reuse_default())
// under the stream executor on the CPU backend with bf16 GEMMs (the twin: round, then widen):
// the same losses, clip outcomes and final state bit for bit with the reuse on and off, for a
// recomputing policy and a stored one, dense and MoE, and fewer activation converts with it on.
// The switch is read from the environment by every ModelCompute::create(), so the test sets it
// around each run (EnvGuard restores it). The GPU counterpart:
// TrainStreamGpu.GemmInputReuseBitIdenticalOnGpu (tests/gpu/train_stream_gpu_test.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

RunResult run_with_reuse(bool reuse, const model::LoadedModel& m, const RunSpec& spec,
                         const std::vector<Batch>& data, const std::string& policy) {
  EnvGuard env("FERRY_GEMM_INPUT_REUSE", reuse ? "1" : "0");
  EXPECT_EQ(model::gemm_input_reuse_default(), reuse);
  RunResult r = run_stream(m, spec, data, policy);
  EXPECT_EQ(r.gemm_input_reuse, reuse);
  return r;
}

void check(const model::LoadedModel& m, const std::string& what) {
  const RunSpec spec{.steps = 2,
                     .accum = 2,
                     .mode = {.master = MasterWeights::kBf16Kahan},
                     .gemm_precision = model::GemmPrecision::kBf16};
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 17);
  for (const char* policy : {"host", "every:2", "device"}) {
    SCOPED_TRACE(what + " " + policy);
    const RunResult off = run_with_reuse(false, m, spec, data, policy);
    const RunResult on = run_with_reuse(true, m, spec, data, policy);
    ASSERT_EQ(on.losses.size(), off.losses.size());
    for (std::size_t i = 0; i < on.losses.size(); ++i) {
      EXPECT_EQ(std::memcmp(&on.losses[i], &off.losses[i], sizeof(double)), 0) << "step " << i;
      EXPECT_EQ(on.outcomes[i].applied, off.outcomes[i].applied);
      EXPECT_EQ(std::memcmp(&on.outcomes[i].grad_norm, &off.outcomes[i].grad_norm, sizeof(double)),
                0)
          << "step " << i;
    }
    expect_same_state(*on.state, *off.state, what + " " + policy);
    EXPECT_GT(off.gemm_input_converts, 0u);
    EXPECT_LT(on.gemm_input_converts, off.gemm_input_converts);
    // Moved bytes do not depend on the switch.
    EXPECT_EQ(on.stats.weight_h2d, off.stats.weight_h2d);
    EXPECT_EQ(on.stats.grad_d2h, off.stats.grad_d2h);
  }
}

TEST(GemmInputReuse, StreamExecutorBitIdenticalOnAndOffDense) {
  const std::string dir = testing::temp_dir("gemm_input_reuse_dense");
  auto m = dense_model(dir + "/model");
  ASSERT_TRUE(m != nullptr);
  check(*m, "dense");
}

TEST(GemmInputReuse, StreamExecutorBitIdenticalOnAndOffMoe) {
  auto m = moe_model();
  ASSERT_TRUE(m != nullptr);
  check(*m, "moe");
}

// The dense builtin's counts per micro-batch are exact: per layer, off rounds 7 activations per
// forward and 7 per backward; on 1 per forward (the norms write h1's and h2's bf16 copies, the
// SwiGLU kernel act's) and 3 per backward when the backward follows its own (re)computed forward.
// With "host" every layer is recomputed right before its backward.
TEST(GemmInputReuse, CountsPerMicroBatchOnARecomputingPolicy) {
  const std::string dir = testing::temp_dir("gemm_input_reuse_counts");
  auto m = dense_model(dir + "/model");
  ASSERT_TRUE(m != nullptr);
  const RunSpec spec{.steps = 1,
                     .accum = 1,
                     .mode = {.master = MasterWeights::kBf16Kahan},
                     .gemm_precision = model::GemmPrecision::kBf16};
  const std::vector<Batch> data = make_batches(1, m->geometry.vocab, 3);
  const RunResult off = run_with_reuse(false, *m, spec, data, "host");
  const RunResult on = run_with_reuse(true, *m, spec, data, "host");
  const auto L = static_cast<std::uint64_t>(m->geometry.layers);
  // Forward, recompute, backward.
  EXPECT_EQ(off.gemm_input_converts, 21 * L);
  EXPECT_EQ(on.gemm_input_converts, 5 * L);
}

}  // namespace
}  // namespace ferry::train::stream
