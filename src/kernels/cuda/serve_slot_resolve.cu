// SPDX-License-Identifier: Apache-2.0
// Device-side slot resolution (serve/device_resolver.h; the spec is the CPU twin
// serve::resolve_slots_twin in serve/slot_resolve.cpp, which must make the same decisions):
//   resolve_slots_warp_kernel  (kDecode, the default) one warp per layer call, the same
//                         decisions: the ids are read 32 at a time (a lane each), first
//                         appearances found with __match_any_sync against the smem `seen`
//                         array and numbered with a ballot, the hits' slot lookups done by
//                         lanes in parallel, and each miss's victim a warp-wide min of the same
//                         packed keys (shuffles, no block barriers). A decode layer call is ~8
//                         ids and ~2 misses over ~50 slots: the block kernel's time was its
//                         dependent global loads on thread 0 and its barriers, ~8-10 us.
//   resolve_slots_kernel  (kBaseline, FERRY_RESOLVE_WARP=0) one block per layer call. Thread 0
//                         walks what is sequential (tick,
//                         distinct experts in first-appearance order, hits, the log); each miss's
//                         slot is a block-wide min over packed keys — an empty slot under the
//                         cap is (0, slot), an evictable one (neither hot nor in use) is
//                         (1, stamp, slot), others never win — so the lowest empty slot comes
//                         first, then the least recently stamped, ties to the lowest slot: the
//                         host pager's LRU rule. Under LFU (state[2]) a min over each slot's
//                         rank (empty 0, evictable 2^32 + uses) comes first and the same key
//                         decides among the slots of the smallest rank; under LFRU the rank of
//                         an evictable slot is 1 + the bits of its score now (a non-negative
//                         double's bits order as the double). Misses are applied one at a time
//                         in order, since each changes what the next one may evict.
//   copy_misses_kernel    the logged misses' blocks from the host store (pinned, read through
//                         its mapped address: PCIe reads by the SMs, no copy engine and no host
//                         call) into their slots; words of 16, 4 or 1 bytes by alignment.
//   link_pace_wait_misses_kernel  link pacing of those bytes: spins until mark +
//                         ceil(misses * expert_bytes / gbps) ns (serve_link_pace.cu's wait with
//                         the byte count read from the log, since the host does not know it).
// Tests: tests/gpu/serve_device_resolve_gpu_test.cpp (kernel == twin on random sequences).
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/link_pace.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kResolveThreads = 256;

__device__ __forceinline__ unsigned long long block_min(unsigned long long v,
                                                        unsigned long long* scratch) {
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o < v ? o : v;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? scratch[lane] : ~0ull;
    for (int off = 16; off > 0; off >>= 1) {
      const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, off);
      v = o < v ? o : v;
    }
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  const unsigned long long r = scratch[32];
  __syncthreads();  // scratch is reused by the next call
  return r;
}

// The layer's state block and the call's log as typed pointers (SlotStateLayout).
struct ResolveView {
  std::int32_t *slot_of, *expert_in, *flags, *ids_out, *miss_expert, *miss_slot, *evicted;
  std::uint32_t *stamp, *uses, *score_at;
  double* score;
  const double* decay;
  int rule, h;
  __device__ explicit ResolveView(const SlotResolveArgs& a)
      : slot_of(a.state + 4),
        expert_in(slot_of + a.E),
        flags(expert_in + 2 * a.max_cap),
        ids_out(a.log + 5),
        miss_expert(ids_out + a.E),
        miss_slot(ids_out + 2 * a.E),
        evicted(ids_out + 3 * a.E),
        stamp(reinterpret_cast<std::uint32_t*>(expert_in + a.max_cap)),
        uses(reinterpret_cast<std::uint32_t*>(expert_in + 3 * a.max_cap)),
        score_at(reinterpret_cast<std::uint32_t*>(expert_in + 4 * a.max_cap)),
        score(reinterpret_cast<double*>(a.state + SlotStateLayout::score_offset(a.E, a.max_cap))),
        decay(a.lfru_decay),
        rule(a.state[2]),
        h(a.state[3]) {}
  __device__ bool ranked() const { return rule != kSlotRuleLru; }
};

