// SPDX-License-Identifier: Apache-2.0
// The CPU expert FFN for throughput (cpu-experts' default on the CUDA engine; docs/serve.md
// "The fast CPU expert path"). expert_ffn.h's expert_ffn_row is its slow twin and stays the
// bit-identity path of the CPU engine. Same function per routed row i = t*K + k,
//   out[i] = down[C, F] · (silu(gate[F, C] · x[t]) * (up[F, C] · x[t])),
// computed for all rows of a layer step at once:
//   1. the rows are grouped by expert (first-appearance order; routing order inside an expert);
//   2. gate/up phase: the step's (expert, f) pairs, D·F of them for D distinct experts, are split
//      into contiguous chunks across the thread pool; a thread loads gate row f and up row f once
//      and computes them against every token routed to that expert, a few tokens per pass
//      (AVX-512: 4, AVX2: 2, scalar: 1), into h [rows, F] (silu(g) * u);
//   3. down phase: the (expert, c) pairs, D·C of them, split the same way; down row c against the
//      expert's h rows gives out[i][c].
// So every core streams distinct weight rows (decode's 8 experts x 3 matrices are read once per
// step, by all cores), and a weight row is read from DRAM once however many tokens share it.
// Dot products: AVX-512 (16 lanes, 2 accumulators over 32-element blocks, bf16 widened by a
// 16-bit shift, FMA) / AVX2 (8 lanes, same shape) / scalar (dot_fixed, expert_ffn.h), picked at
// run time by kernels/cpu/cpu_isa.h (CPUID; FERRY_CPU_ISA lowers it); the tail past the vector
// body is added in order after the lanes' sum. Each weight stream is prefetched into L2 8 KiB
// ahead (expert_ffn_fast.cpp: the page-sized rows stop the hardware prefetchers).
// Measured: bench/serve/cpu_expert_ffn_bench.cpp, docs/serve.md "The fast CPU expert path".
// Determinism: each output element is one dot product whose order depends only on the ISA and
// C / F — not on the thread count, the chunking, which tokens share a pass, the other rows of the
// step or the pointers' alignment — so the result is bitwise independent of the thread count
// (tested). The scalar ISA is expert_ffn_row's arithmetic exactly (same dot_fixed, same silu).
// Against expert_ffn_row it differs only by summation order: tested against an f64 reference
// with style.md's rule (error <= 2x a naive f32 loop's) in
// tests/unit/serve/expert_ffn_fast_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "serve/expert_ffn.h"

namespace ferry {
class ThreadPool;
}

namespace ferry::serve {

// One layer step's routed rows, as the executor holds them.
struct ExpertFfnStep {
  const ExpertRef* ref_of_expert = nullptr;  // [E] weights by expert id (only routed ids read)
  const std::int32_t* ids = nullptr;         // [T*K] the expert of row i = t*K + k, in [0, E)
  const std::int32_t* rows = nullptr;        // [n] rows to compute: distinct, in [0, T*K)
  std::int64_t n = 0;
  const float* x = nullptr;  // [T, C] token t's input at x + t*C
  float* out = nullptr;      // [T*K, C] row i written at out + i*C (other rows untouched)
  int K = 0;                 // routed experts per token
  int E = 0;                 // experts of the layer
  std::int64_t C = 0;        // hidden size
  std::int64_t F = 0;        // expert width
};

// The grouped, threaded, SIMD expert FFN with its scratch (h [rows, F], the grouping). Not
// thread-safe (one per executor); run() uses `pool` inside.
class ExpertFfnGrouped {
 public:
  // isa: the SIMD body; lowered to what this CPU supports (kernels::cpu::isa_supported).
  explicit ExpertFfnGrouped(kernels::cpu::Isa isa = kernels::cpu::best_isa());

  // Sizes the scratch for steps of up to max_rows rows, width F, E experts (startup); run() grows
  // it when a step needs more (the CPU engine, whose step size the executor does not know).
  void reserve(std::int64_t max_rows, std::int64_t F, int E);
  // Every ref_of_expert[ids[rows[j]]] must be kF32 or kBF16 (a bug otherwise).
  void run(const ExpertFfnStep& s, ThreadPool& pool);

  kernels::cpu::Isa isa() const { return isa_; }

 private:
  kernels::cpu::Isa isa_;
  std::vector<float> h_;               // [n, F] silu(g) * u, rows in grouped order
  std::vector<std::int32_t> order_;    // [n] rows grouped by expert
  std::vector<std::int64_t> begin_;    // [D + 1] each distinct expert's range of order_
  std::vector<std::int32_t> experts_;  // [D] distinct experts, first appearance
  std::vector<std::int32_t> slot_of_;  // [E] expert -> index in experts_ (-1: not routed)
  std::vector<std::int64_t> fill_;     // [D] scatter cursor
  // [n] per grouped row: its token's x, its h row, its output row.
  std::vector<const float*> x_of_;
  std::vector<float*> h_of_;
  std::vector<float*> out_of_;
};

}  // namespace ferry::serve
