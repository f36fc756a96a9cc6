// SPDX-License-Identifier: Apache-2.0
#include "train/stream/exposure_clock.h"

#include "core/check.h"

namespace ferry::train::stream {

Result<std::unique_ptr<ExposureClock>> ExposureClock::create(mem::Stream* gpu_compute,
                                                             int max_waits, int windows) {
  std::unique_ptr<ExposureClock> c(new ExposureClock());
  c->stream_ = gpu_compute;
  c->window_s_.assign(static_cast<std::size_t>(windows), 0.0);
  c->window_exposed_s_.assign(static_cast<std::size_t>(windows), 0.0);
  if (gpu_compute == nullptr) return c;
  auto make = [&](std::vector<Pair>& v, int n) -> Status {
    v.resize(static_cast<std::size_t>(n));
    for (Pair& p : v) {
      FERRY_ASSIGN_OR_RETURN(
          p.begin, mem::Event::create(gpu_compute->device(), gpu_compute->device_index(), true));
      FERRY_ASSIGN_OR_RETURN(
          p.end, mem::Event::create(gpu_compute->device(), gpu_compute->device_index(), true));
    }
    return {};
  };
  FERRY_TRY(make(c->waits_, max_waits));
  FERRY_TRY(make(c->windows_, windows));
  return c;
}

void ExposureClock::begin_micro_batch() {
  waits_used_ = windows_used_ = 0;
  open_window_ = -1;
  in_wait_ = false;
}

Status ExposureClock::wait_begin() {
  FERRY_CHECK(!in_wait_, "train: nested exposure waits");
  in_wait_ = true;
  if (stream_ == nullptr) {
    wait_timer_.reset();
    return {};
  }
  FERRY_CHECK(waits_used_ < static_cast<int>(waits_.size()),
              "train: more than {} exposure waits in a micro-batch", waits_.size());
  Pair& p = waits_[static_cast<std::size_t>(waits_used_)];
  p.window = open_window_;
  return p.begin.record(*stream_);
}

Status ExposureClock::wait_end() {
  FERRY_CHECK(in_wait_, "train: exposure wait ended without a begin");
  in_wait_ = false;
  if (stream_ == nullptr) {
    const double s = wait_timer_.elapsed_s();
    exposed_s_ += s;
    if (open_window_ >= 0) window_exposed_s_[static_cast<std::size_t>(open_window_)] += s;
    return {};
  }
  return waits_[static_cast<std::size_t>(waits_used_++)].end.record(*stream_);
}

Status ExposureClock::window_begin(int w) {
  FERRY_CHECK(open_window_ < 0 && w >= 0 && w < static_cast<int>(window_s_.size()),
              "train: window {} opened while {} is open", w, open_window_);
  open_window_ = w;
  if (stream_ == nullptr) {
    window_timer_.reset();
    return {};
  }
  FERRY_CHECK(windows_used_ < static_cast<int>(windows_.size()),
              "train: more than {} windows in a micro-batch", windows_.size());
  Pair& p = windows_[static_cast<std::size_t>(windows_used_)];
  p.window = w;
  return p.begin.record(*stream_);
}

Status ExposureClock::window_end() {
  FERRY_CHECK(open_window_ >= 0, "train: window ended without a begin");
  const auto w = static_cast<std::size_t>(open_window_);
  open_window_ = -1;
  if (stream_ == nullptr) {
    window_s_[w] += window_timer_.elapsed_s();
    return {};
  }
  return windows_[static_cast<std::size_t>(windows_used_++)].end.record(*stream_);
}

Status ExposureClock::collect(double* exposed_s, std::vector<double>& window_s,
                              std::vector<double>& window_exposed_s) {
  FERRY_CHECK(!in_wait_ && open_window_ < 0, "train: exposure collected inside a wait/window");
  if (stream_ != nullptr) {
    for (int i = 0; i < waits_used_; ++i) {
      const Pair& p = waits_[static_cast<std::size_t>(i)];
      FERRY_ASSIGN_OR_RETURN(const float ms, mem::Event::elapsed_ms(p.begin, p.end));
      exposed_s_ += ms * 1e-3;
      if (p.window >= 0) window_exposed_s_[static_cast<std::size_t>(p.window)] += ms * 1e-3;
    }
    for (int i = 0; i < windows_used_; ++i) {
      const Pair& p = windows_[static_cast<std::size_t>(i)];
      FERRY_ASSIGN_OR_RETURN(const float ms, mem::Event::elapsed_ms(p.begin, p.end));
      window_s_[static_cast<std::size_t>(p.window)] += ms * 1e-3;
    }
  }
  *exposed_s += exposed_s_;
  for (std::size_t w = 0; w < window_s_.size(); ++w) {
    window_s[w] += window_s_[w];
    window_exposed_s[w] += window_exposed_s_[w];
    window_s_[w] = window_exposed_s_[w] = 0.0;
  }
  exposed_s_ = 0.0;
  waits_used_ = windows_used_ = 0;
  return {};
}

}  // namespace ferry::train::stream
