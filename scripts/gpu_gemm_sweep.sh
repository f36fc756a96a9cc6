#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   OUT=/some/dir bash scripts/gpu_gemm_sweep.sh
# The GEMM shapes of issue #3 (Qwen2.5-3B/7B layers at 4096 tokens) in one call:
#   sweep_{hash,normal}.{txt,json}  cuda_gemm_sweep_bench: ferry's backend GEMM, cublasGemmEx (the
#                                   call torch.matmul makes) and every cuBLASLt heuristic algorithm,
#                                   round-robin, L2 flushed, on the bench's bf16 pattern and on
#                                   N(0, 1) operands
#   gemm_round{1,2}.json            BM_Gemm (cuda_kernels_bench) vs torch.matmul (torch_baselines.py
#                                   --only gemm), paired by tools/bench/compare.py, twice in turn so
#                                   the between-run spread is visible
# SWEEP_ARGS=--clusters adds each algorithm with explicit cluster shapes. SWEEP_DATA=hash limits the sweep to the bench's operands. GEMM_CANDIDATES="16 32" also runs the sweep's hash data with FERRY_GEMM_CANDIDATES=32 (the
# backend's tuner timing the heuristic's first 32 algorithms).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gemm_sweep}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu}
PY=python3
$PY -c "import torch" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON -DFERRY_BUILD_ROUTE=OFF &&
    cmake --build "$B" -j16 --target cuda_kernels_bench cuda_gemm_sweep_bench ${EXTRA_TARGETS:-}
} >"$OUT/gemm_build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" "$OUT/gemm_build.log" | head -30
  exit 1
}
for data in ${SWEEP_DATA:-hash normal}; do
  timeout 200 "$B/bench/cuda_gemm_sweep_bench" --data "$data" ${SWEEP_ARGS:-} --out "$OUT/sweep_$data.json" \
    >"$OUT/sweep_$data.txt" 2>&1 || echo "sweep $data exit $?"
  grep "^BM_Gemm" "$OUT/sweep_$data.txt"
done
for c in ${GEMM_CANDIDATES:-16}; do
  [ "$c" = 16 ] && continue
  FERRY_GEMM_CANDIDATES=$c timeout 120 "$B/bench/cuda_gemm_sweep_bench" --data hash \
    --candidates "$c" --out "$OUT/sweep_hash_c$c.json" >"$OUT/sweep_hash_c$c.txt" 2>&1
  echo "FERRY_GEMM_CANDIDATES=$c:"
  grep "^BM_Gemm" "$OUT/sweep_hash_c$c.txt"
done
for r in 1 2; do
  timeout 120 "$B/bench/cuda_kernels_bench" --benchmark_filter='BM_Gemm' \
    --benchmark_out="$OUT/ferry_gemm_$r.json" --benchmark_out_format=json >/dev/null 2>&1
  timeout 120 $PY tools/bench/torch_baselines.py --only gemm --out "$OUT/torch_gemm_$r.json" \
    >/dev/null 2>&1
  echo "round $r (ratio = torch ms / ferry ms):"
  $PY tools/bench/compare.py "$OUT/ferry_gemm_$r.json" "$OUT/torch_gemm_$r.json" \
    --out "$OUT/gemm_round$r.json" 2>&1 | grep -i "gemm"
done
