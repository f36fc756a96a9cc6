// SPDX-License-Identifier: Apache-2.0
// Why is a bf16 GEMM shape below torch.matmul? One process, the same operands, timed the way
// cuda_kernels_bench times BM_Gemm (CUDA events, 256 MiB L2 flush before every launch), but in
// round-robin order so that clock drift falls on every contender alike:
//   ferry     the CUDA backend's gemm (cuBLASLt, autotuned on first use: gemm_lt.cpp)
//   cublas    cublasGemmEx with CUBLAS_GEMM_DEFAULT_TENSOR_OP and a 32 MiB workspace: the call
//             torch.matmul makes for a bf16 [m, k] x [n, k]^T product
//   lt<i>     the i-th algorithm of cuBLASLt's heuristic (up to --candidates), each with its
//             configuration (tile, stages, split-k, reduction scheme, CTA swizzle, cluster)
// Shapes: Qwen2.5-3B/7B layer GEMMs at 4096 tokens (BM_Gemm's). Operands: --data hash (the bench's
// bf16 pattern in [-0.5, 0.5)) or --data normal (N(0, 1), like torch.randn; the GPU's clock under
// its power limit depends on the bits). Writes --out JSON and prints one table per shape; with
// FERRY_LOG_LEVEL=debug the backend's tuner logs its candidates' times to stderr.
//   cuda_gemm_sweep_bench [--data hash|normal] [--candidates N] [--rounds R] [--clusters]
//                         [--out FILE]
//   compute-sanitizer --tool initcheck cuda_gemm_sweep_bench --initcheck-probe   (see below)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/log.h"
#include "kernels/backend.h"

namespace {

using namespace ferry;

#define SWEEP_CUDA(x) FERRY_CHECK((x) == cudaSuccess, "cuda: {}", #x)
#define SWEEP_BLAS(x) FERRY_CHECK((x) == CUBLAS_STATUS_SUCCESS, "cublas: {}", #x)

constexpr std::size_t kFlushBytes = 256u << 20;
constexpr std::size_t kWorkspaceBytes = 32u << 20;
constexpr std::pair<cublasLtClusterShape_t, const char*> kClusterShapes[] = {
    {CUBLASLT_CLUSTER_SHAPE_1x1x1, "1x1"}, {CUBLASLT_CLUSTER_SHAPE_2x1x1, "2x1"},
    {CUBLASLT_CLUSTER_SHAPE_1x2x1, "1x2"}, {CUBLASLT_CLUSTER_SHAPE_2x2x1, "2x2"},
    {CUBLASLT_CLUSTER_SHAPE_4x1x1, "4x1"}, {CUBLASLT_CLUSTER_SHAPE_1x4x1, "1x4"}};

// A device buffer of `n` bf16 values: a 1 Mi-value host pattern repeated.
void* upload(std::size_t n, std::uint32_t seed, bool normal) {
  void* p = nullptr;
  SWEEP_CUDA(cudaMalloc(&p, n * 2));
  std::vector<std::uint16_t> h(std::min<std::size_t>(n, 1u << 20));
  if (normal) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : h) v = f32_to_bf16(d(rng));
  } else {
    std::uint32_t x = seed * 2654435761u + 1;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<std::uint16_t>(((x >> 16) & 0x807f) | 0x3e00 | ((x >> 8) & 0x80));
    }
  }
  for (std::size_t off = 0; off < n; off += h.size())
    SWEEP_CUDA(cudaMemcpy(static_cast<std::uint16_t*>(p) + off, h.data(),
                          std::min(h.size(), n - off) * 2, cudaMemcpyHostToDevice));
  SWEEP_CUDA(cudaDeviceSynchronize());  // pageable uploads may land after cudaMemcpy returns
  return p;
}

struct Contender {
  std::string name;
  std::string config;            // the algorithm's configuration, for lt<i>
  std::function<bool()> launch;  // false: the library refused these operands
  double total_ms = 0.0;
  int runs = 0;
  bool ok = true;
};

template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS)
    return T{};
  return v;
}

