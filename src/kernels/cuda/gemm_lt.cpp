// SPDX-License-Identifier: Apache-2.0
#include "kernels/cuda/gemm_lt.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/log.h"
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

// How many of the heuristic's algorithms the first call of a shape times: 16, or
// FERRY_GEMM_CANDIDATES (1-64; an experiment knob for cuda_gemm_sweep_bench's comparisons).
int tune_candidates() {
  const char* v = std::getenv("FERRY_GEMM_CANDIDATES");
  const int n = v == nullptr ? 0 : std::atoi(v);
  return n >= 1 && n <= 64 ? n : 16;
}
// Timed launches per candidate, after one untimed warm-up: a short screen of all, then more
// rounds for the fastest few.
constexpr int kScreenRounds = 3;
constexpr int kFinalRounds = 9;
constexpr std::size_t kFinalists = 3;

// "tile=.. stages=.. cluster=.." of an algorithm, for the tuner's debug log.
std::string algo_config(const cublasLtMatmulAlgo_t& a) {
  std::uint32_t tile = 0, stages = 0;
  std::uint16_t cluster = 0;
  std::size_t w = 0;
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                             &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof(stages), &w);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof(cluster), &w);
  return fmt::format("tile={} stages={} cluster={}", tile, stages, cluster);
}

// Candidates are timed with a cold L2 (a scratch buffer of twice the L2 written before each timed
// launch) unless FERRY_GEMM_TUNE_FLUSH=0. Hot repeats favour tiles that win while a small
// problem's operands stay in L2 (4096 x 2048 x 2048: 0.052 ms picked hot vs 0.047 ms for the
// heuristic's first with a cold L2, H100); a layer's GEMM meets weights just streamed in and
// activations written several kernels ago, which is nearer the cold case.
bool tune_with_cold_l2() {
  const char* v = std::getenv("FERRY_GEMM_TUNE_FLUSH");
  return v == nullptr || v[0] != '0';
}

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
  const int wanted = autotune_enabled() ? tune_candidates() : 1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(wanted));
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      handle_, e->op, e->la, e->lb, e->lc, e->lc, pref, wanted, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    return unimplemented(
        "kernels: cublasLt has no algorithm for gemm m={} n={} k={} trans_a={} trans_b={} "
        "align={}",
        p.m, p.n, p.k, p.trans_a, p.trans_b, align);
  e->algo = results[0].algo;
  for (int i = 1; i < found; ++i)
    e->candidates.push_back(results[static_cast<std::size_t>(i)].algo);
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
  if (!e->tuned && beta == 0.0f) FERRY_TRY(tune(p, e, a, b, out, ws, alpha, stream));
  FERRY_CUBLAS_TRY(cublasLtMatmul(handle_, e->op, &alpha, b, e->la, a, e->lb, &beta, out, e->lc,
                                  out, e->lc, &e->algo, ws, kWorkspaceBytes, stream));
  return check_launch(cudaGetLastError(), "cublasLtMatmul", stream, __FILE__, __LINE__);
}

