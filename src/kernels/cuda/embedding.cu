// SPDX-License-Identifier: Apache-2.0
// Embedding lookup and its backward. Forward: one warp per token copies its row in 16-byte
// vectors, four in flight per lane, where the row's bytes are a multiple of 16 and both bases are
// 16-byte aligned (every bf16 width divisible by 8, f32 by 4); otherwise one block per token copies
// element by element (FERRY_EMBEDDING_FWD=element forces that kernel for A/B runs). Both are
// copies: the same bits. An id outside [0, V) writes zeros; ids are device data and the host
// cannot check them without a sync.
// Backward: one thread per column walks the tokens in order, for f32 and bf16 d_table alike:
// bitwise deterministic (atomics would add repeated ids in a different order each run; the stream
// trainer's policies and exact resume need the same bits) and no bf16 atomics rounding twice.
// That kernel has only C threads (3 584 at the 7B width: 28 CTAs on a 132-SM GPU), each a chain of
// T dependent read-modify-writes. The default backward splits the vocabulary into kVocabSlices
// residue classes (id % kVocabSlices) as well: thread (column, slice) walks all tokens in order
// (their ids staged in shared memory) and adds only the rows of its slice, so every d_table
// element still receives its tokens' d_out in token order from one thread, one rounding per add:
// the column kernel's bits exactly. Its cost is the walk itself: every thread compares all T ids
// and each of its adds is a load -> add -> store chain on the previous one (0.42 ms at T 8192,
// C 2048 on an H100, 2.8x torch's atomic index_add_; docs/cuda.md).
// The compact backward (FERRY_EMBEDDING_BWD=compact, opt-in until it has run on a GPU) keeps the
// slices but lets the CTA pick its slice's tokens out of each staged chunk once (ballot + prefix,
// in token order) and walks that list kWalk entries at a time: when the kWalk ids are distinct,
// their rows are different elements, so the kWalk loads go out together before the adds and
// stores; a group with a repeated id is added one by one. Each element still gets its adds in
// token order from one thread: the column kernel's bits. Slices are sized by T (about
// kSliceTokens tokens each). FERRY_EMBEDDING_BWD=column keeps the column kernel, =sliced (or
// unset) the sliced one; read at every launch.
// Tested in tests/gpu/kernels_dense_test.cpp (every backward kernel against the column kernel bit
// for bit; the vector forward against the element kernel and the f64 reference).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(T* __restrict__ out, const T* __restrict__ table,
                                 const std::int32_t* __restrict__ ids, std::int64_t c,
                                 std::int64_t v) {
  const std::int64_t tok = blockIdx.x;
  const std::int32_t id = ids[tok];
  T* dst = out + tok * c;
  if (id < 0 || id >= v) {
    for (std::int64_t i = threadIdx.x; i < c; i += blockDim.x) dst[i] = from_f32<T>(0.0f);
    return;
  }
  const T* src = table + static_cast<std::int64_t>(id) * c;
  for (std::int64_t i = threadIdx.x; i < c; i += blockDim.x) dst[i] = src[i];
}

constexpr int kRowWarps = 8;  // tokens per CTA in the vector forward, one warp each

// One warp per token; the row is row_vecs 16-byte vectors (the launcher checks the sizes and
// alignment). Four loads per lane go out before their stores.
__global__ void __launch_bounds__(kRowWarps * 32)
    embedding_vec_kernel(uint4* __restrict__ out, const uint4* __restrict__ table,
                         const std::int32_t* __restrict__ ids, std::int64_t t,
                         std::int64_t row_vecs, std::int64_t v) {
  const std::int64_t tok = static_cast<std::int64_t>(blockIdx.x) * kRowWarps +
                           static_cast<std::int64_t>(threadIdx.x / 32);
  if (tok >= t) return;
  const auto lane = static_cast<std::int64_t>(threadIdx.x % 32);
  const std::int32_t id = ids[tok];
  uint4* dst = out + tok * row_vecs;
  if (id < 0 || id >= v) {  // zero bytes: the element kernel's from_f32(0.0f) for f32 and bf16
    for (std::int64_t i = lane; i < row_vecs; i += 32) dst[i] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const uint4* src = table + static_cast<std::int64_t>(id) * row_vecs;
  std::int64_t i = lane;
  for (; i + 96 < row_vecs; i += 128) {
    const uint4 a = src[i], b = src[i + 32], c = src[i + 64], d = src[i + 96];
    dst[i] = a;
    dst[i + 32] = b;
    dst[i + 64] = c;
    dst[i + 96] = d;
  }
  for (; i < row_vecs; i += 32) dst[i] = src[i];
}

// One thread per column; walks tokens 0..T-1 in order: deterministic.
template <typename TT, typename TD>
__global__ void embedding_backward_column_kernel(TT* __restrict__ d_table,
                                                 const TD* __restrict__ d_out,
                                                 const std::int32_t* __restrict__ ids,
                                                 std::int64_t t, std::int64_t c, std::int64_t v) {
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= c) return;
  for (std::int64_t tok = 0; tok < t; ++tok) {
    const std::int32_t id = ids[tok];
    if (id < 0 || id >= v) continue;
    TT* p = d_table + static_cast<std::int64_t>(id) * c + col;
    *p = from_f32<TT>(to_f32(*p) + to_f32(d_out[tok * c + col]));
  }
}

