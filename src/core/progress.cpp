// SPDX-License-Identifier: Apache-2.0
#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace ferry {

ProgressBar::ProgressBar(std::string label, std::int64_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      tty_(isatty(STDERR_FILENO)) {}

ProgressBar::~ProgressBar() {
  if (!finished_) finish();
}

std::string ProgressBar::format_duration(double s) {
  if (s < 0 || s != s) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<std::int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}h{:02}m", total / 3600, (total % 3600) / 60);
}

void ProgressBar::update(std::int64_t done, const std::string& suffix) {
  done_ = done;
  draw(false, suffix);
}

void ProgressBar::finish(const std::string& suffix) {
  if (finished_) return;
  draw(true, suffix);
  if (tty_) std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::draw(bool force, const std::string& suffix) {
  const double now = timer_.elapsed_s();
  const double min_gap = tty_ ? 0.1 : plain_interval_s_;
  if (!force && last_draw_s_ >= 0 && now - last_draw_s_ < min_gap) return;
  last_draw_s_ = now;
  const double rate = now > 0 ? static_cast<double>(done_) / now : 0.0;
  const double eta = (rate > 0 && total_ > 0) ? static_cast<double>(total_ - done_) / rate : -1.0;
  const double frac = total_ > 0 ? std::clamp(double(done_) / double(total_), 0.0, 1.0) : 0.0;
  std::string line;
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    line = fmt::format("\r{} [{}{}] {}/{} {:.2f} {}/s eta {} {}\x1b[K", label_,
                       std::string(filled, '#'), std::string(kWidth - filled, '.'), done_, total_,
                       rate, unit_, format_duration(eta), suffix);
  } else {
    line = fmt::format("{} {}/{} ({:.0f}%) {:.2f} {}/s eta {} {}\n", label_, done_, total_,
                       frac * 100, rate, unit_, format_duration(eta), suffix);
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace ferry