Status LtGemm::tune(const GemmProblem& p, Entry* e, const void* a, const void* b, void* out,
                    void* ws, float alpha, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FERRY_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return ok_status();  // cannot time inside a graph
  e->tuned = true;
  const float beta = 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, e->op, &alpha, b, e->la, a, e->lb, &beta, out, e->lc, out, e->lc,
                          &algo, ws, kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
  };
  // A candidate the library rejects for these operands is dropped, not an error; the untimed
  // first launch also loads each kernel.
  std::vector<cublasLtMatmulAlgo_t> offered{e->algo};
  offered.insert(offered.end(), e->candidates.begin(), e->candidates.end());
  e->candidates.clear();
  std::vector<cublasLtMatmulAlgo_t> all;
  for (const cublasLtMatmulAlgo_t& algo : offered)
    if (launch(algo)) all.push_back(algo);
  if (all.empty()) return ok_status();  // the launch in run() reports the heuristic's refusal
  e->algo = all.front();
  if (all.size() == 1) return ok_status();
  // The flush buffer lives only while this shape is tuned (cudaMalloc/cudaFree: tuning happens
  // once per shape, outside any graph). Where the device has no room for it, candidates are timed
  // hot rather than failing the GEMM.
  void* flush = nullptr;
  std::size_t flush_bytes = 0;
  if (tune_with_cold_l2()) {
    int l2 = 0;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_) == cudaSuccess && l2 > 0) {
      flush_bytes = 2 * static_cast<std::size_t>(l2);
      if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
        (void)cudaGetLastError();  // reset the last-error slot the failed cudaMalloc set
        flush = nullptr;
      }
    }
  }
  struct FreeOnExit {
    void* p;
    ~FreeOnExit() {
      if (p != nullptr) (void)cudaFree(p);
    }
  } free_flush{flush};
  std::vector<OwnedEvent> events;
  for (std::size_t i = 0; i < 2 * all.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(OwnedEvent ev, OwnedEvent::create());
    events.push_back(std::move(ev));
  }
  // Round-robin: each round launches every candidate in `which` once, each between its own pair
  // of events, so a clock change during tuning (the GPU heats towards its power limit within a
  // second of GEMMs) falls on all of them alike. Returns each one's median over the rounds.
  auto median_ms = [&](const std::vector<std::size_t>& which,
                       int rounds) -> Result<std::vector<float>> {
    std::vector<std::vector<float>> times(which.size());
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t j = 0; j < which.size(); ++j) {
        if (flush != nullptr)
          FERRY_CUDA_TRY(
              cudaMemsetAsync(flush, (r + static_cast<int>(j)) & 0xff, flush_bytes, stream));
        FERRY_CUDA_TRY(cudaEventRecord(events[2 * j].get(), stream));
        if (!launch(all[which[j]]))
          return internal_error("cublasLtMatmul refused an algorithm it ran");
        FERRY_CUDA_TRY(cudaEventRecord(events[2 * j + 1].get(), stream));
      }
      FERRY_CUDA_TRY(cudaEventSynchronize(events[2 * which.size() - 1].get()));
      for (std::size_t j = 0; j < which.size(); ++j) {
        float ms = 0.0f;
        FERRY_CUDA_TRY(cudaEventElapsedTime(&ms, events[2 * j].get(), events[2 * j + 1].get()));
        times[j].push_back(ms);
      }
    }
    std::vector<float> med;
    for (auto& t : times) {
      std::sort(t.begin(), t.end());
      med.push_back(t[t.size() / 2]);
    }
    return med;
  };
  // Screen every candidate briefly, then time the few fastest again at length: candidates within
  // a few percent of each other are told apart by more rounds, not by a lucky first one.
  std::vector<std::size_t> every(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) every[i] = i;
  FERRY_ASSIGN_OR_RETURN(std::vector<float> screen, median_ms(every, kScreenRounds));
  std::vector<std::size_t> finalists = every;
  std::stable_sort(finalists.begin(), finalists.end(),
                   [&](std::size_t x, std::size_t y) { return screen[x] < screen[y]; });
  finalists.resize(std::min<std::size_t>(finalists.size(), kFinalists));
  FERRY_ASSIGN_OR_RETURN(std::vector<float> final_ms, median_ms(finalists, kFinalRounds));
  std::size_t best = 0;
  for (std::size_t j = 1; j < finalists.size(); ++j)
    if (final_ms[j] < final_ms[best]) best = j;
  e->algo = all[finalists[best]];
  if (auto lg = log::get("gemm"); lg->should_log(spdlog::level::debug)) {
    std::string line;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto f = std::find(finalists.begin(), finalists.end(), i);
      line += fmt::format(" [{}{} {} screen={:.4f}", i == finalists[best] ? "*" : "", i,
                          algo_config(all[i]), screen[i]);
      if (f != finalists.end())
        line +=
            fmt::format(" final={:.4f}", final_ms[static_cast<std::size_t>(f - finalists.begin())]);
      line += "]";
    }
    lg->debug("tuned m={} n={} k={} trans_a={} trans_b={} cold_l2={}:{}", p.m, p.n, p.k, p.trans_a,
              p.trans_b, flush != nullptr, line);
  }
  return ok_status();
}

}  // namespace ferry::kernels::cuda