constexpr int kVocabSlices = 32;     // residue classes of the vocabulary, gridDim.y
constexpr int kIdChunk = 2048;       // ids staged in shared memory per round
constexpr int kSlicedThreads = 128;  // columns per CTA

// blockIdx.y = slice: the rows id with id % kVocabSlices == slice, columns of this CTA; tokens
// 0..t-1 in order, exactly the column kernel's sequence of adds for each element it owns.
template <typename TT, typename TD>
__global__ void __launch_bounds__(kSlicedThreads)
    embedding_backward_sliced_kernel(TT* __restrict__ d_table, const TD* __restrict__ d_out,
                                     const std::int32_t* __restrict__ ids, std::int64_t t,
                                     std::int64_t c, std::int64_t v) {
  __shared__ std::int32_t s_ids[kIdChunk];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto slice = static_cast<std::int32_t>(blockIdx.y);
  for (std::int64_t t0 = 0; t0 < t; t0 += kIdChunk) {
    const int n = static_cast<int>(t - t0 < kIdChunk ? t - t0 : kIdChunk);
    __syncthreads();  // the previous round's ids are read by every thread
    for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
      s_ids[i] = ids[t0 + i];
    __syncthreads();
    if (col >= c) continue;  // still takes part in the barriers
    for (int i = 0; i < n; ++i) {
      const std::int32_t id = s_ids[i];
      if (id < 0 || id >= v || id % kVocabSlices != slice) continue;
      TT* p = d_table + static_cast<std::int64_t>(id) * c + col;
      *p = from_f32<TT>(to_f32(*p) + to_f32(d_out[(t0 + i) * c + col]));
    }
  }
}

constexpr int kCompactThreads = 128;  // columns per CTA
constexpr int kCompactChunk = 2048;   // ids staged per round
constexpr int kWalk = 8;              // list entries whose loads go out together
constexpr int kSliceTokens = 128;     // tokens per slice the slice count aims at
constexpr int kMaxSlices = 256;

// blockIdx.y = slice (id % slices). Per staged chunk: the CTA compacts the chunk's tokens of its
// slice into (s_tok, s_id) in token order, then each thread adds them into its column.
template <typename TT, typename TD>
__global__ void __launch_bounds__(kCompactThreads)
    embedding_backward_compact_kernel(TT* __restrict__ d_table, const TD* __restrict__ d_out,
                                      const std::int32_t* __restrict__ ids, std::int64_t t,
                                      std::int64_t c, std::int64_t v, std::int32_t slices) {
  __shared__ std::int32_t s_tok[kCompactChunk];  // token index within the chunk
  __shared__ std::int32_t s_id[kCompactChunk];
  __shared__ int s_warp_count[kCompactThreads / 32];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto slice = static_cast<std::int32_t>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const unsigned lanes_below = (1u << lane) - 1u;
  for (std::int64_t t0 = 0; t0 < t; t0 += kCompactChunk) {
    const int n = static_cast<int>(t - t0 < kCompactChunk ? t - t0 : kCompactChunk);
    // Compaction, blockDim.x ids at a time: a token's place is the slice's tokens before it in
    // the chunk (earlier segments, earlier warps of this segment, lower lanes of its warp).
    int count = 0;  // the same in every thread
    for (int seg = 0; seg < n; seg += static_cast<int>(blockDim.x)) {
      const int i = seg + static_cast<int>(threadIdx.x);
      const std::int32_t id = i < n ? ids[t0 + i] : -1;
      const bool mine = i < n && id >= 0 && id < v && id % slices == slice;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) s_warp_count[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, total = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
        if (w < warp) before += s_warp_count[w];
        total += s_warp_count[w];
      }
      if (mine) {
        const int at = count + before + __popc(ballot & lanes_below);
        s_tok[at] = i;
        s_id[at] = id;
      }
      count += total;
      __syncthreads();  // s_warp_count is rewritten by the next segment; the list is complete
    }
    if (col < c) {
      int k = 0;
      for (; k + kWalk <= count; k += kWalk) {
        std::int32_t id[kWalk];
        bool distinct = true;
#pragma unroll
        for (int j = 0; j < kWalk; ++j) {
          id[j] = s_id[k + j];
#pragma unroll
          for (int q = 0; q < j; ++q) distinct = distinct && id[q] != id[j];
        }
        if (distinct) {
          float acc[kWalk], g[kWalk];
#pragma unroll
          for (int j = 0; j < kWalk; ++j) {
            acc[j] = to_f32(d_table[static_cast<std::int64_t>(id[j]) * c + col]);
            g[j] = to_f32(d_out[(t0 + s_tok[k + j]) * c + col]);
          }
#pragma unroll
          for (int j = 0; j < kWalk; ++j)
            d_table[static_cast<std::int64_t>(id[j]) * c + col] = from_f32<TT>(acc[j] + g[j]);
        } else {
          for (int j = 0; j < kWalk; ++j) {
            TT* p = d_table + static_cast<std::int64_t>(id[j]) * c + col;
            *p = from_f32<TT>(to_f32(*p) + to_f32(d_out[(t0 + s_tok[k + j]) * c + col]));
          }
        }
      }
      for (; k < count; ++k) {
        TT* p = d_table + static_cast<std::int64_t>(s_id[k]) * c + col;
        *p = from_f32<TT>(to_f32(*p) + to_f32(d_out[(t0 + s_tok[k]) * c + col]));
      }
    }
    __syncthreads();  // the next chunk's compaction overwrites the list
  }
}

