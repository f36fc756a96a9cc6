// SPDX-License-Identifier: Apache-2.0
// A progress bar for long jobs: on a terminal, one redrawn line with rate and ETA; otherwise
// (pipes, CI logs) a plain line at most every `plain_interval_s` seconds. Writes to stderr.
#pragma once

#include <cstdint>
#include <string>

#include "core/timer.h"

namespace ferry {

class ProgressBar {
 public:
  ProgressBar(std::string label, std::int64_t total, std::string unit = "it");
  ~ProgressBar();
  // Sets the absolute position and an optional suffix ("loss 2.31").
  void update(std::int64_t done, const std::string& suffix = "");
  void finish(const std::string& suffix = "");

  // Formats a duration as "1h02m", "3m05s" or "12.3s".
  static std::string format_duration(double seconds);

 private:
  void draw(bool force, const std::string& suffix);
  std::string label_;
  std::int64_t total_;
  std::int64_t done_ = 0;
  std::string unit_;
  bool tty_;
  bool finished_ = false;
  Timer timer_;
  double last_draw_s_ = -1.0;
  double plain_interval_s_ = 5.0;
};

}  // namespace ferry