std::string describe(const cublasLtMatmulAlgo_t& a, std::size_t ws, float waves) {
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "id=%d tile=%u stages=%u splitk=%u red=%u swizzle=%u cluster=%u ws=%zuKiB waves=%.2f",
      algo_attr<int>(a, CUBLASLT_ALGO_CONFIG_ID),
      algo_attr<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
      algo_attr<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
      algo_attr<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
      algo_attr<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
      algo_attr<std::uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
      static_cast<unsigned>(algo_attr<std::uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)),
      ws >> 10, waves);
  return buf;
}

// --initcheck-probe, to run under `compute-sanitizer --tool initcheck`: is a cuBLASLt GEMM's
// output (Hopper kernels store it through TMA) seen as initialized by initcheck? Three [m, n] bf16
// outputs in fresh cudaMalloc memory, each then read by the backend's convert kernel: (1) written
// by the GEMM only, (2) cudaMemset first and then written by the GEMM (the control: any report on
// it is not about the GEMM's stores), (3) written by a convert kernel (plain stores). Reports on
// the reads of (1) alone say the GEMM's stores are invisible to initcheck; each buffer's address
// is printed so the reports can be told apart.
int initcheck_probe(kernels::Backend* be, mem::Stream& stream, cudaStream_t raw) {
  const std::int64_t m = 512, n = 2048, k = 2048;
  void* a = upload(static_cast<std::size_t>(m * k), 1, false);
  void* b = upload(static_cast<std::size_t>(n * k), 2, false);
  void *out[3] = {}, *f32 = nullptr;
  for (auto& o : out) SWEEP_CUDA(cudaMalloc(&o, static_cast<std::size_t>(m * n) * 2));
  SWEEP_CUDA(cudaMalloc(&f32, static_cast<std::size_t>(m * n) * 4));
  SWEEP_CUDA(cudaMemset(out[1], 0, static_cast<std::size_t>(m * n) * 2));
  SWEEP_CUDA(cudaMemset(f32, 0, static_cast<std::size_t>(m * n) * 4));
  auto bf16 = [&](void* p) {
    return TensorView::contiguous(p, DType::kBF16, Device::kCuda, {m, n});
  };
  const TensorView f32v = TensorView::contiguous(f32, DType::kF32, Device::kCuda, {m, n});
  for (int i = 0; i < 2; ++i) {
    const kernels::GemmArgs args{
        .out = bf16(out[i]),
        .a = TensorView::contiguous(a, DType::kBF16, Device::kCuda, {m, k}),
        .b = TensorView::contiguous(b, DType::kBF16, Device::kCuda, {n, k}),
        .trans_b = true};
    FERRY_CHECK_OK(be->gemm(args, stream));
  }
  FERRY_CHECK_OK(be->convert({.out = bf16(out[2]), .in = f32v}, stream));
  SWEEP_CUDA(cudaStreamSynchronize(raw));
  const char* what[3] = {"gemm only", "memset then gemm (control)", "convert kernel"};
  for (int i = 0; i < 3; ++i) {
    std::printf("initcheck probe: buffer %d (%s) at %p..%p, read by convert now\n", i, what[i],
                out[i], static_cast<char*>(out[i]) + m * n * 2);
    std::fflush(stdout);
    FERRY_CHECK_OK(be->convert({.out = f32v, .in = bf16(out[i])}, stream));
    SWEEP_CUDA(cudaStreamSynchronize(raw));
  }
  for (auto& o : out) SWEEP_CUDA(cudaFree(o));
  SWEEP_CUDA(cudaFree(f32));
  SWEEP_CUDA(cudaFree(a));
  SWEEP_CUDA(cudaFree(b));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool normal = false;
  int n_candidates = 32, rounds = 20;
  bool clusters = false, probe = false;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      FERRY_CHECK(i + 1 < argc, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--data") {
      const std::string v = next();
      FERRY_CHECK(v == "hash" || v == "normal", "--data hash|normal, got {}", v);
      normal = v == "normal";
    } else if (a == "--candidates") {
      n_candidates = std::stoi(next());
    } else if (a == "--rounds") {
      rounds = std::stoi(next());
    } else if (a == "--initcheck-probe") {
      probe = true;
    } else if (a == "--clusters") {
      clusters = true;
    } else if (a == "--out") {
      out_path = next();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--data hash|normal] [--candidates N] [--rounds R] [--clusters] "
                   "[--out FILE] | --initcheck-probe\n",
                   argv[0]);
      return 2;
    }
  }
  log::init_from_env();  // FERRY_LOG_LEVEL=debug: the backend's tuner logs every candidate
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "cuda_gemm_sweep_bench: no CUDA device, skipped\n");
    return 0;
  }
  cudaDeviceProp prop{};
  SWEEP_CUDA(cudaGetDeviceProperties(&prop, 0));
  auto be = kernels::cuda_backend(0);
  FERRY_CHECK(be.ok(), "cuda backend: {}", be.status().message());
  cudaStream_t raw = nullptr;
  SWEEP_CUDA(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  mem::Stream stream(Device::kCuda, 0, raw);
  if (probe) return initcheck_probe(*be, stream, raw);
  void *flush = nullptr, *ws = nullptr, *ws_blas = nullptr;
  SWEEP_CUDA(cudaMalloc(&flush, kFlushBytes));
  SWEEP_CUDA(cudaMalloc(&ws, kWorkspaceBytes));
  SWEEP_CUDA(cudaMalloc(&ws_blas, kWorkspaceBytes));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  SWEEP_CUDA(cudaEventCreate(&e0));
  SWEEP_CUDA(cudaEventCreate(&e1));
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  SWEEP_BLAS(cublasLtCreate(&lt));
  SWEEP_BLAS(cublasCreate(&blas));
  SWEEP_BLAS(cublasSetStream(blas, raw));
  SWEEP_BLAS(cublasSetWorkspace(blas, ws_blas, kWorkspaceBytes));

  const std::vector<std::array<std::int64_t, 3>> shapes = {
      {4096, 2560, 2048}, {4096, 2048, 2048}, {4096, 22016, 2048}, {4096, 2048, 11008},
      {4096, 4608, 3584}, {4096, 3584, 3584}, {4096, 37888, 3584}, {4096, 3584, 18944}};
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"data\": \"" +
                     (normal ? "normal" : "hash") + "\", \"rounds\": " + std::to_string(rounds) +
                     ", \"shapes\": [";
  std::printf("device %s, data %s, %d rounds, L2 flushed before every launch\n", prop.name,
              normal ? "normal" : "hash", rounds);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const auto [m, n, k] = shapes[si];
    void* a = upload(static_cast<std::size_t>(m * k), 1, normal);
    void* b = upload(static_cast<std::size_t>(n * k), 2, normal);
    void* c = upload(static_cast<std::size_t>(m * n), 3, normal);
    const float alpha = 1.0f, beta = 0.0f;

    std::vector<Contender> cs;
    const kernels::GemmArgs args{
        .out = TensorView::contiguous(c, DType::kBF16, Device::kCuda, {m, n}),
        .a = TensorView::contiguous(a, DType::kBF16, Device::kCuda, {m, k}),
        .b = TensorView::contiguous(b, DType::kBF16, Device::kCuda, {n, k}),
        .trans_b = true};
    cs.push_back({"ferry", "", [&] { return (*be)->gemm(args, stream).ok(); }});
    // torch.matmul(x, w.t()): column-major C^T[n, m] = W[n, k] (op T on the k x n view) x^T.
    cs.push_back({"cublas", "cublasGemmEx DEFAULT_TENSOR_OP", [&] {
                    return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                        CUDA_R_16BF, static_cast<int>(k), a, CUDA_R_16BF,
                                        static_cast<int>(k), &beta, c, CUDA_R_16BF,
                                        static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT_TENSOR_OP) == CUBLAS_STATUS_SUCCESS;
                  }});
    // The same descriptors as gemm_lt.cpp (row-major y = x W^T seen column-major).
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    SWEEP_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    SWEEP_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    SWEEP_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    SWEEP_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
    SWEEP_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
    SWEEP_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    SWEEP_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws_bytes = kWorkspaceBytes;
    SWEEP_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof(ws_bytes)));
    // 16-byte operands, as gemm_lt.cpp and torch's cuBLAS ask for them.
    const std::uint32_t align = 16;
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      SWEEP_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<std::size_t>(n_candidates));
    int found = 0;
    SWEEP_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, n_candidates,
                                              res.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    auto add_lt = [&](const std::string& name, const cublasLtMatmulAlgo_t& algo, std::size_t need,
                      float waves) {
      cs.push_back({name, describe(algo, need, waves), [&, algo] {
                      return cublasLtMatmul(lt, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc,
                                            &algo, ws, kWorkspaceBytes,
                                            raw) == CUBLAS_STATUS_SUCCESS;
                    }});
    };
    for (int i = 0; i < found; ++i) {
      const cublasLtMatmulHeuristicResult_t& h = res[static_cast<std::size_t>(i)];
      add_lt("lt" + std::to_string(i), h.algo, h.workspaceSize, h.wavesCount);
    }
    // --clusters: each heuristic algorithm again with an explicit thread-block cluster shape (the
    // heuristic leaves it AUTO); cublasLtMatmulAlgoCheck drops the ones these operands refuse.
    for (int i = 0; clusters && i < found; ++i) {
      for (const auto& [shape, label] : kClusterShapes) {
        cublasLtMatmulAlgo_t algo = res[static_cast<std::size_t>(i)].algo;
        const std::uint16_t id = static_cast<std::uint16_t>(shape);
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &id,
                                                 sizeof(id)) != CUBLAS_STATUS_SUCCESS)
          continue;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &algo, &check) !=
                CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > kWorkspaceBytes)
          continue;
        add_lt("lt" + std::to_string(i) + "c" + label, algo, check.workspaceSize, check.wavesCount);
      }
    }
    // Warm-up: ferry autotunes here; every algorithm loads its kernel.
    for (auto& x : cs) x.ok = x.launch() && x.launch();
    SWEEP_CUDA(cudaStreamSynchronize(raw));
    for (int r = 0; r < rounds; ++r) {
      // Rotate the start so no contender always follows the same one.
      for (std::size_t j = 0; j < cs.size(); ++j) {
        Contender& x = cs[(j + static_cast<std::size_t>(r)) % cs.size()];
        if (!x.ok) continue;
        SWEEP_CUDA(cudaMemsetAsync(flush, 0, kFlushBytes, raw));
        SWEEP_CUDA(cudaEventRecord(e0, raw));
        x.ok = x.launch();
        SWEEP_CUDA(cudaEventRecord(e1, raw));
        SWEEP_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        SWEEP_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        x.total_ms += ms;
        ++x.runs;
      }
    }
    const double flop =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const double ferry_ms = cs[0].total_ms / std::max(cs[0].runs, 1);
    const double blas_ms = cs[1].total_ms / std::max(cs[1].runs, 1);
    double best_ms = 1e30;
    std::string best;
    for (std::size_t j = 2; j < cs.size(); ++j)
      if (cs[j].ok && cs[j].runs > 0 && cs[j].total_ms / cs[j].runs < best_ms) {
        best_ms = cs[j].total_ms / cs[j].runs;
        best = cs[j].name;
      }
    std::printf(
        "\nBM_Gemm/%lld/%lld/%lld: ferry %.4f ms, cublas %.4f ms (ferry/cublas speed %.3f), best "
        "Lt %s %.4f ms (%.3f of cublas), %d Lt candidates\n",
        static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), ferry_ms,
        blas_ms, blas_ms / ferry_ms, best.c_str(), best_ms, blas_ms / best_ms, found);
    json += std::string(si ? ", " : "") + "{\"m\": " + std::to_string(m) +
            ", \"n\": " + std::to_string(n) + ", \"k\": " + std::to_string(k) +
            ", \"contenders\": [";
    for (std::size_t j = 0; j < cs.size(); ++j) {
      const double ms = cs[j].runs ? cs[j].total_ms / cs[j].runs : -1.0;
      std::printf("  %-7s %s %.4f ms %6.1f TFLOP/s  %s\n", cs[j].name.c_str(),
                  cs[j].ok ? "  " : "X ", ms, ms > 0 ? flop / ms * 1e-9 : 0.0,
                  cs[j].config.c_str());
      json += std::string(j ? ", " : "") + "{\"name\": \"" + cs[j].name +
              "\", \"ok\": " + (cs[j].ok ? "true" : "false") + ", \"ms\": " + std::to_string(ms) +
              ", \"config\": \"" + cs[j].config + "\"}";
    }
    json += "]}";
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    SWEEP_CUDA(cudaFree(a));
    SWEEP_CUDA(cudaFree(b));
    SWEEP_CUDA(cudaFree(c));
  }
  json += "]}\n";
  if (!out_path.empty()) std::ofstream(out_path) << json;
  cublasDestroy(blas);
  cublasLtDestroy(lt);
  return 0;
}