enum class BackwardKernel { kSliced, kColumn, kCompact };

// FERRY_EMBEDDING_BWD: column | compact | sliced (unset, empty or anything else: sliced).
BackwardKernel backward_kernel() {
  const char* e = std::getenv("FERRY_EMBEDDING_BWD");
  if (e == nullptr) return BackwardKernel::kSliced;
  if (std::strcmp(e, "column") == 0) return BackwardKernel::kColumn;
  if (std::strcmp(e, "compact") == 0) return BackwardKernel::kCompact;
  return BackwardKernel::kSliced;
}

bool forward_element_forced() {
  const char* e = std::getenv("FERRY_EMBEDDING_FWD");
  return e != nullptr && std::strcmp(e, "element") == 0;
}

}  // namespace

cudaError_t launch_embedding(Elt e, void* out, const void* table, const std::int32_t* ids,
                             std::int64_t t, std::int64_t c, std::int64_t v, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  const std::int64_t row_bytes = c * (e == Elt::kF32 ? 4 : 2);
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(table) % 16 == 0;
  const bool known = e == Elt::kF32 || e == Elt::kBF16;
  if (known && row_bytes % 16 == 0 && aligned && !forward_element_forced()) {
    const std::int64_t blocks = (t + kRowWarps - 1) / kRowWarps;
    embedding_vec_kernel<<<static_cast<unsigned>(blocks), kRowWarps * 32, 0, stream>>>(
        static_cast<uint4*>(out), static_cast<const uint4*>(table), ids, t, row_bytes / 16, v);
    return cudaGetLastError();
  }
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<T><<<static_cast<unsigned>(t), 256, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(table), ids, c, v);
  });
}

cudaError_t launch_embedding_backward(Elt e_table, void* d_table, Elt e_dout, const void* d_out,
                                      const std::int32_t* ids, std::int64_t t, std::int64_t c,
                                      std::int64_t v, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  const BackwardKernel kernel = backward_kernel();
  if (kernel == BackwardKernel::kCompact) {
    std::int64_t slices = (t + kSliceTokens - 1) / kSliceTokens;
    if (slices > kMaxSlices) slices = kMaxSlices;
    const dim3 grid(static_cast<unsigned>((c + kCompactThreads - 1) / kCompactThreads),
                    static_cast<unsigned>(slices));
    const auto s32 = static_cast<std::int32_t>(slices);
    return dispatch_elt(e_dout, [&](auto tag) {
      using TD = decltype(tag);
      if (e_table == Elt::kF32) {
        embedding_backward_compact_kernel<float, TD><<<grid, kCompactThreads, 0, stream>>>(
            static_cast<float*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v, s32);
      } else {
        embedding_backward_compact_kernel<bf16, TD><<<grid, kCompactThreads, 0, stream>>>(
            static_cast<bf16*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v, s32);
      }
    });
  }
  if (kernel == BackwardKernel::kSliced) {
    const dim3 grid(static_cast<unsigned>((c + kSlicedThreads - 1) / kSlicedThreads), kVocabSlices);
    return dispatch_elt(e_dout, [&](auto tag) {
      using TD = decltype(tag);
      if (e_table == Elt::kF32) {
        embedding_backward_sliced_kernel<float, TD><<<grid, kSlicedThreads, 0, stream>>>(
            static_cast<float*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v);
      } else {
        embedding_backward_sliced_kernel<bf16, TD><<<grid, kSlicedThreads, 0, stream>>>(
            static_cast<bf16*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v);
      }
    });
  }
  return dispatch_elt(e_dout, [&](auto tag) {
    using TD = decltype(tag);
    if (e_table == Elt::kF32) {
      embedding_backward_column_kernel<float, TD><<<grid_for(c, 128), 128, 0, stream>>>(
          static_cast<float*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v);
    } else {
      embedding_backward_column_kernel<bf16, TD><<<grid_for(c, 128), 128, 0, stream>>>(
          static_cast<bf16*>(d_table), static_cast<const TD*>(d_out), ids, t, c, v);
    }
  });
}

}  // namespace ferry::kernels::cuda
