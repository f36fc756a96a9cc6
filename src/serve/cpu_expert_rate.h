// SPDX-License-Identifier: Apache-2.0
// This machine's rate for a miss computed on the CPU, measured (the paged miss cost model's CPU
// side: PagerConfig::measure_cpu_gflops, `--cpu-gflops auto`; docs/serve.md "Miss placement").
//
// What is timed: the host path's own kernel (ExpertFfnGrouped for kFast, expert_ffn_row for
// kExact) computing ONE row (one token) of ONE expert per call — a decode miss — over distinct
// experts of the host store, walked across layers (layer-major, expert 0 of every MoE layer, then
// expert 1, ...) until target_bytes of expert weights are covered or every expert is taken, so a
// big store is read from DRAM (512 MiB by default is beyond any last-level cache) and not from
// cache. A small store (the test fixtures) is cycled until at least min_calls calls; it is then
// cache-resident, as it is when the engine runs it. Best of `passes` passes.
//
// Why one row: with one token per expert the kernel reads the expert's 3*C*F weights once and
// does 6*C*F flops on them, so it is memory-bound and its time is bytes read / host memory rate
// (plus the call's dispatch). The cost model's rule stays `rows * 6*C*F / cpu_gflops` (serve_config
// .h): fed `gflops` below (= 6*C*F / the measured seconds per expert), it prices a one-row miss
// at exactly its measured time, i.e. expert bytes / the measured host rate against expert bytes
// / link rate; for r rows it charges r times that, an upper bound for the grouped kernel (which
// reads the weights once for all r rows), so a miss with several rows leans towards the copy,
// never towards a CPU time it cannot reach. Both figures are reported: gflops (what the rule
// uses) and expert_gbps (the same timing as bytes of expert weights read per second).
#pragma once

#include <cstddef>

#include "core/result.h"
#include "serve/serve_config.h"

namespace ferry {
class ThreadPool;
}

namespace ferry::serve {

class ExpertStore;

struct CpuExpertRate {
  double gflops = 0;              // 6*C*F / seconds_per_expert / 1e9 (the cost model's rate)
  double expert_gbps = 0;         // expert_bytes / seconds_per_expert / 1e9
  double seconds_per_expert = 0;  // best pass's time / calls per pass
  int experts = 0;                // distinct experts timed
  int calls = 0;                  // kernel calls per pass (experts, cycled up to min_calls)
  int passes = 0;
  std::size_t bytes_per_pass = 0;                   // expert weight bytes read per pass
  CpuExpertKernel kernel = CpuExpertKernel::kFast;  // kFast or kExact
};

// kernel must be kFast or kExact; target_bytes > 0, min_calls >= 1, passes >= 1
// (invalid_argument otherwise, also for a store without MoE layers). `pool` runs kFast's
// threads (ThreadPool::global() in the engine); kExact is one thread per row, as the engine
// runs a single row.
Result<CpuExpertRate> measure_cpu_expert_rate(const ExpertStore& store, CpuExpertKernel kernel,
                                              ThreadPool& pool,
                                              std::size_t target_bytes = 512ull << 20,
                                              int min_calls = 64, int passes = 3);

}  // namespace ferry::serve
