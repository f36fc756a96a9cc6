// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the train tests: a fresh temp folder and a tiny embedded-model config.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "core/file_util.h"
#include "train/trainer.h"

namespace ferry::train::testing {

inline std::string temp_dir(const std::string& tag) {
  const auto base = std::filesystem::temp_directory_path() /
                    ("ferry_train_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  return base.string();
}

// A 1-layer, C=32 embedded model on a small slice of the arithmetic data: steps take a few ms.
inline TrainConfig tiny_config(const std::string& out) {
  TrainConfig c;
  c.output_dir = out;
  c.builtin = {.layers = 1,
               .hidden = 32,
               .heads = 1,
               .kv_heads = 1,
               .head_dim = 32,
               .intermediate = 64,
               .max_positions = 128,
               .init_std = 0.02};
  c.arith = {.max_operand = 3, .eval_fraction = 0.25, .eval_variants = 1};
  c.batch_size = 4;
  c.seq_len = 128;
  c.max_steps = 6;
  c.warmup_steps = 0;
  c.schedule = LrSchedule::kConstant;
  c.lr = 1e-2;
  c.eval_every = 0;
  c.quiet = true;
  return c;
}

// A run resumed from checkpoint-<from> reproduces the uninterrupted one: the same losses for every
// step after `from` and byte-identical exported weights (model.safetensors of each output dir).
inline void expect_resume_reproduces(const TrainSummary& full, const std::string& full_dir,
                                     const TrainSummary& resumed, const std::string& resumed_dir,
                                     std::size_t from) {
  ASSERT_EQ(resumed.losses.size() + from, full.losses.size());
  for (std::size_t i = 0; i < resumed.losses.size(); ++i)
    EXPECT_EQ(resumed.losses[i], full.losses[from + i]) << "step " << from + 1 + i;
  auto wa = read_file(full_dir + "/model.safetensors");
  auto wc = read_file(resumed_dir + "/model.safetensors");
  ASSERT_TRUE(wa.ok() && wc.ok());
  EXPECT_TRUE(*wa == *wc) << "final weights differ after resume";
}

}  // namespace ferry::train::testing