// LFRU's decay over `age` ticks: serve::lfru_decay's exact arithmetic (a table value scaled by a
// power of two; ldexp is exact, the cap keeps the exponent an int and the result is 0 anyway).
__device__ __forceinline__ double lfru_decay(const ResolveView& v, std::uint32_t age) {
  std::uint32_t q = age / std::uint32_t(v.h);
  q = q < 2000u ? q : 2000u;
  return ldexp(v.decay[age % std::uint32_t(v.h)], -static_cast<int>(q));
}

// A hit's bookkeeping beyond the stamp: LFU's use and LFRU's score (EvictionRanker::on_hit: one
// fma, no contraction question).
__device__ __forceinline__ void count_hit(const ResolveView& v, int s, std::uint32_t tick) {
  ++v.uses[s];
  if (v.rule == kSlotRuleLfru) {
    v.score[s] = __fma_rn(v.score[s], lfru_decay(v, tick - v.score_at[s]), 1.0);
    v.score_at[s] = tick;
  }
}

// Slot s's key as a miss's victim (the smallest wins): an empty slot (0, s), an evictable one
// (neither hot nor in use) (1, stamp, s), any other never. LRU's whole rule; LFU's among the
// slots of the smallest rule_rank.
__device__ __forceinline__ unsigned long long victim_key(const ResolveView& v, int s) {
  if (v.expert_in[s] < 0) return static_cast<unsigned long long>(s);
  if ((v.flags[s] & (kSlotHot | kSlotInUse)) != 0) return ~0ull;
  return (1ull << 62) | (static_cast<unsigned long long>(v.stamp[s]) << 20) |
         static_cast<unsigned long long>(s);
}

// LFU's and LFRU's first rank of slot s (the smallest wins; (uses, stamp, slot) and (score,
// stamp, slot) do not fit one 64-bit key): an empty slot 0, an evictable one 2^32 + uses (LFU)
// or 1 + the bits of score * decay (LFRU: the score now, >= 0, whose bits order as it does), any
// other never. The victim is then the smallest victim_key among the slots of the smallest rank.
__device__ __forceinline__ unsigned long long rule_rank(const ResolveView& v, int s,
                                                        std::uint32_t tick) {
  if (v.expert_in[s] < 0) return 0ull;
  if ((v.flags[s] & (kSlotHot | kSlotInUse)) != 0) return ~0ull;
  if (v.rule == kSlotRuleLfru) {
    const double now = __dmul_rn(v.score[s], lfru_decay(v, tick - v.score_at[s]));
    return 1ull + static_cast<unsigned long long>(__double_as_longlong(now));
  }
  return (1ull << 32) + static_cast<unsigned long long>(v.uses[s]);
}

__device__ __forceinline__ unsigned long long warp_min(unsigned long long v) {
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o < v ? o : v;
  }
  return v;
}

// Miss number j of this call puts expert e into `victim`: the slot's old expert (if any) loses
// its slot and table entries, e gets both, the slot is stamped and in use, and the log records
// the miss. One thread. Returns 1 when an expert was evicted.
__device__ __forceinline__ int take_slot(const SlotResolveArgs& a, const ResolveView& v, int victim,
                                         std::int32_t e, std::uint32_t tick, std::int32_t j) {
  const int E = a.E;
  const std::int32_t old = v.expert_in[victim];
  if (old >= 0) {
    v.slot_of[old] = -1;
    a.table[old] = nullptr;
    a.table[E + old] = nullptr;
    a.table[2 * E + old] = nullptr;
  }
  v.expert_in[victim] = e;
  v.slot_of[e] = victim;
  v.stamp[victim] = tick;
  v.uses[victim] = 1u;
  v.score_at[victim] = tick;
  v.score[victim] = 1.0;
  v.flags[victim] |= kSlotInUse;
  unsigned char* block = a.slot_base + std::int64_t(victim) * a.expert_bytes;
  a.table[e] = block;
  a.table[E + e] = block + a.up_offset;
  a.table[2 * E + e] = block + a.down_offset;
  v.miss_expert[j] = e;
  v.miss_slot[j] = victim;
  v.evicted[j] = old;
  return old >= 0 ? 1 : 0;
}

__global__ void resolve_slots_kernel(SlotResolveArgs a) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ std::int32_t smem[];  // distinct [E] then seen [E]
  __shared__ unsigned long long scratch[33];
  __shared__ std::int32_t s_nd, s_hits, s_errors;
  std::int32_t* distinct = smem;
  std::int32_t* seen = smem + a.E;
  const int E = a.E, M = a.max_cap;
  const ResolveView v(a);
  std::int32_t* slot_of = v.slot_of;
  std::uint32_t* stamp = v.stamp;
  std::int32_t* flags = v.flags;
  std::int32_t* ids_out = v.ids_out;
  std::int32_t* evicted = v.evicted;
  const int cap = a.state[0];
  // The previous call's working set back to resident; scratch cleared.
  for (int s = threadIdx.x; s < M; s += blockDim.x) flags[s] &= ~kSlotInUse;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    seen[e] = 0;
    evicted[e] = -1;
  }
  __syncthreads();
  const std::uint32_t tick = reinterpret_cast<std::uint32_t*>(a.state)[1] + 1u;
  __syncthreads();
  if (threadIdx.x == 0) {
    reinterpret_cast<std::uint32_t*>(a.state)[1] = tick;
    std::int32_t nd = 0, errors = 0, hits = 0;
    for (std::int64_t i = 0; i < a.n; ++i) {
      const std::int32_t e = a.ids[i];
      if (i < E) ids_out[i] = e;
      if (e < 0 || e >= E || i >= E) {
        ++errors;
        continue;
      }
      if (seen[e]) continue;
      seen[e] = 1;
      distinct[nd++] = e;
    }
    for (std::int32_t d = 0; d < nd; ++d) {  // hits first: in use, so no miss evicts them
      const std::int32_t s = slot_of[distinct[d]];
      if (s < 0) continue;
      flags[s] |= kSlotInUse;
      stamp[s] = tick;
      count_hit(v, s, tick);
      ++hits;
    }
    s_nd = nd;
    s_hits = hits;
    s_errors = errors;
  }
  __syncthreads();
  const std::int32_t nd = s_nd;
  std::int32_t misses = 0, evictions = 0;  // thread 0's are the ones logged
  for (std::int32_t d = 0; d < nd; ++d) {
    const std::int32_t e = distinct[d];
    if (slot_of[e] >= 0) continue;   // a hit (uniform: read after the last barrier)
    unsigned long long rank = 0ull;  // LRU: every candidate ranks the same
    if (v.ranked()) {                // uniform
      rank = ~0ull;
      for (int s = threadIdx.x; s < cap; s += blockDim.x) {
        const unsigned long long r = rule_rank(v, s, tick);
        rank = r < rank ? r : rank;
      }
      rank = block_min(rank, scratch);
    }
    unsigned long long key = ~0ull;
    for (int s = threadIdx.x; s < cap; s += blockDim.x) {
      if (v.ranked() && rule_rank(v, s, tick) != rank) continue;
      const unsigned long long k = victim_key(v, s);
      key = k < key ? k : key;
    }
    key = block_min(key, scratch);
    if (threadIdx.x == 0) {
      if (key == ~0ull) {
        ++s_errors;  // more non-hot experts than slots: the caller's bug
      } else {
        evictions += take_slot(a, v, static_cast<int>(key & 0xfffffull), e, tick, misses);
        ++misses;
      }
    }
    __syncthreads();  // the next miss sees this one's slot
  }
  if (threadIdx.x == 0) {
    a.log[0] = s_hits;
    a.log[1] = misses;
    a.log[2] = evictions;
    a.log[3] = s_errors;
    a.log[4] = static_cast<std::int32_t>(a.n);
  }
}

