// SPDX-License-Identifier: Apache-2.0
// Reference token embedding: out[t] = table[ids[t]]; backward scatters d_out rows back into
// d_table (accumulating, so repeated ids sum). Every id is validated before anything is written,
// so a bad id leaves the outputs untouched. Covered by dense_ref_test.cpp and dense_fd_test.cpp.
#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {
namespace {

// invalid_argument naming the first id outside [0, vocab).
Status check_ids(std::string_view who, const ConstTensorView& ids, std::int64_t vocab) {
  for (std::int64_t t = 0; t < ids.numel(); ++t) {
    const std::int32_t id = ref::load_i32(ids, t);
    if (id < 0 || id >= vocab) {
      return invalid_argument("kernels: {}: token {} has id {}, outside the vocabulary [0, {})",
                              who, t, id, vocab);
    }
  }
  return ok_status();
}

}  // namespace

Status ReferenceBackend::embedding(const EmbeddingArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference embedding";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "table", a.table, 2, kF32F64Bf16));
  FERRY_TRY(check_rank(kWho, "ids", a.ids, 1, kI32Only));
  const std::int64_t vocab = a.table.shape[0], c = a.table.shape[1], t_count = a.ids.shape[0];
  FERRY_TRY(check_view(kWho, "out", a.out, {t_count, c}, kF32F64));
  FERRY_TRY(check_ids(kWho, a.ids, vocab));
  for (std::int64_t t = 0; t < t_count; ++t) {
    const std::int64_t row = ref::load_i32(a.ids, t);
    for (std::int64_t j = 0; j < c; ++j)
      ref::store(a.out, t * c + j, ref::load(a.table, row * c + j));
  }
  return ok_status();
}

Status ReferenceBackend::embedding_backward(const EmbeddingBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference embedding_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "d_table", a.d_table, 2, kF32F64));
  FERRY_TRY(check_rank(kWho, "ids", a.ids, 1, kI32Only));
  const std::int64_t vocab = a.d_table.shape[0], c = a.d_table.shape[1], t_count = a.ids.shape[0];
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {t_count, c}, kF32F64));
  FERRY_TRY(check_ids(kWho, a.ids, vocab));
  // Each distinct id is handled at its first occurrence: all of its d_out rows are summed in f64
  // (token order) and added to d_table once, so the only rounding is the final store.
  for (std::int64_t t = 0; t < t_count; ++t) {
    const std::int32_t id = ref::load_i32(a.ids, t);
    bool seen = false;
    for (std::int64_t u = 0; u < t && !seen; ++u) seen = ref::load_i32(a.ids, u) == id;
    if (seen) continue;
    for (std::int64_t j = 0; j < c; ++j) {
      double acc = 0.0;
      for (std::int64_t u = t; u < t_count; ++u) {
        if (ref::load_i32(a.ids, u) == id) acc += ref::load(a.d_out, u * c + j);
      }
      const std::int64_t i = std::int64_t{id} * c + j;
      ref::store(a.d_table, i, ref::load(a.d_table, i) + acc);
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels
