// SPDX-License-Identifier: Apache-2.0
// Training checkpoints and the Hugging Face export.
//
// A checkpoint is a folder <output>/checkpoint-<step>/ holding
//   state.safetensors   weights under their HF names: the f32 master, or with a bf16 master the
//                       bf16 weights themselves (+ "optim.kahan.<name>" bf16 compensation);
//                       AdamW moments: fp32 states "optim.m.<name>", "optim.v.<name>"; 8-bit
//                       states "optim.m8.<name>", "optim.v8.<name>" (u8 codes) and
//                       "optim.m_absmax.<name>", "optim.v_absmax.<name>" (f32 per block),
//                       each parameter by its own kind (--8bit-params selects a subset)
//   trainer_state.json  step, AdamW step, data cursor, seed, consecutive non-finite skips, a
//                       fingerprint of the training data, the FNV-1a 64 hash of
//                       state.safetensors, and the optimizer mode ("master_weights",
//                       "optimizer_states"; absent in older checkpoints = fp32 / fp32), and
//                       with 8-bit states "q8_params": the names of the 8-bit parameters
//                       (absent = all)
// Everything is stored bit for bit, so a resume continues exactly in every mode. Loading into a
// TrainState of another mode, or another 8-bit selection, is refused (invalid argument, naming
// both modes / the first parameter that differs).
// Written atomically: everything goes into a temporary sibling folder, each file is fsynced,
// the folder is renamed to its final name and the parent fsynced; a crash leaves either the old
// set of checkpoints or the new one. Loading re-hashes state.safetensors, so a truncated or
// bit-flipped file is refused with a clear error; earlier checkpoints are kept (keep_last) and
// stay usable.
// The export (<output>/ after training) is config.json (dtype float32) + model.safetensors +
// the tokenizer files, loadable by load_model_f32 / `ferry perplexity` and transformers.
// Tests: tests/unit/train/checkpoint_test.cpp, tests/cli/train_resume.sh.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "train/batcher.h"
#include "train/train_state.h"

namespace ferry::train {

struct TrainerState {
  std::int64_t step = 0;      // training steps completed (applied or skipped)
  std::int64_t opt_step = 0;  // AdamW updates applied
  DataCursor cursor;
  std::uint64_t seed = 0;
  int nonfinite_run = 0;  // consecutive skipped steps
  std::uint64_t data_fingerprint = 0;
};

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull);
// Hash of the tokenized training data (ids and targets of every example, in order).
std::uint64_t data_fingerprint(const std::vector<TokenizedExample>& data);

std::string checkpoint_dir_name(std::int64_t step);  // "checkpoint-<step>"

// Saves into <output_dir>/checkpoint-<step>, then deletes all but the newest keep_last.
Status save_checkpoint(const std::string& output_dir, const TrainState& s, const TrainerState& ts,
                       int keep_last);

// `path` is a checkpoint folder, or an output folder (its newest checkpoint-<N> is used).
// Fills master weights and moments of `s` (shapes must match) and returns the trainer state.
Result<TrainerState> load_checkpoint(const std::string& path, TrainState& s);

// Lists <output_dir>/checkpoint-<N> folders, newest first.
std::vector<std::string> list_checkpoints(const std::string& output_dir);

// Writes the HF folder: config.json (source config with dtype float32), model.safetensors and
// the passthrough files (name -> contents: tokenizer.json, tokenizer_config.json, ...).
Status export_hf_model(const std::string& dir, const TrainState& s, const std::string& config_json,
                       const std::map<std::string, std::string>& passthrough);

}  // namespace ferry::train
