// SPDX-License-Identifier: Apache-2.0
#include "kernels/cuda/gemm_lt.h"

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/cuda_util.h"

namespace ferry::kernels::cuda {
namespace {

int pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % static_cast<std::uintptr_t>(a)) != 0) a /= 2;
  return a;
}

// FERRY_DETERMINISTIC=1 keeps the heuristic's first algorithm (the same choice in every process);
// otherwise the first call of each shape times the heuristic's candidates and keeps the fastest.
bool autotune_enabled() {
  const char* v = std::getenv("FERRY_DETERMINISTIC");
  return v == nullptr || v[0] == '\0' || v[0] == '0';
}

constexpr int kCandidates = 16;  // heuristic results timed per shape
constexpr int kTimedReps = 5;    // timed launches per candidate (after one untimed warm-up)

}  // namespace

LtGemm::Entry::~Entry() {
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (op) cublasLtMatmulDescDestroy(op);
}

LtGemm::~LtGemm() {
  cache_.clear();
  for (auto& [s, w] : workspaces_) (void)cudaFree(w);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status LtGemm::init(int device) {
  device_ = device;
  FERRY_CUDA_TRY(cudaSetDevice(device));
  FERRY_CUBLAS_TRY(cublasLtCreate(&handle_));
  return ok_status();
}

Result<void*> LtGemm::workspace_for(cudaStream_t stream) {
  auto it = workspaces_.find(stream);
  if (it != workspaces_.end()) return it->second;
  // NOTE(cuda): one-time warm-up allocation per stream (see the header); steady state reuses it.
  void* w = nullptr;
  FERRY_CUDA_TRY(cudaMalloc(&w, kWorkspaceBytes));
  workspaces_[stream] = w;
  return w;
}

Result<LtGemm::Entry*> LtGemm::entry_for(const GemmProblem& p, int align, bool beta_nonzero) {
  const Key key{p.m,
                p.n,
                p.k,
                p.trans_a,
                p.trans_b,
                static_cast<int>(p.ab_type),
                static_cast<int>(p.out_type),
                p.lda,
                p.ldb,
                p.ldo,
                align,
                p.has_bias ? 1 : 0,
                beta_nonzero ? 1 : 0};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second.get();

  auto e = std::make_unique<Entry>();
  // Column-major view: D^T [n, m] = op_b(b)^T-ish: LtA = b, LtB = a, m' = n, n' = m.
  FERRY_CUBLAS_TRY(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to b
  const cublasOperation_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to a
  FERRY_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  FERRY_CUBLAS_TRY(
      cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (p.has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    FERRY_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bt = p.out_type;
    FERRY_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                    sizeof(bt)));
  }
  // b as stored: !trans_b -> [K, N] row-major = col-major rows N, cols K; trans_b -> rows K, cols
  // N.
  FERRY_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&e->la, p.ab_type, p.trans_b ? p.k : p.n,
                                              p.trans_b ? p.n : p.k, p.ldb));
  FERRY_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&e->lb, p.ab_type, p.trans_a ? p.m : p.k,
                                              p.trans_a ? p.k : p.m, p.lda));
  FERRY_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&e->lc, p.out_type, p.n, p.m, p.ldo));

  cublasLtMatmulPreference_t pref = nullptr;
  FERRY_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kWorkspaceBytes;
  const std::uint32_t al = static_cast<std::uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al));
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(handle_, e->op, e->la, e->lb, e->lc, e->lc, pref,
                                     autotune_enabled() ? kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    return unimplemented(
        "kernels: cublasLt has no algorithm for gemm m={} n={} k={} trans_a={} trans_b={} "
        "align={}",
        p.m, p.n, p.k, p.trans_a, p.trans_b, align);
  e->algo = results[0].algo;
  for (int i = 1; i < found; ++i) e->candidates.push_back(results[i].algo);
  e->tuned = e->candidates.empty();
  Entry* raw = e.get();
  cache_.emplace(key, std::move(e));
  return raw;
}

Status LtGemm::run(const GemmProblem& p, const void* a, const void* b, void* out, const void* bias,
                   float alpha, float beta, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return ok_status();
  const int align =
      std::min({pointer_alignment(a), pointer_alignment(b), pointer_alignment(out), 16});
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_ASSIGN_OR_RETURN(void* ws, workspace_for(stream));
  FERRY_ASSIGN_OR_RETURN(Entry * e, entry_for(p, align, beta != 0.0f));
  if (p.has_bias)
    FERRY_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof(bias)));
  // beta == 0 overwrites `out`, so candidates can be timed on the real operands; the launch below
  // then writes the final result. With beta != 0 (accumulation) the heuristic's choice stays.
  if (!e->tuned && beta == 0.0f) FERRY_TRY(tune(e, a, b, out, ws, alpha, stream));
  FERRY_CUBLAS_TRY(cublasLtMatmul(handle_, e->op, &alpha, b, e->la, a, e->lb, &beta, out, e->lc,
                                  out, e->lc, &e->algo, ws, kWorkspaceBytes, stream));
  return check_launch(cudaGetLastError(), "cublasLtMatmul", stream, __FILE__, __LINE__);
}

Status LtGemm::tune(Entry* e, const void* a, const void* b, void* out, void* ws, float alpha,
                    cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FERRY_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return ok_status();  // cannot time inside a graph
  e->tuned = true;
  FERRY_ASSIGN_OR_RETURN(OwnedEvent start, OwnedEvent::create());
  FERRY_ASSIGN_OR_RETURN(OwnedEvent stop, OwnedEvent::create());
  const float beta = 0.0f;
  float best_ms = -1.0f;
  std::vector<cublasLtMatmulAlgo_t> all{e->algo};
  all.insert(all.end(), e->candidates.begin(), e->candidates.end());
  for (const cublasLtMatmulAlgo_t& algo : all) {
    // A candidate the library rejects for these operands is skipped, not an error.
    if (cublasLtMatmul(handle_, e->op, &alpha, b, e->la, a, e->lb, &beta, out, e->lc, out, e->lc,
                       &algo, ws, kWorkspaceBytes, stream) != CUBLAS_STATUS_SUCCESS)
      continue;
    // Each launch timed on its own; the median decides (one slow outlier does not).
    float reps[kTimedReps];
    bool ok = true;
    for (int r = 0; r < kTimedReps && ok; ++r) {
      FERRY_CUDA_TRY(cudaEventRecord(start.get(), stream));
      ok = cublasLtMatmul(handle_, e->op, &alpha, b, e->la, a, e->lb, &beta, out, e->lc, out, e->lc,
                          &algo, ws, kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
      FERRY_CUDA_TRY(cudaEventRecord(stop.get(), stream));
      FERRY_CUDA_TRY(cudaEventSynchronize(stop.get()));
      FERRY_CUDA_TRY(cudaEventElapsedTime(&reps[r], start.get(), stop.get()));
    }
    if (!ok) continue;
    std::sort(reps, reps + kTimedReps);
    const float ms = reps[kTimedReps / 2];
    if (best_ms < 0.0f || ms < best_ms) {
      best_ms = ms;
      e->algo = algo;
    }
  }
  e->candidates.clear();
  return ok_status();
}

}  // namespace ferry::kernels::cuda
