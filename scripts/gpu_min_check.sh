#!/usr/bin/env bash
# Run THERE (the GPU machine) with .debs carried, when little device time is left: builds gpu_test
# only (Release, sm_90a, no benches), runs TEST_FILTER, then (SAN=1) compute-sanitizer memcheck
# and initcheck on the warpgroup-MMA attention kernels within SAN_TIMEOUT each. Files under
# $OUT/r (packed as $OUT/all.tgz by the caller or at the end here).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
source scripts/lib/gpu_sanitize.sh
B=${FERRY_GPU_BUILD:-build/gpu}
R=${OUT:-/tmp/ferry_min}/r
mkdir -p "$R"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF -DFERRY_BUILD_ROUTE=OFF >"$R/build.log" 2>&1
if ! cmake --build "$B" -j16 --target gpu_test >>"$R/build.log" 2>&1; then
  grep -E "error|FAILED" "$R/build.log" | head -30
  stamp "BUILD FAILED"
  exit 1
fi
stamp "built"
timeout "${TEST_TIMEOUT:-120}" "$B/tests/gpu_test" --gtest_filter="${TEST_FILTER:-*ModelGpu*}" >"$R/test.log" 2>&1
echo "tests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$R/test.log" | tr '\n' ' ')"
stamp "tests"
if [ "${SAN:-0}" = 1 ]; then
  SAN_TIMEOUT=${SAN_TIMEOUT:-60} sanitize_gpu_test "$R/san" wgmma \
    "${SAN_FILTER:-KernelsAttention.SequenceResultDoesNotDependOnPacking:*ModelGpu*hd*}" \
    memcheck initcheck
  stamp "sanitizers"
fi
