// SPDX-License-Identifier: Apache-2.0
// Host optimizer throughput (parameters/s) and achieved memory bandwidth, fp32 AdamW against the
// hybrid modes (8-bit states x fp32 / bf16-kahan / bf16-sr masters), next to a stream-copy
// (memcpy) and a STREAM-style triad measured in the same run on the same threads, with the ratio
// to the copy printed. Bytes are what each update must move per parameter (reads + writes of the
// gradient, master / weights and states; no f32 compute view for the bf16 masters, as in the
// streaming arena), so GB/s is comparable across modes and with the copy.
//   optimizer_bench [--n PARAMS] [--reps R] [--json PATH]
// Threads: the global pool (FERRY_NUM_THREADS, default all cores); ISA: cpu_isa.h's choice
// (FERRY_CPU_ISA lowers it). Build Release for meaningful numbers.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu_info.h"
#include "core/json.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "mem/stream.h"
#include "train/optim/hybrid_update.h"
#include "train/optim/optim_modes.h"
#include "train/rng.h"

namespace {

using ferry::ThreadPool;
using ferry::train::MasterWeights;
using ferry::train::OptimizerStates;
using ferry::train::OptimMode;
namespace kc = ferry::kernels::cpu;

struct Row {
  std::string name;
  double bytes_per_param;  // moved per element (reads + writes)
  std::function<void()> run;
  double seconds = 0.0;      // median wall time
  double cpu_seconds = 0.0;  // median process CPU time / threads (less sensitive to preemption)
};

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// NOTE(optim): the machines this runs on are shared, so the cases are timed round-robin (one
// warm-up each, then rep r of every case before rep r+1 of any): load changes hit all cases
// alike, and the median of each case is reported.
void time_round_robin(std::vector<Row>& rows, int reps, std::size_t threads) {
  for (Row& r : rows) r.run();
  std::vector<std::vector<double>> t(rows.size()), c(rows.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const double c0 = process_cpu_s();
      ferry::Timer timer;
      rows[i].run();
      t[i].push_back(timer.elapsed_s());
      c[i].push_back((process_cpu_s() - c0) / static_cast<double>(threads));
    }
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::sort(t[i].begin(), t[i].end());
    std::sort(c[i].begin(), c[i].end());
    rows[i].seconds = t[i][t[i].size() / 2];
    rows[i].cpu_seconds = c[i][c[i].size() / 2];
  }
}

