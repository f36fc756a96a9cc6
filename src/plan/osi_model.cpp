// SPDX-License-Identifier: Apache-2.0
#include "plan/osi_model.h"

#include <vector>

#include <coin/CoinPackedMatrix.hpp>

namespace ferry::plan::detail {

std::unique_ptr<OsiClpSolverInterface> make_osi(const LinearModel& m) {
  const int rows = m.num_rows();
  std::vector<CoinBigIndex> start(rows + 1, 0);
  std::vector<int> len(rows, 0);
  for (int r = 0; r < rows; ++r) {
    start[r] = m.row_begin[r];
    len[r] = m.row_begin[r + 1] - m.row_begin[r];
  }
  if (rows > 0) start[rows] = m.row_begin[rows];
  const CoinPackedMatrix matrix(/*colordered=*/false, m.num_cols(), rows,
                                static_cast<CoinBigIndex>(m.row_col.size()), m.row_val.data(),
                                m.row_col.data(), start.data(), len.data());
  auto osi = std::make_unique<OsiClpSolverInterface>();
  osi->messageHandler()->setLogLevel(0);
  osi->setHintParam(OsiDoReducePrint, true, OsiHintTry);
  osi->loadProblem(matrix, m.col_lb.data(), m.col_ub.data(), m.obj.data(), m.row_lb.data(),
                   m.row_ub.data());
  for (int c = 0; c < m.num_cols(); ++c) {
    if (m.integer[c]) osi->setInteger(c);
  }
  return osi;
}

}  // namespace ferry::plan::detail
