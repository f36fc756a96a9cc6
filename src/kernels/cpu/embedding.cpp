// SPDX-License-Identifier: Apache-2.0
// CPU embedding gather and its backward (scatter-add into d_table), f32, threaded.
// Every id is validated before anything is written (invalid_argument names the first bad one).
// The backward splits columns, not tokens, across threads: each thread adds the rows of all T
// tokens, in token order, into its own column range, so repeated ids never race and the result
// does not depend on the thread count. Covered by dense_cpu_vs_ref_test.cpp.
#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {
namespace {

Status check_ids(std::string_view who, const ConstTensorView& ids, std::int64_t vocab) {
  const auto* p = ids.as<std::int32_t>();
  for (std::int64_t t = 0; t < ids.numel(); ++t) {
    if (p[t] < 0 || p[t] >= vocab) {
      return invalid_argument("kernels: {}: token {} has id {}, outside the vocabulary [0, {})",
                              who, t, p[t], vocab);
    }
  }
  return ok_status();
}

}  // namespace

Status CpuBackend::embedding(const EmbeddingArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu embedding";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "table", a.table, 2, kF32Only));
  FERRY_TRY(check_rank(kWho, "ids", a.ids, 1, kI32Only));
  const std::int64_t vocab = a.table.shape[0], c = a.table.shape[1], t_count = a.ids.shape[0];
  FERRY_TRY(check_view(kWho, "out", a.out, {t_count, c}, kF32Only));
  FERRY_TRY(check_ids(kWho, a.ids, vocab));
  const auto* ids = a.ids.as<std::int32_t>();
  const auto* table = a.table.as<float>();
  auto* out = a.out.as<float>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(t_count),
      [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t)
          std::memcpy(out + static_cast<std::int64_t>(t) * c, table + ids[t] * c,
                      static_cast<std::size_t>(c) * sizeof(float));
      },
      /*min_chunk=*/
      static_cast<std::size_t>(std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, c))));
  return ok_status();
}

Status CpuBackend::embedding_backward(const EmbeddingBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu embedding_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "d_table", a.d_table, 2, kF32Only));
  FERRY_TRY(check_rank(kWho, "ids", a.ids, 1, kI32Only));
  const std::int64_t vocab = a.d_table.shape[0], c = a.d_table.shape[1], t_count = a.ids.shape[0];
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {t_count, c}, kF32Only));
  FERRY_TRY(check_ids(kWho, a.ids, vocab));
  const auto* ids = a.ids.as<std::int32_t>();
  const auto* d_out = a.d_out.as<float>();
  auto* d_table = a.d_table.as<float>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(c),
      [&](std::size_t j0, std::size_t j1) {
        for (std::int64_t t = 0; t < t_count; ++t) {
          float* dst = d_table + ids[t] * c;
          const float* src = d_out + t * c;
          for (std::size_t j = j0; j < j1; ++j) dst[j] += src[j];
        }
      },
      /*min_chunk=*/
      static_cast<std::size_t>(
          std::max<std::int64_t>(64, 16384 / std::max<std::int64_t>(1, t_count))));
  return ok_status();
}

}  // namespace ferry::kernels
