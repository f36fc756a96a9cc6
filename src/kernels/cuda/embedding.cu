// SPDX-License-Identifier: Apache-2.0
// Embedding lookup and its backward. Forward: one block per token copies its row (an id outside
// [0, V) writes zeros; ids are device data and the host cannot check them without a sync).
// Backward: one thread per column walks the tokens in order, for f32 and bf16 d_table alike:
// bitwise deterministic (atomics would add repeated ids in a different order each run; the stream
// trainer's policies and exact resume need the same bits) and no bf16 atomics rounding twice.
// That kernel has only C threads (3 584 at the 7B width: 28 CTAs on a 132-SM GPU), each a chain of
// T dependent read-modify-writes. The default backward splits the vocabulary into kVocabSlices
// residue classes (id % kVocabSlices) as well: thread (column, slice) walks all tokens in order
// (their ids staged in shared memory) and adds only the rows of its slice, so every d_table
// element still receives its tokens' d_out in token order from one thread, one rounding per add:
// the column kernel's bits exactly
// (KernelsDense.EmbeddingBackwardSlicedIsTheColumnKernelBitForBit), with C x kVocabSlices threads.
// FERRY_EMBEDDING_BWD_COLUMN=1 keeps the column kernel (read at every launch) for A/B runs. Tested
// in tests/gpu/kernels_dense_test.cpp.
#include <cstdlib>

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

bool embedding_backward_column_forced() {
  const char* e = std::getenv("FERRY_EMBEDDING_BWD_COLUMN");
  return e != nullptr && e[0] == '1';
}

}  // namespace

cudaError_t launch_embedding(Elt e, void* out, const void* table, const std::int32_t* ids,
                             std::int64_t t, std::int64_t c, std::int64_t v, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
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
  if (!embedding_backward_column_forced()) {
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
