// SPDX-License-Identifier: Apache-2.0
// End-to-end on a tiny embedded model: training reduces the loss; resume after a save
// reproduces an uninterrupted run bit for bit; a corrupted checkpoint is refused with a clear
// error while the previous one stays usable; non-finite steps stop the run after three.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/file_util.h"
#include "model/model_binding.h"
#include "test_util.h"
#include "train/train_checkpoint.h"

namespace ferry::train {
namespace {

TEST(Trainer, FewStepsReduceTheLoss) {
  const std::string out = testing::temp_dir("loss");
  TrainConfig c = testing::tiny_config(out);
  c.max_steps = 12;
  auto r = run_training(c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->losses.size(), 12u);
  // Untrained: about ln(259) = 5.56 nats per response token.
  EXPECT_GT(r->losses.front(), 5.0);
  EXPECT_LT(r->losses.back(), r->losses.front() - 1.0);
  // The export loads as a Hugging Face folder.
  auto m = model::load_model_f32(out);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
}

TEST(Trainer, ResumeIsBitExact) {
  const std::string a_dir = testing::temp_dir("resume_a");
  const std::string b_dir = testing::temp_dir("resume_b");
  TrainConfig a = testing::tiny_config(a_dir);
  a.max_steps = 6;
  a.grad_accum = 2;
  a.schedule = LrSchedule::kCosine;
  a.warmup_steps = 2;
  auto ra = run_training(a);
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();

  // The same 6-step run, saving at step 3; then a fresh process state resumes from there.
  {
    TrainConfig b = a;
    b.output_dir = b_dir;
    b.save_every = 3;
    b.keep_checkpoints = 5;
    auto rb = run_training(b);
    ASSERT_TRUE(rb.ok()) << rb.status().to_string();
    EXPECT_EQ(rb->losses, ra->losses);  // determinism of a whole run
    std::filesystem::remove(b_dir + "/model.safetensors");
  }
  TrainConfig resumed = a;
  resumed.output_dir = b_dir;
  resumed.resume = b_dir + "/checkpoint-3";
  auto rc = run_training(resumed);
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  ASSERT_EQ(rc->first_step, 3);
  testing::expect_resume_reproduces(*ra, a_dir, *rc, b_dir, 3);
}

TEST(Trainer, CorruptCheckpointIsRefusedAndThePreviousStillWorks) {
  const std::string out = testing::temp_dir("corrupt");
  TrainConfig c = testing::tiny_config(out);
  c.max_steps = 4;
  c.save_every = 2;
  ASSERT_TRUE(run_training(c).ok());
  const std::string bad = out + "/checkpoint-4/state.safetensors";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x5a');
  }
  TrainConfig r = c;
  r.resume = out;
  auto res = run_training(r);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kCorrupt);
  const std::string& msg = res.status().message();
  EXPECT_NE(msg.find("checkpoint-4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume " + out + "/checkpoint-2"), std::string::npos) << msg;
  r.resume = out + "/checkpoint-2";
  auto ok = run_training(r);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->first_step, 2);
}

TEST(Trainer, ThreeNonFiniteStepsStop) {
  const std::string out = testing::temp_dir("nonfinite");
  TrainConfig c = testing::tiny_config(out);
  c.lr = 1e30;  // the first update sends every weight to ~1e30: the next forwards overflow
  c.adamw.weight_decay = 0.0;
  c.max_steps = 10;
  auto r = run_training(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 consecutive steps had non-finite gradients"),
            std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace ferry::train
