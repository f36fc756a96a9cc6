// SPDX-License-Identifier: Apache-2.0
#include "train/stream/layer_optimizer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/timer.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/q8_code.h"
#include "kernels/cpu/simd_kernels.h"

namespace ferry::train::stream {

namespace kc = kernels::cpu;

LayerOptimizer::LayerOptimizer(HostArena& arena, int threads, std::function<void(int)> before_unit,
                               HeadUpdate head)
    : arena_(arena), before_unit_(std::move(before_unit)), head_(head) {
  // The pool's workers plus the worker thread itself (parallel_for runs one chunk on the caller).
  if (threads > 1) pool_ = std::make_unique<ThreadPool>(static_cast<std::size_t>(threads - 1));
  const int G = arena.globals_unit(), H = head_unit();
  order_.push_back(G);
  if (head_ == HeadUpdate::kEarly) order_.push_back(H);
  for (int u = 0; u < G; ++u) order_.push_back(u);
  if (head_ == HeadUpdate::kLate) order_.push_back(H);
  const auto slots = static_cast<std::size_t>(H + 1);  // the arena's units + the head part
  done_.assign(slots, 0);
  external_.assign(slots, false);
  unit_busy_s_.assign(slots, 0.0);
  // Each unit's chunks, in parameter order: the same every step, so listed once here. The
  // globals' first parameter is the embedding (param_specs order): its chunks are unit G's, the
  // other globals' (final norm, lm_head) the head part's.
  const std::vector<int>& globals = arena.unit_params(G);
  FERRY_CHECK(!globals.empty() && arena.params()[static_cast<std::size_t>(globals[0])].index == 0,
              "train: the globals unit does not start with the embedding");
  embed_elements_ = arena.params()[static_cast<std::size_t>(globals[0])].n;
  chunks_.resize(slots);
  for (int u = 0; u <= G; ++u) {
    for (int idx : arena.unit_params(u)) {
      const std::int64_t n = arena.params()[static_cast<std::size_t>(idx)].n;
      const int to = u == G && idx != globals[0] ? H : u;
      for (std::int64_t b = 0; b < n; b += kChunk)
        chunks_[static_cast<std::size_t>(to)].push_back({idx, b});
    }
  }
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
    bottom_ = shared_first_;
    top_ = arena_.globals_unit();
  }
  cv_.notify_all();
}

void LayerOptimizer::wait_ready(int unit) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_[static_cast<std::size_t>(unit)] >= submitted_; });
}

void LayerOptimizer::set_external(const std::vector<int>& units) {
  wait_all();
  std::lock_guard lk(mu_);
  for (int u : units) {
    FERRY_CHECK(u >= 0 && u < arena_.num_units(), "train: external unit {} of {}", u,
                arena_.num_units());
    external_[static_cast<std::size_t>(u)] = true;
  }
}

void LayerOptimizer::mark_external_done(int unit) {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(external_[static_cast<std::size_t>(unit)], "train: unit {} is not external", unit);
    done_[static_cast<std::size_t>(unit)] = submitted_;
  }
  cv_.notify_all();
}

void LayerOptimizer::share_layers(int bottom_max, int first) {
  wait_all();
  std::lock_guard lk(mu_);
  FERRY_CHECK(first >= 0 && bottom_max >= 0 && first + bottom_max <= arena_.globals_unit(),
              "train: {} shared layers from layer {} of {}", bottom_max, first,
              arena_.globals_unit());
  for (int u = 0; u < first; ++u) {
    FERRY_CHECK(external_[static_cast<std::size_t>(u)],
                "train: layer {} below the shared range "
                "{} is not external",
                u, first);
  }
  shared_ = true;
  bottom_max_ = bottom_max;
  shared_first_ = first;
}

int LayerOptimizer::claim_bottom() {
  std::lock_guard lk(mu_);
  FERRY_CHECK(shared_, "train: claim_bottom without share_layers");
  if (bottom_ >= top_ || bottom_ - shared_first_ >= bottom_max_) return -1;
  return bottom_++;
}

int LayerOptimizer::claim_top(std::uint64_t gen) {
  std::lock_guard lk(mu_);
  // A newer update was submitted once this one's units were all ready: its range is not ours.
  if (gen != submitted_ || top_ <= bottom_) return -1;
  return --top_;
}

void LayerOptimizer::mark_bottom_done(int unit) {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(shared_ && unit >= shared_first_ && unit < bottom_,
                "train: layer {} was not claimed", unit);
    done_[static_cast<std::size_t>(unit)] = submitted_;
  }
  cv_.notify_all();
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
  return std::accumulate(unit_busy_s_.begin(), unit_busy_s_.end(), 0.0);
}

std::vector<double> LayerOptimizer::unit_busy_s() const {
  std::lock_guard lk(mu_);
  std::vector<double> out(unit_busy_s_.begin(), unit_busy_s_.end() - 1);
  out.back() += unit_busy_s_.back();  // the globals: embedding + head
  return out;
}

std::array<double, 2> LayerOptimizer::globals_busy_s() const {
  std::lock_guard lk(mu_);
  return {unit_busy_s_[static_cast<std::size_t>(arena_.globals_unit())], unit_busy_s_.back()};
}

