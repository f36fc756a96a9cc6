// SPDX-License-Identifier: Apache-2.0
#include "train/arith_data.h"

#include <array>
#include <string>

#include <fmt/format.h>

#include "train/rng.h"

namespace ferry::train {

namespace {

constexpr std::array<const char*, 8> kNames = {"Ann", "Ben",  "Cara", "Dan",
                                               "Eve", "Finn", "Gus",  "Hana"};
constexpr std::array<const char*, 6> kObjects = {"apples", "books", "coins",
                                                 "pens",   "cards", "shells"};
constexpr int kVariants = static_cast<int>(kNames.size() * kObjects.size());

bool is_eval(const ArithProblem& p, double eval_fraction) {
  // A fixed hash (independent of any training seed) of the problem.
  Rng r(0xA417ull * 1000003ull + (p.add ? 1u : 2u) * 10007u + std::uint64_t(p.a) * 101u +
        std::uint64_t(p.b));
  return r.uniform() < eval_fraction;
}

}  // namespace

SftExample arith_example(const ArithProblem& p, int variant) {
  const int v = ((variant % kVariants) + kVariants) % kVariants;
  const char* name = kNames[v % kNames.size()];
  const char* obj = kObjects[v / kNames.size()];
  std::string q = p.add ? fmt::format("{} has {} {} and gets {} more. How many {} does {} have?",
                                      name, p.a, obj, p.b, obj, name)
                        : fmt::format("{} has {} {} and gives away {}. How many {} does {} have?",
                                      name, p.a, obj, p.b, obj, name);
  SftExample ex;
  ex.messages.push_back({"user", std::move(q)});
  ex.messages.push_back({"assistant", std::to_string(p.answer())});
  return ex;
}

ArithSplit make_arith_split(const ArithSpec& spec) {
  ArithSplit s;
  for (int op = 0; op < 2; ++op) {
    for (int a = 0; a <= spec.max_operand; ++a) {
      for (int b = 0; b <= spec.max_operand; ++b) {
        const ArithProblem p{op == 0, a, b};
        if (p.answer() < 0) continue;
        if (is_eval(p, spec.eval_fraction)) {
          s.eval_problems.push_back(p);
        } else {
          s.train_problems.push_back(p);
        }
      }
    }
  }
  for (const ArithProblem& p : s.train_problems) {
    for (int v = 0; v < kVariants; ++v) s.train.push_back(arith_example(p, v));
  }
  // Eval variants are spread over names and objects by a problem-dependent offset.
  for (const ArithProblem& p : s.eval_problems) {
    for (int k = 0; k < spec.eval_variants; ++k) {
      s.eval.push_back(arith_example(p, p.a * 7 + p.b * 3 + k * 13 + (p.add ? 0 : 5)));
    }
  }
  return s;
}

}  // namespace ferry::train
