#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_serve_check.sh                  (OUT defaults to /tmp/ferry_gpu_serve)
#   STAGES="build bench" bash scripts/gpu_serve_check.sh; STAGES="build test" ...  (a warm
#   machine keeps the build, so a second call only re-runs what changed)
# The CUDA serve engine's check (docs/serve.md "CUDA path"):
#   build  Release `ferry` and `gpu_test` (sm_90)
#   bench  `ferry bench serve --device cuda` per geometry and expert dtype, paged miss copies
#          serial (--serial-miss-copies, the order before the overlap) and overlapped (default),
#          same seed, trace and sizing: bench_<geometry>_<dtype>_<order>.json + bench.txt
#   test   gpu_test's serve tests (*Serve*): gpu_serve_test.log
# GEOMS (default qwen3-30b-a3b-2l), DTYPES (default "f32 bf16"), MODES (default resident,paged)
# and EXTRA (more bench flags) adjust the bench. Files in $OUT; exit status non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_serve}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu-serve}
STAGES=${STAGES:-"build bench test"}
GEOMS=${GEOMS:-qwen3-30b-a3b-2l}
DTYPES=${DTYPES:-"f32 bf16"}
MODES=${MODES:-resident,paged}
EXTRA=${EXTRA:-}
status=0
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has build; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
      -DFERRY_BUILD_ROUTE=OFF
    # Both targets before any timing: a compile beside the bench would disturb it.
    cmake --build "$B" -j16 --target ferry gpu_test
  } >>"$OUT/build.log" 2>&1 || {
    stamp "BUILD FAILED"
    grep -E "error|FAILED" "$OUT/build.log" | head -30
    exit 1
  }
  stamp "built ferry and gpu_test"
fi

if has bench; then
  for g in $GEOMS; do
    for dt in $DTYPES; do
      for order in serial overlap; do
        flag=""
        [ "$order" = serial ] && flag="--serial-miss-copies"
        stamp "bench $g $dt $order" | tee -a "$OUT/bench.txt"
        # shellcheck disable=SC2086
        timeout 150 "$B/apps/ferry/ferry" bench serve --device cuda --geometry "$g" \
          --modes "$MODES" --expert-dtype "$dt" $flag $EXTRA \
          --json "$OUT/bench_${g}_${dt}_${order}.json" >>"$OUT/bench.txt" 2>&1 || {
          echo "bench $g $dt $order failed: exit $?" | tee -a "$OUT/bench.txt"
          status=1
        }
      done
    done
  done
  grep -E "^\[|paged|resident|static|failed" "$OUT/bench.txt" | head -40
fi

if has test; then
  timeout 200 "$B/tests/gpu_test" --gtest_filter='*Serve*' >"$OUT/gpu_serve_test.log" 2>&1 ||
    status=1
  grep -E "^\[serve_gpu\]|PASSED|FAILED|tests ran|Failure|Expected|Which is" \
    "$OUT/gpu_serve_test.log" | head -70
fi
stamp "done, status $status"
exit $status