void LayerOptimizer::run() {
  std::uint64_t applied = 0;
  for (;;) {
    UpdateArgs a;
    bool shared = false;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || submitted_ > applied; });
      if (stop_) return;
      a = args_;
      applied = submitted_;
      shared = shared_;
    }
    auto update = [&](int u) {
      if (before_unit_) before_unit_(u);
      Timer t;
      update_unit(u, a);
      {
        std::lock_guard lk(mu_);
        done_[static_cast<std::size_t>(u)] = applied;
        unit_busy_s_[static_cast<std::size_t>(u)] += t.elapsed_s();
      }
      cv_.notify_all();
    };
    if (shared) {
      // The embedding (the forward reads it first), the head with kEarly, then layers from the
      // top until the bottom-up updater is met, then the head with kLate.
      update(arena_.globals_unit());
      if (head_ == HeadUpdate::kEarly) update(head_unit());
      for (int u = claim_top(applied); u >= 0; u = claim_top(applied)) update(u);
      if (head_ == HeadUpdate::kLate) update(head_unit());
      continue;
    }
    for (int u : order_) {
      if (external_[static_cast<std::size_t>(u)]) continue;  // its updater marks it done
      update(u);
    }
  }
}

void LayerOptimizer::update_unit(int u, const UpdateArgs& a) {
  const std::vector<Chunk>& chunks = chunks_[static_cast<std::size_t>(u)];
  auto run_chunks = [&](std::size_t lo, std::size_t hi) {
    for (std::size_t c = lo; c < hi; ++c) {
      const ParamLoc& p = arena_.params()[static_cast<std::size_t>(chunks[c].idx)];
      update_range(u, chunks[c].idx, a, chunks[c].begin, std::min(p.n, chunks[c].begin + kChunk));
    }
  };
  if (pool_) {
    pool_->parallel_for(chunks.size(), run_chunks);
  } else {
    run_chunks(0, chunks.size());
  }
}

void LayerOptimizer::update_range(int unit, int idx, const UpdateArgs& a, std::int64_t begin,
                                  std::int64_t end) {
  const int u = arena_unit(unit);  // the head part's sections are the globals unit's
  const kc::Isa isa = kc::best_isa();
  const OptimMode& mode = arena_.mode();
  const bool bf16 = arena_.bf16_master();
  const kc::MasterKind mk = mode.master == MasterWeights::kF32         ? kc::MasterKind::kF32
                            : mode.master == MasterWeights::kBf16Kahan ? kc::MasterKind::kBf16Kahan
                                                                       : kc::MasterKind::kBf16Sr;
  const ParamLoc& p = arena_.params()[static_cast<std::size_t>(idx)];
  const std::int64_t n = end - begin;
  const std::int64_t at = p.offset + begin;  // element offset within the unit's sections
  const kc::AdamWConstants k = kc::make_adamw_constants(
      a.lr, a.beta1, a.beta2, a.eps, p.decay ? a.weight_decay : 0.0f, a.grad_scale, a.step);
  const float* g = nullptr;
  if (arena_.bf16_grads()) {
    // bf16 gradients widened exactly into a per-thread chunk buffer (kChunk floats stay in L2):
    // the kernels read the f32 values the in-memory executor's rounded gradients hold.
    thread_local std::vector<float> widened;
    widened.resize(static_cast<std::size_t>(n));
    const std::uint16_t* g16 = arena_.grads16(u) + at;
    for (std::int64_t e = 0; e < n; ++e) widened[static_cast<std::size_t>(e)] = bf16_to_f32(g16[e]);
    g = widened.data();
  } else {
    g = arena_.grads(u) + at;
  }
  // fp32 master with a bf16 streaming copy: the kernel writes it (round to nearest even) while
  // it updates the chunk.
  std::uint16_t* copy16 = !bf16 && arena_.bf16_weights() ? arena_.w16(u) + at : nullptr;
  if (mode == OptimMode{}) {
    // Backend::adamw's kernel: what the in-memory executor runs for fp32/fp32 (every other
    // mode, fp32-state parameters of an 8-bit subset included, takes the hybrid kernel there).
    kc::adamw_span(isa, k, arena_.master(u) + at, arena_.m32(p) + begin, arena_.v32(p) + begin,
                   copy16, g, n);
  } else {
    kc::HybridAdamWSpan s;
    s.n = n;
    s.grad = g;
    if (bf16) {
      s.p16 = arena_.w16(u) + at;  // the weights, updated in place (the streaming copy)
      if (mk == kc::MasterKind::kBf16Kahan) s.comp16 = arena_.comp16(u) + at;
    } else {
      s.p32 = arena_.master(u) + at;
      s.p16 = copy16;
    }
    if (p.q8) {  // begin is a multiple of kChunk, itself of the 8-bit block
      s.m8 = arena_.m8(p) + begin;
      s.v8 = arena_.v8(p) + begin;
      s.m_absmax = arena_.m_absmax(p) + begin / kc::q8::kBlock;
      s.v_absmax = arena_.v_absmax(p) + begin / kc::q8::kBlock;
    } else {
      s.m32 = arena_.m32(p) + begin;
      s.v32 = arena_.v32(p) + begin;
    }
    s.index0 = static_cast<std::uint64_t>(begin);
    s.sr_key = kc::sr_key(a.sr_seed, a.step, static_cast<std::uint64_t>(p.index));
    kc::hybrid_adamw_span(isa, mk, p.q8 ? kc::StateKind::kQ8 : kc::StateKind::kF32, k, s);
  }
  // The f32 streaming copy the device reads, while the chunk is in cache. bf16 masters were
  // updated in place (they are the streaming copy); a bf16 copy was written by the kernel.
  if (!arena_.bf16_weights()) {
    std::memcpy(arena_.weights(u) + at, arena_.master(u) + at,
                static_cast<std::size_t>(n) * sizeof(float));
  }
}

}  // namespace ferry::train::stream
