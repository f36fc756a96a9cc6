#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_check.sh
# Builds the CUDA backend, its tests and benchmarks (Release, sm_90), runs `ctest -L gpu`, the
# CUDA kernel benchmarks and the PyTorch baselines on the same shapes (tools/bench/), a ratio
# summary, and compute-sanitizer memcheck over gpu_test. Everything lands in $OUT (at most 8 files):
#   build.log ctest.log ferry_bench.json torch_bench.json bench_summary.json summary.log memcheck.log
# Exit status: non-zero when the build or the tests fail (benchmarks still run after test failures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_check}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu}
status=0

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON &&
    cmake --build "$B" -j16 --target gpu_test cuda_kernels_bench
} >"$OUT/build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  exit 1
}
echo "build ok"

(cd "$B" && timeout 200 ctest -L gpu --output-on-failure) >"$OUT/ctest.log" 2>&1 || status=1
grep -E "tests passed|FAILED|Failed|Error|Expected|Which is|err " "$OUT/ctest.log" | head -60

PY=python3
$PY -c "import torch" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
timeout 150 "$B/bench/cuda_kernels_bench" --benchmark_out="$OUT/ferry_bench.json" \
  --benchmark_out_format=json >"$OUT/summary.log" 2>&1
timeout 120 $PY tools/bench/torch_baselines.py --out "$OUT/torch_bench.json" >>"$OUT/summary.log" 2>&1
$PY tools/bench/compare.py "$OUT/ferry_bench.json" "$OUT/torch_bench.json" \
  --out "$OUT/bench_summary.json" >>"$OUT/summary.log" 2>&1
tail -30 "$OUT/summary.log"

if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 150 "$CS" --tool memcheck --error-exitcode 9 "$B/tests/gpu_test" \
    --gtest_filter="${MEMCHECK_FILTER:-*}" >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/memcheck.log" | head -12
fi
exit $status
