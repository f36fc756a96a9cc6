// SPDX-License-Identifier: Apache-2.0
// The slow twin of XgbModel: predictions from libxgboost itself (Debian libxgboost-dev 1.7.4, C
// API: XGBoosterLoadModel + XGDMatrixCreateFromMat + XGBoosterPredict). Used by tests and by
// `ferry`-side checks; the router's hot path uses the tree walker in xgboost_model.h.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"

namespace ferry::route {

// rows: [n_rows * n_cols] row-major, NaN = missing. Returns [n_rows] predictions (output space).
// kNotFound / kCorrupt when the library cannot load the model; kInvalidArgument on bad sizes.
Result<std::vector<float>> xgboost_library_predict(const std::string& model_path,
                                                   const std::vector<float>& rows, int n_rows,
                                                   int n_cols);

}  // namespace ferry::route
