// SPDX-License-Identifier: Apache-2.0
// Budget controllers: turn a per-frame estimator score and the current budget ρ into an offload
// decision.
// - EcdfThresholdController (the paper's rule): u(s) = mid-rank ECDF of calibration scores;
//   offload iff u > 1−ρ; an exact tie u == 1−ρ offloads while n_off < ρ·t. Its realised ratio
//   drifts when test scores are distributed differently from calibration.
// - FeedbackController: the same threshold plus a virtual-queue term: offload iff
//   u(s) > (1−ρ_t) + η·D_t, D_t = Σ_{k<t} (offloaded_k − ρ_k) (the budget debt). When D_t > 1/η
//   the threshold exceeds 1 and nothing is offloaded; when D_t < −1/η it is below 0 and every
//   frame is. Hence |D_T| ≤ 1/η + 1 for any score sequence, and the realised ratio after T frames
//   is within (1/η + 1)/T of the mean ρ: with η = 0.05 and T ≥ 2,100 frames, within ±0.01,
//   whatever the distribution shift (tests/unit/route/controller_test.cpp).
// - TokenBucket: a hard cap: tokens refill at `rate` per frame up to `burst`; an offload takes one.
//   Over any window of w frames at most burst + rate·w frames are offloaded.
// Thread-safety: none; one controller per stream. decide() is O(log |C|), allocation-free.
#pragma once

#include <cstdint>
#include <vector>

#include "route/targets.h"

namespace ferry::route {

class OffloadController {
 public:
  virtual ~OffloadController() = default;
  // Decides for the next frame with estimator score `score` under budget rho in [0, 1].
  virtual bool decide(double score, double rho) = 0;
  virtual void reset() = 0;
  std::int64_t frames() const { return frames_; }
  std::int64_t offloaded() const { return offloaded_; }
  double realised_ratio() const {
    return frames_ == 0 ? 0.0 : static_cast<double>(offloaded_) / static_cast<double>(frames_);
  }

 protected:
  void count(bool off) {
    ++frames_;
    offloaded_ += off;
  }
  void clear_counts() { frames_ = offloaded_ = 0; }

 private:
  std::int64_t frames_ = 0, offloaded_ = 0;
};

class EcdfThresholdController final : public OffloadController {
 public:
  explicit EcdfThresholdController(std::vector<double> calibration_scores)
      : ecdf_(std::move(calibration_scores)) {}
  bool decide(double score, double rho) override;
  void reset() override { clear_counts(); }

 private:
  Ecdf ecdf_;
};

class FeedbackController final : public OffloadController {
 public:
  FeedbackController(std::vector<double> calibration_scores, double gain)
      : ecdf_(std::move(calibration_scores)), gain_(gain) {}
  bool decide(double score, double rho) override;
  void reset() override {
    clear_counts();
    debt_ = 0;
  }
  double debt() const { return debt_; }

 private:
  Ecdf ecdf_;
  double gain_;
  double debt_ = 0;  // Σ (offloaded − ρ) so far
};

class TokenBucket {
 public:
  TokenBucket(double rate_per_frame, double burst)
      : rate_(rate_per_frame), burst_(burst), tokens_(burst) {}
  // Advances one frame (refill), then takes a token if `want` and one is available.
  bool admit(bool want);
  double tokens() const { return tokens_; }
  void set_rate(double rate_per_frame) { rate_ = rate_per_frame; }

 private:
  double rate_, burst_, tokens_;
};

}  // namespace ferry::route