// Bytes one update moves per parameter: gradient (f32) read; master / weights and states read
// and written.
double update_bytes(const OptimMode& m) {
  const double master = m.master == MasterWeights::kF32         ? 4.0
                        : m.master == MasterWeights::kBf16Kahan ? 4.0
                                                                : 2.0;
  const double states = m.states == OptimizerStates::kF32 ? 8.0 : 2.0 + 8.0 / 2048.0;
  return 4.0 + 2.0 * (master + states);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = std::int64_t{1} << 24;
  int reps = 7;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: optimizer_bench [--n PARAMS] [--reps R] [--json PATH]\n");
      return 2;
    }
  }
  if (n < 2048 || reps < 1) {
    std::fprintf(stderr, "optimizer_bench: --n must be >= 2048 and --reps >= 1\n");
    return 2;
  }
  ThreadPool& pool = ThreadPool::global();
  const kc::Isa isa = kc::best_isa();
  const auto un = static_cast<std::size_t>(n);

  ferry::train::Rng rng(1);
  std::vector<float> grad(un), p32(un), m32(un, 0.0f), v32(un, 0.0f);
  for (std::size_t i = 0; i < un; ++i) {
    grad[i] = static_cast<float>(rng.normal() * 1e-2);
    p32[i] = static_cast<float>(rng.normal() * 2e-2);
  }
  std::vector<Row> rows;

  // Stream copy and triad over 4 * n floats (the fp32 states' working set), split like the
  // kernels split their work.
  std::vector<float> src(4 * un, 1.0f), dst(4 * un, 0.0f), tc(4 * un, 2.0f);
  rows.push_back({"stream copy (memcpy)", 2.0 * 4.0 * 4.0, [&] {
                    pool.parallel_for(
                        src.size(),
                        [&](std::size_t b, std::size_t e) {
                          std::memcpy(dst.data() + b, src.data() + b, (e - b) * sizeof(float));
                        },
                        1 << 16);
                  }});
  rows.push_back({"stream triad a=b+s*c", 3.0 * 4.0 * 4.0, [&] {
                    pool.parallel_for(
                        src.size(),
                        [&](std::size_t b, std::size_t e) {
                          for (std::size_t i = b; i < e; ++i) dst[i] = src[i] + 3.0f * tc[i];
                        },
                        1 << 16);
                  }});

  // fp32 AdamW through the CPU backend (the production fp32 path).
  auto& be = ferry::kernels::cpu_backend();
  ferry::kernels::AdamWArgs adamw_args;
  {
    auto view = [&](float* p) {
      return ferry::TensorView::contiguous(p, ferry::DType::kF32, ferry::Device::kCpu, {n});
    };
    adamw_args = {.param = view(p32.data()),
                  .m = view(m32.data()),
                  .v = view(v32.data()),
                  .param_bf16 = {},
                  .grad = view(grad.data()),
                  .lr = 1e-4f,
                  .beta1 = 0.9f,
                  .beta2 = 0.95f,
                  .eps = 1e-8f,
                  .weight_decay = 0.1f,
                  .grad_scale = 1.0f,
                  .step = 10};
  }
  rows.push_back({"adamw fp32 master + fp32 states (backend)", update_bytes({}),
                  [&] { FERRY_CHECK_OK(be.adamw(adamw_args, ferry::mem::Stream::host())); }});

  // Hybrid modes through hybrid_update_param (the trainer's path).
  const kc::AdamWConstants k = kc::make_adamw_constants(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10);
  // Each mode owns its buffers (kept alive in `cases`); f32 states and the f32 master are
  // separate copies per mode so no two cases share written memory.
  struct Case {
    OptimMode mode;
    ferry::train::ParamOptimState ps;
    std::vector<float> master, m, v;
    ferry::train::ParamBuffers b;
    std::int64_t step = 0;
  };
  std::vector<std::unique_ptr<Case>> cases;
  for (MasterWeights mw :
       {MasterWeights::kF32, MasterWeights::kBf16Kahan, MasterWeights::kBf16Sr}) {
    for (OptimizerStates st : {OptimizerStates::kF32, OptimizerStates::k8Bit}) {
      const OptimMode mode{mw, st};
      if (mode == OptimMode{}) continue;
      auto c = std::make_unique<Case>();
      c->mode = mode;
      ferry::train::ParamOptimState& ps = c->ps;
      if (mw != MasterWeights::kF32) {
        ps.w16.resize(un);
        for (std::size_t i = 0; i < un; ++i) ps.w16[i] = ferry::f32_to_bf16(p32[i]);
        if (mw == MasterWeights::kBf16Kahan) ps.comp16.assign(un, 0);
      }
      if (st == OptimizerStates::k8Bit) {
        const std::size_t blocks = (un + 2047) / 2048;
        ps.m8.assign(un, 0);
        ps.v8.assign(un, 0);
        ps.m_absmax.assign(blocks, 0.0f);
        ps.v_absmax.assign(blocks, 0.0f);
      }
      ferry::train::ParamBuffers& b = c->b;
      b.n = n;
      b.grad = grad.data();
      if (mw == MasterWeights::kF32) {
        c->master = p32;
        b.master = c->master.data();
      }
      if (st == OptimizerStates::kF32) {
        c->m.assign(un, 0.0f);
        c->v.assign(un, 0.0f);
        b.m32 = c->m.data();
        b.v32 = c->v.data();
      }
      Case* cp = c.get();
      rows.push_back({"hybrid " + ferry::train::describe(mode), update_bytes(mode), [cp, isa, k] {
                        ferry::train::hybrid_update_param(isa, k, cp->mode, cp->ps, cp->b,
                                                          kc::sr_key(1, ++cp->step, 0));
                      }});
      cases.push_back(std::move(c));
    }
  }

  time_round_robin(rows, reps, pool.size() + 1);
  const double copy_gbps = rows[0].bytes_per_param * double(n) / rows[0].seconds / 1e9;
  const double fp32_pps = double(n) / rows[2].seconds;
  std::printf(
      "optimizer_bench: %lld params, median of %d (round-robin), %zu threads, isa %s, cpu \"%s\"\n",
      static_cast<long long>(n), reps, pool.size() + 1, std::string(kc::to_string(isa)).c_str(),
      ferry::cpu_model_name().c_str());
  std::printf("%-48s %8s %9s %8s %8s %8s | %8s %8s %8s\n", "what", "ms", "Mparam/s", "GB/s",
              "vs copy", "vs fp32", "cpu ms", "cpu GB/s", "vs copy");
  const double copy_cpu_gbps = rows[0].bytes_per_param * double(n) / rows[0].cpu_seconds / 1e9;
  ferry::Json out_rows = ferry::Json::array();
  for (const Row& r : rows) {
    const double gbps = r.bytes_per_param * double(n) / r.seconds / 1e9;
    const double pps = double(n) / r.seconds;
    const double cpu_gbps = r.bytes_per_param * double(n) / r.cpu_seconds / 1e9;
    std::printf("%-48s %8.2f %9.1f %8.2f %7.0f%% %7.2fx | %8.2f %8.2f %7.0f%%\n", r.name.c_str(),
                r.seconds * 1e3, pps / 1e6, gbps, 100.0 * gbps / copy_gbps, pps / fp32_pps,
                r.cpu_seconds * 1e3, cpu_gbps, 100.0 * cpu_gbps / copy_cpu_gbps);
    out_rows.push_back({{"name", r.name},
                        {"ms", r.seconds * 1e3},
                        {"params_per_s", pps},
                        {"bytes_per_param", r.bytes_per_param},
                        {"gb_per_s", gbps},
                        {"fraction_of_copy", gbps / copy_gbps},
                        {"params_per_s_vs_fp32_adamw", pps / fp32_pps},
                        {"cpu_ms_per_thread", r.cpu_seconds * 1e3},
                        {"cpu_gb_per_s", cpu_gbps},
                        {"cpu_fraction_of_copy", cpu_gbps / copy_cpu_gbps}});
  }
  if (!json_path.empty()) {
    const ferry::Json j = {{"bench", "optimizer_bench"},
                           {"params", n},
                           {"reps", reps},
                           {"threads", pool.size() + 1},
                           {"isa", std::string(kc::to_string(isa))},
                           {"cpu", ferry::cpu_model_name()},
                           {"copy_gb_per_s", copy_gbps},
                           {"rows", out_rows}};
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "optimizer_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
