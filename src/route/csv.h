// SPDX-License-Identifier: Apache-2.0
// A small RFC-4180 CSV reader (quoted fields, doubled quotes, '#' comment lines before the header)
// for the artifact's result tables, returning Status on malformed input.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace ferry::route {

class CsvTable {
 public:
  static Result<CsvTable> parse(std::string_view text, std::string_view what);
  static Result<CsvTable> load(const std::string& path);

  std::size_t rows() const { return rows_.size(); }
  bool has_column(std::string_view name) const { return col_.count(std::string(name)) > 0; }
  // Errors: kCorrupt if the column is missing; for number(), if the cell is not a finite number.
  Result<std::string> cell(std::size_t row, std::string_view column) const;
  Result<double> number(std::size_t row, std::string_view column) const;

 private:
  std::string what_;
  std::map<std::string, std::size_t> col_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ferry::route
