// SPDX-License-Identifier: Apache-2.0
// Row-major GEMM through cuBLASLt: out[M,N] = alpha * op(a) @ op(b) + beta * out (+ bias[N]).
// bf16 or f32 inputs, f32 accumulation (CUBLAS_COMPUTE_32F: no TF32 for f32 inputs), output bf16
// or f32, bias through the BIAS epilogue. Row-major is handled by asking cuBLASLt (column-major)
// for out^T = op(b)^T op(a)^T. Descriptors and an algorithm are cached per problem key (shape,
// transposes, dtypes, strides, pointer alignment, bias, beta != 0). The algorithm: the first time
// a key runs with beta == 0, the heuristic's top 16 candidates are timed on the real operands
// with a cold L2 (one-time warm-up cost with host syncs; skipped while the stream is being
// captured; gemm_lt.cpp says how) and the fastest is kept — so which algorithm, and hence the
// exact bits, may differ between processes. FERRY_DETERMINISTIC=1 keeps the heuristic's first
// algorithm instead (same bits every process).
// Device memory outside any arena: one 32 MiB workspace per stream, allocated the first time a
// stream is used (a one-time warm-up allocation, never in steady state; GEMMs on one stream
// serialise on it), and while a shape is tuned a scratch of twice the L2 (100 MiB on H100 / H200)
// to evict the L2 between timed launches, freed when the tuning ends; where it does not fit the
// candidates are timed hot instead.
// Thread-safe (one mutex around the cache and the launch). Tested in
// tests/gpu/kernels_dense_test.cpp (KernelsDense.Gemm*).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/result.h"
#include "core/status.h"

namespace ferry::kernels::cuda {

struct GemmProblem {
  std::int64_t m = 0, n = 0, k = 0;  // row-major out [m, n], reduction k
  bool trans_a = false, trans_b = false;
  cudaDataType_t ab_type = CUDA_R_16BF;
  cudaDataType_t out_type = CUDA_R_16BF;
  std::int64_t lda = 0, ldb = 0, ldo = 0;  // row strides in elements
  bool has_bias = false;
};

class LtGemm {
 public:
  static constexpr std::size_t kWorkspaceBytes = 32u << 20;

  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm();

  Status init(int device);
  Status run(const GemmProblem& p, const void* a, const void* b, void* out, const void* bias,
             float alpha, float beta, cudaStream_t stream);

 private:
  struct Entry {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::vector<cublasLtMatmulAlgo_t> candidates;  // untimed alternatives until tuned
    bool tuned = false;
    ~Entry();
  };
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, int, int, std::int64_t,
                         std::int64_t, std::int64_t, int, int, int>;

  Result<Entry*> entry_for(const GemmProblem& p, int align, bool beta_nonzero);
  Result<void*> workspace_for(cudaStream_t stream);
  // The first beta == 0 call of a shape times the heuristic's candidates (gemm_lt.cpp) and keeps
  // the fastest; FERRY_LOG_LEVEL=debug logs every candidate's times ("gemm" logger).
  Status tune(const GemmProblem& p, Entry* e, const void* a, const void* b, void* out, void* ws,
              float alpha, cudaStream_t stream);

  int device_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Entry>> cache_;
  std::map<cudaStream_t, void*> workspaces_;
};

}  // namespace ferry::kernels::cuda
