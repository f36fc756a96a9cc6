// SPDX-License-Identifier: Apache-2.0
// The arithmetic generator is deterministic and its train/eval splits are disjoint by problem;
// the batcher visits each example once per epoch and packs/pads as documented.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "model/tokenizer/tokenizer.h"
#include "train/arith_data.h"
#include "train/batcher.h"
#include "train/builtin_model.h"

namespace ferry::train {
namespace {

std::string text_of(const SftExample& e) {
  std::string s;
  for (const auto& m : e.messages) s += m.role + ":" + m.content + "|";
  return s;
}

TEST(ArithData, Deterministic) {
  const ArithSplit a = make_arith_split({});
  const ArithSplit b = make_arith_split({});
  ASSERT_EQ(a.train.size(), b.train.size());
  ASSERT_EQ(a.eval.size(), b.eval.size());
  for (std::size_t i = 0; i < a.train.size(); ++i)
    EXPECT_EQ(text_of(a.train[i]), text_of(b.train[i]));
  for (std::size_t i = 0; i < a.eval.size(); ++i) EXPECT_EQ(text_of(a.eval[i]), text_of(b.eval[i]));
}

TEST(ArithData, SplitIsDisjointByProblem) {
  const ArithSplit s = make_arith_split({});
  ASSERT_FALSE(s.eval_problems.empty());
  ASSERT_FALSE(s.train_problems.empty());
  std::set<std::tuple<bool, int, int>> train;
  for (const auto& p : s.train_problems) train.insert({p.add, p.a, p.b});
  for (const auto& p : s.eval_problems) EXPECT_FALSE(train.count({p.add, p.a, p.b}));
  // 100 additions + 55 non-negative subtractions in total.
  EXPECT_EQ(s.train_problems.size() + s.eval_problems.size(), 155u);
  // No eval question text occurs in training.
  std::set<std::string> train_q;
  for (const auto& e : s.train) train_q.insert(e.messages[0].content);
  for (const auto& e : s.eval) EXPECT_FALSE(train_q.count(e.messages[0].content));
  // Answers are right.
  const SftExample e = arith_example({false, 9, 5}, 1);
  EXPECT_EQ(e.messages[0].content,
            "Ben has 9 apples and gives away 5. How many apples does Ben have?");
  EXPECT_EQ(e.messages[1].content, "4");
}

std::vector<TokenizedExample> fake_examples(int n) {
  std::vector<TokenizedExample> v(n);
  for (int i = 0; i < n; ++i) {
    const int len = 3 + i % 4;
    for (int t = 0; t < len; ++t) {
      v[i].ids.push_back(i * 10 + t);
      v[i].targets.push_back(t + 1 < len ? i * 10 + t + 1 : kIgnoreTarget);
    }
  }
  return v;
}

TEST(Batcher, EachEpochVisitsEveryExampleOnce) {
  const auto data = fake_examples(10);
  Batcher b(&data, 7, 5, 8, false, 0);
  DataCursor c;
  MicroBatch mb;
  std::multiset<int> seen;
  for (int k = 0; k < 2; ++k) {
    b.next(c, mb);
    for (std::size_t s = 0; s + 1 < mb.cu_seqlens.size(); ++s)
      seen.insert(mb.ids[mb.cu_seqlens[s]] / 10);
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 10u);
  EXPECT_EQ(c.epoch, 0);
  EXPECT_EQ(c.index, 10);
  b.next(c, mb);  // wraps into epoch 1
  EXPECT_EQ(c.epoch, 1);
  EXPECT_EQ(c.index, 5);
  // A different epoch has a different order (10! orders; equal only by a 1-in-3.6M chance).
  std::vector<std::int64_t> e0, e1;
  for (int i = 0; i < 10; ++i) {
    e0.push_back(b.example_at(0, i));
    e1.push_back(b.example_at(1, i));
  }
  EXPECT_NE(e0, e1);
}

TEST(Batcher, PackedAndPaddedLayouts) {
  const auto data = fake_examples(4);
  for (bool padding : {false, true}) {
    Batcher b(&data, 3, 4, 8, padding, 99);
    DataCursor c;
    MicroBatch mb;
    b.next(c, mb);
    ASSERT_EQ(mb.cu_seqlens.size(), 5u);
    std::int64_t useful = 0;
    for (int s = 0; s < 4; ++s) {
      const int start = mb.cu_seqlens[s], end = mb.cu_seqlens[s + 1];
      const TokenizedExample& ex = data[mb.ids[start] / 10];
      const int len = static_cast<int>(ex.ids.size());
      EXPECT_EQ(end - start, padding ? 8 : len);
      for (int t = 0; t < end - start; ++t) {
        EXPECT_EQ(mb.positions[start + t], t);
        EXPECT_EQ(mb.ids[start + t], t < len ? ex.ids[t] : 99);
        EXPECT_EQ(mb.targets[start + t], t < len ? ex.targets[t] : kIgnoreTarget);
      }
      useful += len;
    }
    EXPECT_EQ(mb.useful_tokens, useful);
    EXPECT_EQ(mb.padded_tokens, 32);
    EXPECT_EQ(mb.tokens(), padding ? 32 : useful);
  }
}

}  // namespace
}  // namespace ferry::train
