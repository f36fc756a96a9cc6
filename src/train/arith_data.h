// SPDX-License-Identifier: Apache-2.0
// The embedded default's data: deterministic arithmetic word problems such as
//   "Ann has 3 apples and gets 4 more. How many apples does Ann have?" -> "7"
//   "Ben has 9 coins and gives away 5. How many coins does Ben have?"  -> "4"
// Operands lie in [0, max_operand] (subtraction only when the result is >= 0). The split is by
// problem (operation, a, b), not by sampling: a fixed hash of (op, a, b) sends about
// eval_fraction of the problems to eval, and no eval problem appears in training with any name
// or object. Training holds every (name, object) variant of each training problem; eval holds
// `eval_variants` variants of each eval problem. The split does not depend on the training seed.
// Tests: tests/unit/train/data_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "train/sft_data.h"

namespace ferry::train {

struct ArithSpec {
  int max_operand = 9;
  double eval_fraction = 0.2;
  int eval_variants = 2;
};

struct ArithProblem {
  bool add = true;
  int a = 0;
  int b = 0;
  int answer() const { return add ? a + b : a - b; }
};

struct ArithSplit {
  std::vector<SftExample> train;
  std::vector<SftExample> eval;
  std::vector<ArithProblem> train_problems;  // distinct problems in train
  std::vector<ArithProblem> eval_problems;   // distinct problems in eval
};

ArithSplit make_arith_split(const ArithSpec& spec);

// Renders one problem with the name/object variant v.
SftExample arith_example(const ArithProblem& p, int variant);

}  // namespace ferry::train
