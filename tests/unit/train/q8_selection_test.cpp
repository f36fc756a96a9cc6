// SPDX-License-Identifier: Apache-2.0
// --8bit-params: the regex selects parameters by HF name; the checkpoint stores each parameter's
// states in its own kind (u8 codes for the selected ones, f32 m, v for the rest) and records the
// selection; resuming with another selection is refused; the memory and stream executors give
// the same bits with a subset; the printed bytes/param is the real mixture.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/file_util.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "train/optim/param_selection.h"
#include "train/trainer.h"

namespace ferry::train {
namespace {

TEST(Q8Selection, RegexSearchesHfNames) {
  const std::vector<std::string> names = {
      "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight"};
  auto sel = select_8bit_params(names, "mlp|experts");
  ASSERT_TRUE(sel.ok()) << sel.status().to_string();
  EXPECT_EQ(*sel, (std::vector<bool>{false, false, true, true}));
  auto attn = select_8bit_params(names, R"(self_attn\.q_proj|embed)");
  ASSERT_TRUE(attn.ok());
  EXPECT_EQ(*attn, (std::vector<bool>{true, true, false, false}));
  auto all = select_8bit_params(names, "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<bool>(4, true));
  auto bad = select_8bit_params(names, "mlp(");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a valid regular expression"), std::string::npos);
  auto none = select_8bit_params(names, "lm_head");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("matches none"), std::string::npos);
}

TEST(Q8Selection, MixedBytesPerParamInterpolatesTheStates) {
  const OptimMode q8{MasterWeights::kBf16Kahan, OptimizerStates::k8Bit};
  const OptimMode f32{MasterWeights::kBf16Kahan, OptimizerStates::kF32};
  EXPECT_EQ(mixed_host_bytes_per_param(q8, 1.0).total(), host_bytes_per_param(q8).total());
  EXPECT_EQ(mixed_host_bytes_per_param(q8, 0.0).total(), host_bytes_per_param(f32).total());
  EXPECT_DOUBLE_EQ(mixed_host_bytes_per_param(q8, 0.25).states,
                   0.25 * host_bytes_per_param(q8).states + 0.75 * 8.0);
}

TrainConfig subset_config(const std::string& out) {
  TrainConfig c = testing::tiny_config(out);
  c.builtin.layers = 2;
  c.max_steps = 4;
  c.save_every = 2;
  c.keep_checkpoints = 5;
  c.adamw.max_grad_norm = 0.5;
  c.optim = {MasterWeights::kF32, OptimizerStates::k8Bit};
  c.q8_params = "mlp";
  return c;
}

TEST(Q8Selection, CheckpointStoresEachParameterInItsSelectedKind) {
  const std::string out = testing::temp_dir("q8sel_ckpt");
  auto r = run_training(subset_config(out));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto f = model::SafetensorsFile::open(out + "/checkpoint-4/state.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  int q8 = 0, f32 = 0;
  for (const model::TensorInfo& t : f->tensors()) {
    if (t.name.rfind("optim.", 0) == 0) continue;
    const bool mlp = t.name.find("mlp") != std::string::npos;
    const model::TensorInfo* m8 = f->find("optim.m8." + t.name);
    const model::TensorInfo* m32 = f->find("optim.m." + t.name);
    if (mlp) {
      ++q8;
      ASSERT_NE(m8, nullptr) << t.name;
      EXPECT_EQ(m8->dtype, DType::kU8) << t.name;
      ASSERT_NE(f->find("optim.v8." + t.name), nullptr) << t.name;
      EXPECT_EQ(f->find("optim.v8." + t.name)->dtype, DType::kU8) << t.name;
      EXPECT_EQ(m32, nullptr) << t.name;
    } else {
      ++f32;
      ASSERT_NE(m32, nullptr) << t.name;
      EXPECT_EQ(m32->dtype, DType::kF32) << t.name;
      EXPECT_EQ(f->find("optim.v." + t.name)->dtype, DType::kF32) << t.name;
      EXPECT_EQ(m8, nullptr) << t.name;
    }
  }
  EXPECT_EQ(q8, 2 * 3);  // gate, up, down of 2 layers
  EXPECT_GT(f32, 0);
  auto js = read_file(out + "/checkpoint-4/trainer_state.json");
  ASSERT_TRUE(js.ok());
  EXPECT_NE(js->find("\"q8_params\""), std::string::npos);
  EXPECT_NE(js->find("model.layers.1.mlp.down_proj.weight"), std::string::npos);
}

TEST(Q8Selection, StreamEqualsMemoryAndBytesPerParamIsTheMixture) {
  const std::string a = testing::temp_dir("q8sel_mem");
  const std::string b = testing::temp_dir("q8sel_stream");
  TrainConfig mc = subset_config(a);
  auto ra = run_training(mc);
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  TrainConfig sc = subset_config(b);
  sc.executor = Executor::kStream;
  sc.policy = "every:2:host";
  auto rb = run_training(sc);
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(ra->losses, rb->losses);
  auto wa = read_file(a + "/model.safetensors");
  auto wb = read_file(b + "/model.safetensors");
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_TRUE(*wa == *wb) << "exported weights differ";
  auto sa = read_file(a + "/checkpoint-4/state.safetensors");
  auto sb = read_file(b + "/checkpoint-4/state.safetensors");
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_TRUE(*sa == *sb) << "optimizer states differ";
  // The arena's bytes/param lies strictly between all-8-bit and all-fp32 states.
  const std::string c = testing::temp_dir("q8sel_all");
  TrainConfig all = sc;
  all.output_dir = c;
  all.q8_params.clear();
  auto rc = run_training(all);
  ASSERT_TRUE(rc.ok());
  const std::string d = testing::temp_dir("q8sel_none");
  TrainConfig none = sc;
  none.output_dir = d;
  none.q8_params.clear();
  none.optim.states = OptimizerStates::kF32;
  auto rd = run_training(none);
  ASSERT_TRUE(rd.ok());
  EXPECT_LT(rc->host_bytes_per_param, rb->host_bytes_per_param);
  EXPECT_LT(rb->host_bytes_per_param, rd->host_bytes_per_param);
}

TEST(Q8Selection, ResumeWithAnotherSelectionIsRefused) {
  const std::string out = testing::temp_dir("q8sel_resume");
  TrainConfig c = subset_config(out);
  c.max_steps = 2;
  ASSERT_TRUE(run_training(c).ok());
  TrainConfig r = c;
  r.max_steps = 4;
  r.resume = out;
  r.q8_params = "self_attn";
  auto res = run_training(r);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = res.status().message();
  EXPECT_NE(msg.find("resume with the same --8bit-params"), std::string::npos) << msg;
  EXPECT_NE(msg.find("keeps 8-bit states for 6 parameters"), std::string::npos) << msg;
  r.q8_params.clear();  // all: also another selection
  EXPECT_FALSE(run_training(r).ok());
  r.q8_params = c.q8_params;  // the same selection resumes
  auto ok = run_training(r);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->first_step, 2);
}

TEST(Q8Selection, NeedsEightBitStates) {
  TrainConfig c = testing::tiny_config(testing::temp_dir("q8sel_fp32"));
  c.q8_params = "mlp";
  EXPECT_FALSE(validate(c).ok());
}

}  // namespace
}  // namespace ferry::train
