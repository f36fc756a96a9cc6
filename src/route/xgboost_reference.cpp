// SPDX-License-Identifier: Apache-2.0
// libxgboost C-API predictions (see xgboost_reference.h).
#include "route/xgboost_reference.h"

#include <cmath>
#include <filesystem>

#include <xgboost/c_api.h>

namespace ferry::route {
namespace {

Status xgb_status(int rc, std::string_view call, const std::string& path) {
  if (rc == 0) return ok_status();
  return internal_error("route: xgboost: {} failed for {}: {}", call, path, XGBGetLastError());
}

}  // namespace

Result<std::vector<float>> xgboost_library_predict(const std::string& model_path,
                                                   const std::vector<float>& rows, int n_rows,
                                                   int n_cols) {
  if (n_rows <= 0 || n_cols <= 0 ||
      rows.size() != static_cast<std::size_t>(n_rows) * static_cast<std::size_t>(n_cols)) {
    return invalid_argument("route: xgboost: {} values for {} x {} rows", rows.size(), n_rows,
                            n_cols);
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec)) {
    return not_found("route: xgboost: model file {} not found", model_path);
  }
  BoosterHandle booster = nullptr;
  DMatrixHandle dmat = nullptr;
  std::vector<float> out;
  Status st = xgb_status(XGBoosterCreate(nullptr, 0, &booster), "XGBoosterCreate", model_path);
  if (st.ok()) {
    st = xgb_status(XGBoosterLoadModel(booster, model_path.c_str()), "XGBoosterLoadModel",
                    model_path);
  }
  if (st.ok()) {
    st = xgb_status(XGBoosterSetParam(booster, "nthread", "1"), "XGBoosterSetParam", model_path);
  }
  if (st.ok()) {
    st = xgb_status(XGDMatrixCreateFromMat(rows.data(), static_cast<bst_ulong>(n_rows),
                                           static_cast<bst_ulong>(n_cols), NAN, &dmat),
                    "XGDMatrixCreateFromMat", model_path);
  }
  if (st.ok()) {
    bst_ulong len = 0;
    const float* pred = nullptr;
    st = xgb_status(XGBoosterPredict(booster, dmat, 0, 0, 0, &len, &pred), "XGBoosterPredict",
                    model_path);
    if (st.ok() && len != static_cast<bst_ulong>(n_rows)) {
      st = internal_error("route: xgboost: {} predictions for {} rows", len, n_rows);
    }
    if (st.ok()) out.assign(pred, pred + len);
  }
  if (dmat != nullptr) XGDMatrixFree(dmat);
  if (booster != nullptr) XGBoosterFree(booster);
  if (!st.ok()) return st;
  return out;
}

}  // namespace ferry::route
