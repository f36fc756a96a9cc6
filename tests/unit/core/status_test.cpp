// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "core/result.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace ferry {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("test: {} is not positive", x);
  return x * 2;
}

Status use_try(int x, int* out) {
  FERRY_ASSIGN_OR_RETURN(const int v, parse_positive(x));
  *out = v;
  return {};
}

TEST(Status, ResultCarriesValueOrError) {
  int out = 0;
  EXPECT_TRUE(use_try(3, &out).ok());
  EXPECT_EQ(out, 6);
  const Status s = use_try(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid_argument: test: -1 is not positive");
  EXPECT_EQ(s.with_context("ctx").message(), "ctx: test: -1 is not positive");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = parse_positive(0);
  EXPECT_DEATH((void)r.value(), "check failed");
}

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (std::size_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<int> hits(n, 0);
    pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) hits[i]++;
    });
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1);
  }
}

}  // namespace
}  // namespace ferry