// The warp twin of resolve_slots_kernel (same state, table and log; see the file comment).
__global__ void __launch_bounds__(32) resolve_slots_warp_kernel(SlotResolveArgs a) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ std::int32_t smem[];  // distinct [E] then seen [E]
  std::int32_t* distinct = smem;
  std::int32_t* seen = smem + a.E;
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned below = (1u << lane) - 1u;  // lanes before this one
  const int E = a.E, M = a.max_cap;
  const ResolveView v(a);
  std::int32_t* slot_of = v.slot_of;
  std::uint32_t* stamp = v.stamp;
  std::int32_t* flags = v.flags;
  std::int32_t* ids_out = v.ids_out;
  std::int32_t* evicted = v.evicted;
  const int cap = a.state[0];
  const std::uint32_t tick = reinterpret_cast<std::uint32_t*>(a.state)[1] + 1u;
  // The previous call's working set back to resident; scratch cleared.
  for (int s = lane; s < M; s += 32) flags[s] &= ~kSlotInUse;
  for (int e = lane; e < E; e += 32) {
    seen[e] = 0;
    evicted[e] = -1;
  }
  __syncwarp();
  if (lane == 0) reinterpret_cast<std::uint32_t*>(a.state)[1] = tick;
  // Distinct experts in first-appearance order, 32 ids at a time.
  std::int32_t nd = 0, errors = 0;
  for (std::int64_t base = 0; base < a.n; base += 32) {
    const std::int64_t i = base + lane;
    const bool in = i < a.n;
    const std::int32_t e = in ? a.ids[i] : -1;
    if (in && i < E) ids_out[i] = e;
    const bool valid = in && e >= 0 && e < E && i < E;
    errors += __popc(__ballot_sync(0xffffffffu, in && !valid));
    // Lanes holding the same valid id; an invalid lane's key matches no other lane.
    const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1 - lane);
    const bool first = valid && (same & below) == 0u && seen[e] == 0;
    const unsigned news = __ballot_sync(0xffffffffu, first);
    if (first) {
      distinct[nd + __popc(news & below)] = e;
      seen[e] = 1;
    }
    nd += __popc(news);
    __syncwarp();
  }
  // Hits first (in use, so no miss evicts them); the misses' positions in `seen` (reused as the
  // miss list: every expert's seen flag is no longer needed).
  std::int32_t hits = 0, nm = 0;
  for (std::int32_t base = 0; base < nd; base += 32) {
    const std::int32_t d = base + lane;
    const std::int32_t e = d < nd ? distinct[d] : -1;
    const std::int32_t s = e >= 0 ? slot_of[e] : -1;
    if (s >= 0) {
      flags[s] |= kSlotInUse;
      stamp[s] = tick;
      count_hit(v, s, tick);
    }
    hits += __popc(__ballot_sync(0xffffffffu, s >= 0));
    const bool miss = e >= 0 && s < 0;
    const unsigned ms = __ballot_sync(0xffffffffu, miss);
    __syncwarp();
    if (miss) seen[nm + __popc(ms & below)] = e;
    nm += __popc(ms);
  }
  __syncwarp();
  // Misses in first-appearance order, one at a time: each changes what the next may evict.
  std::int32_t misses = 0, evictions = 0;
  for (std::int32_t j = 0; j < nm; ++j) {
    const std::int32_t e = seen[j];
    unsigned long long rank = 0ull;  // LRU: every candidate ranks the same
    if (v.ranked()) {
      rank = ~0ull;
      for (int s = lane; s < cap; s += 32) {
        const unsigned long long r = rule_rank(v, s, tick);
        rank = r < rank ? r : rank;
      }
      rank = warp_min(rank);
    }
    unsigned long long key = ~0ull;
    for (int s = lane; s < cap; s += 32) {
      if (v.ranked() && rule_rank(v, s, tick) != rank) continue;
      const unsigned long long k = victim_key(v, s);
      key = k < key ? k : key;
    }
    key = warp_min(key);
    if (key == ~0ull) {
      ++errors;  // more non-hot experts than slots: the caller's bug
    } else {
      if (lane == 0) {
        evictions += take_slot(a, v, static_cast<int>(key & 0xfffffull), e, tick, misses);
      }
      ++misses;
    }
    __syncwarp();  // the next miss sees this one's slot
  }
  if (lane == 0) {
    a.log[0] = hits;
    a.log[1] = misses;
    a.log[2] = evictions;
    a.log[3] = errors;
    a.log[4] = static_cast<std::int32_t>(a.n);
  }
}

