// SPDX-License-Identifier: Apache-2.0
#include "train/stream/layer_optimizer.h"

#include <cstring>

#include "core/timer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/simd_kernels.h"

namespace ferry::train::stream {

namespace kc = kernels::cpu;

LayerOptimizer::LayerOptimizer(HostArena& arena, std::function<void(int)> before_unit)
    : arena_(arena), before_unit_(std::move(before_unit)) {
  order_.push_back(arena.globals_unit());
  for (int u = 0; u < arena.globals_unit(); ++u) order_.push_back(u);
  done_.assign(static_cast<std::size_t>(arena.num_units()), 0);
  worker_ = std::thread([this] { run(); });
}

LayerOptimizer::~LayerOptimizer() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void LayerOptimizer::submit(const UpdateArgs& args) {
  wait_all();
  {
    std::lock_guard lk(mu_);
    args_ = args;
    ++submitted_;
  }
  cv_.notify_all();
}

void LayerOptimizer::wait_ready(int unit) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_[static_cast<std::size_t>(unit)] >= submitted_; });
}

bool LayerOptimizer::is_ready(int unit) const {
  std::lock_guard lk(mu_);
  return done_[static_cast<std::size_t>(unit)] >= submitted_;
}

void LayerOptimizer::wait_all() {
  for (int u : order_) wait_ready(u);
}

double LayerOptimizer::busy_s() const {
  std::lock_guard lk(mu_);
  return busy_s_;
}

void LayerOptimizer::run() {
  std::uint64_t applied = 0;
  for (;;) {
    UpdateArgs a;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || submitted_ > applied; });
      if (stop_) return;
      a = args_;
      applied = submitted_;
    }
    for (int u : order_) {
      if (before_unit_) before_unit_(u);
      Timer t;
      update_unit(u, a);
      {
        std::lock_guard lk(mu_);
        done_[static_cast<std::size_t>(u)] = applied;
        busy_s_ += t.elapsed_s();
      }
      cv_.notify_all();
    }
  }
}

void LayerOptimizer::update_unit(int u, const UpdateArgs& a) {
  const kc::Isa isa = kc::best_isa();
  const OptimMode& mode = arena_.mode();
  const bool bf16 = arena_.bf16_master();
  const kc::MasterKind mk = mode.master == MasterWeights::kF32         ? kc::MasterKind::kF32
                            : mode.master == MasterWeights::kBf16Kahan ? kc::MasterKind::kBf16Kahan
                                                                       : kc::MasterKind::kBf16Sr;
  for (int idx : arena_.unit_params(u)) {
    const ParamLoc& p = arena_.params()[static_cast<std::size_t>(idx)];
    const kc::AdamWConstants k = kc::make_adamw_constants(
        a.lr, a.beta1, a.beta2, a.eps, p.decay ? a.weight_decay : 0.0f, a.grad_scale, a.step);
    const float* g = arena_.grads(u) + p.offset;
    if (mode == OptimMode{}) {
      // Backend::adamw's kernel: what the in-memory executor runs for fp32/fp32 (every other
      // mode, fp32-state parameters of an 8-bit subset included, takes the hybrid kernel there).
      kc::adamw_span(isa, k, arena_.master(u) + p.offset, arena_.m32(p), arena_.v32(p), nullptr, g,
                     p.n);
      continue;
    }
    kc::HybridAdamWSpan s;
    s.n = p.n;
    s.grad = g;
    if (bf16) {
      s.p16 = arena_.w16(u) + p.offset;  // the weights, updated in place (the streaming copy)
      if (mk == kc::MasterKind::kBf16Kahan) s.comp16 = arena_.comp16(u) + p.offset;
    } else {
      s.p32 = arena_.master(u) + p.offset;
    }
    if (p.q8) {
      s.m8 = arena_.m8(p);
      s.v8 = arena_.v8(p);
      s.m_absmax = arena_.m_absmax(p);
      s.v_absmax = arena_.v_absmax(p);
    } else {
      s.m32 = arena_.m32(p);
      s.v32 = arena_.v32(p);
    }
    s.index0 = 0;  // the whole parameter in one span
    s.sr_key = kc::sr_key(a.sr_seed, a.step, static_cast<std::uint64_t>(p.index));
    kc::hybrid_adamw_span(isa, mk, p.q8 ? kc::StateKind::kQ8 : kc::StateKind::kF32, k, s);
  }
  // The streaming copy the device reads (on a GPU build: the bf16 conversion). bf16 masters
  // were updated in place: they are the streaming copy.
  if (!bf16) {
    std::memcpy(arena_.weights(u), arena_.master(u),
                static_cast<std::size_t>(arena_.unit_elements(u)) * sizeof(float));
  }
}

}  // namespace ferry::train::stream
