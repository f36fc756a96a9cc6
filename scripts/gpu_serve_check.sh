#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_serve_check.sh            (OUT defaults to /tmp/ferry_gpu_serve)
# The CUDA serve engine's check in one call (docs/serve.md "CUDA path"): a Release build of
# `ferry`, then `ferry bench serve --device cuda` with paged miss copies serial
# (--serial-miss-copies, the order before the overlap) and overlapped (the default) on the same
# geometry, seed and trace, then `gpu_test`'s serve tests (both built first). Files in $OUT: build.log, bench_*.json, bench.txt, gpu_serve_test.log.
# GEOMS (default "qwen3-30b-a3b-2l qwen3-30b-a3b-mini"), MODES (default resident,static,paged)
# and EXTRA (more bench flags) adjust the bench.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_serve}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu-serve}
GEOMS=${GEOMS:-"qwen3-30b-a3b-2l qwen3-30b-a3b-mini"}
MODES=${MODES:-resident,static,paged}
EXTRA=${EXTRA:-}
status=0
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  git log -1 --format='commit %H %s' 2>/dev/null
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
    -DFERRY_BUILD_ROUTE=OFF
} >"$OUT/build.log" 2>&1 || { stamp "CONFIGURE FAILED"; tail -30 "$OUT/build.log"; exit 1; }
# Both targets first: a compile beside the bench would disturb its host-side timing.
if ! cmake --build "$B" -j16 --target ferry >>"$OUT/build.log" 2>&1; then
  stamp "BUILD FAILED (ferry)"
  grep -E "error|FAILED" "$OUT/build.log" | head -30
  exit 1
fi
stamp "ferry built"
cmake --build "$B" -j16 --target gpu_test >"$OUT/build_test.log" 2>&1
echo "rc $?" >>"$OUT/build_test.log"
stamp "gpu_test build: $(tail -1 "$OUT/build_test.log")"
for g in $GEOMS; do
  for order in serial overlap; do
    flag=""
    [ "$order" = serial ] && flag="--serial-miss-copies"
    stamp "bench $g $order"
    # shellcheck disable=SC2086
    timeout 120 "$B/apps/ferry/ferry" bench serve --device cuda --geometry "$g" --modes "$MODES" \
      $flag $EXTRA --json "$OUT/bench_${g}_${order}.json" >>"$OUT/bench.txt" 2>&1 || {
      echo "bench $g $order failed: exit $?" | tee -a "$OUT/bench.txt"
      status=1
    }
  done
done
grep -E "paged|static|resident|^qwen|roofline" "$OUT/bench.txt" | head -40
if [ -x "$B/tests/gpu_test" ]; then
  timeout 150 "$B/tests/gpu_test" --gtest_filter='*Serve*' >"$OUT/gpu_serve_test.log" 2>&1 || status=1
  grep -E "^\[serve_gpu\]|PASSED|FAILED|tests ran|Failure|Expected|Which is" "$OUT/gpu_serve_test.log" | head -60
else
  grep -E "error|FAILED" "$OUT/build_test.log" | head -30
  status=1
fi
stamp "done, status $status"
exit $status