bool warp_env_on() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_RESOLVE_WARP");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Miss by miss (uniform loop), each block's words strided over the grid with 4 loads in flight
// per thread: PCIe reads are latency-bound (serve_link_pace.cu's copy_from_host, measured).
template <typename Word>
__global__ void copy_misses_kernel(MissCopyArgs a) {
  pdl_wait();
  pdl_trigger();
  const std::int32_t misses = a.log[1];
  const std::int32_t* miss_expert = a.log + 5 + a.E;
  const std::int32_t* miss_slot = a.log + 5 + 2 * a.E;
  const std::int64_t n = a.expert_bytes / std::int64_t(sizeof(Word));
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int32_t j = 0; j < misses; ++j) {
    const auto* __restrict__ src =
        reinterpret_cast<const Word*>(a.src_base + std::int64_t(miss_expert[j]) * a.expert_bytes);
    auto* __restrict__ dst =
        reinterpret_cast<Word*>(a.slot_base + std::int64_t(miss_slot[j]) * a.expert_bytes);
    std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const Word w0 = src[i], w1 = src[i + stride], w2 = src[i + 2 * stride],
                 w3 = src[i + 3 * stride];
      dst[i] = w0;
      dst[i + stride] = w1;
      dst[i + 2 * stride] = w2;
      dst[i + 3 * stride] = w3;
    }
    for (; i < n; i += stride) dst[i] = src[i];
  }
}

// No pdl_trigger, as serve_link_pace.cu's link_pace_wait_kernel.
__global__ void link_pace_wait_misses_kernel(unsigned long long* mark, const std::int32_t* log,
                                             unsigned long long expert_bytes, double gbps) {
  pdl_wait();
  const double bytes = double(log[1]) * double(expert_bytes);
  const unsigned long long ns = static_cast<unsigned long long>(ceil(bytes / gbps));
  pace_wait(mark, ns);
}

}  // namespace

cudaError_t launch_resolve_slots(const SlotResolveArgs& a, KernelVariant variant,
                                 cudaStream_t stream) {
  const std::size_t shared = 2 * std::size_t(a.E) * sizeof(std::int32_t);
  const bool warp =
      variant == KernelVariant::kDecode || (variant == KernelVariant::kDefault && warp_env_on());
  if (warp) {
    launch_pdl(resolve_slots_warp_kernel, 1, 32, shared, stream, a);
  } else {
    launch_pdl(resolve_slots_kernel, 1, kResolveThreads, shared, stream, a);
  }
  return cudaGetLastError();
}

cudaError_t launch_copy_misses(const MissCopyArgs& a, cudaStream_t stream) {
  const auto aligned = [&](std::uintptr_t n) {
    return a.expert_bytes % std::int64_t(n) == 0 &&
           reinterpret_cast<std::uintptr_t>(a.slot_base) % n == 0 &&
           reinterpret_cast<std::uintptr_t>(a.src_base) % n == 0;
  };
  if (aligned(16)) {
    launch_pdl(copy_misses_kernel<uint4>, a.blocks, 256, 0, stream, a);
  } else if (aligned(4)) {
    launch_pdl(copy_misses_kernel<std::uint32_t>, a.blocks, 256, 0, stream, a);
  } else {
    launch_pdl(copy_misses_kernel<unsigned char>, a.blocks, 256, 0, stream, a);
  }
  return cudaGetLastError();
}

cudaError_t launch_link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                                         unsigned long long expert_bytes, double gbps,
                                         cudaStream_t stream) {
  launch_pdl(link_pace_wait_misses_kernel, 1, 1, 0, stream, d_mark, d_log, expert_bytes, gbps);
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
