// SPDX-License-Identifier: Apache-2.0
// CSV reader (see csv.h).
#include "route/csv.h"

#include <charconv>
#include <cmath>

#include "core/file_util.h"

namespace ferry::route {

Result<CsvTable> CsvTable::parse(std::string_view text, std::string_view what) {
  CsvTable t;
  t.what_ = std::string(what);
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> rec;
  std::string field;
  bool in_quotes = false, at_line_start = true, skipping_comment = false;
  int line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (skipping_comment) {
      if (c == '\n') skipping_comment = false, at_line_start = true, ++line;
      continue;
    }
    if (at_line_start && !in_quotes && c == '#' && records.empty()) {
      skipping_comment = true;
      continue;
    }
    at_line_start = false;
    if (in_quotes) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          in_quotes = false;
        }
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"') {
      in_quotes = true;
    } else if (c == ',') {
      rec.push_back(std::move(field));
      field.clear();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      rec.push_back(std::move(field));
      field.clear();
      if (!(rec.size() == 1 && rec[0].empty())) records.push_back(std::move(rec));
      rec.clear();
      at_line_start = true;
      ++line;
    } else {
      field += c;
    }
  }
  if (in_quotes) return corrupt("route: {}: unterminated quoted field at line {}", what, line);
  if (!field.empty() || !rec.empty()) {
    rec.push_back(std::move(field));
    records.push_back(std::move(rec));
  }
  if (records.empty()) return corrupt("route: {}: no header row", what);
  for (std::size_t c = 0; c < records[0].size(); ++c) t.col_[records[0][c]] = c;
  for (std::size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != records[0].size()) {
      return corrupt("route: {}: row {} has {} fields, header has {}", what, r + 1,
                     records[r].size(), records[0].size());
    }
    t.rows_.push_back(std::move(records[r]));
  }
  return t;
}

Result<CsvTable> CsvTable::load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse(text, path);
}

Result<std::string> CsvTable::cell(std::size_t row, std::string_view column) const {
  const auto it = col_.find(std::string(column));
  if (it == col_.end()) return corrupt("route: {}: no column '{}'", what_, column);
  if (row >= rows_.size()) return out_of_range("route: {}: row {} of {}", what_, row, rows_.size());
  return rows_[row][it->second];
}

Result<double> CsvTable::number(std::size_t row, std::string_view column) const {
  FERRY_ASSIGN_OR_RETURN(std::string s, cell(row, column));
  double v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) {
    return corrupt("route: {}: row {} column '{}': '{}' is not a number", what_, row + 2, column,
                   s);
  }
  return v;
}

}  // namespace ferry::route
