// SPDX-License-Identifier: Apache-2.0
#include "train/optim/param_selection.h"

#include <regex>

namespace ferry::train {

Result<std::vector<bool>> select_8bit_params(const std::vector<std::string>& names,
                                             std::string_view regex) {
  if (regex.empty()) return std::vector<bool>(names.size(), true);
  std::regex re;
  try {
    re = std::regex(std::string(regex), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return invalid_argument("train: --8bit-params \"{}\" is not a valid regular expression: {}",
                            regex, e.what());
  }
  std::vector<bool> sel(names.size(), false);
  bool any = false;
  for (std::size_t i = 0; i < names.size(); ++i) {
    sel[i] = std::regex_search(names[i], re);
    any = any || sel[i];
  }
  if (!any) {
    return invalid_argument("train: --8bit-params \"{}\" matches none of the {} parameters", regex,
                            names.size());
  }
  return sel;
}

}  // namespace ferry::train
