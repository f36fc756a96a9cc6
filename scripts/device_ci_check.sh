#!/usr/bin/env bash
# Run THERE (the GPU machine, 16 cores), carrying .debs: the CI configuration built and tested
# with more cores than CI has — the cuda-ci Debug + ASan/UBSan build (every .cu for sm_86/89/90,
# all non-GPU tests at CI's -j2 (FERRY_CHECK_JOBS) so their time says what CI will spend, then the GPU tests on the
# real device) — and, on request, the RelWithDebInfo cpu-asan suite. ferry route is left out
# there (its OpenCV/xgboost packages are not carried); it is covered by CI itself.
#   bash scripts/device_ci_check.sh [cuda|asan|all]     (default: cuda)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_ci_check}
mkdir -p "$OUT"
source scripts/device_env.sh
what=${1:-cuda}
# The CUDA driver maps memory where ASan keeps its shadow gap; without this, the GPU tests of the
# sanitized build abort at the first CUDA call on a machine with a driver (CI has none).
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0}
rc=0
if [ "$what" = cuda ] || [ "$what" = all ]; then
  cmake --preset cuda-ci -DFERRY_BUILD_ROUTE=OFF -DCMAKE_CXX_COMPILER_LAUNCHER= \
    -DCMAKE_CUDA_COMPILER_LAUNCHER= >"$OUT/cuda_build.log" 2>&1 &&
    cmake --build --preset cuda-ci -j16 >>"$OUT/cuda_build.log" 2>&1 || { echo "cuda-ci BUILD FAILED"; grep -E "error|FAILED" "$OUT/cuda_build.log" | head -20; rc=1; }
  if [ $rc -eq 0 ]; then
    t0=$(date +%s)
    ctest --preset cuda-ci -j"${FERRY_CHECK_JOBS:-2}" >"$OUT/cuda_ctest.log" 2>&1 || rc=1
    echo "non-GPU tests at -j${FERRY_CHECK_JOBS:-2}: $(( $(date +%s) - t0 )) s"
    ctest --test-dir build/cuda-ci -L gpu --output-on-failure >>"$OUT/cuda_ctest.log" 2>&1 || rc=1
    grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/cuda_ctest.log" | head -30
  fi
fi
if [ "$what" = asan ] || [ "$what" = all ]; then
  cmake --preset cpu-asan -DFERRY_BUILD_ROUTE=OFF -DCMAKE_CXX_COMPILER_LAUNCHER= \
    >"$OUT/asan_build.log" 2>&1 &&
    cmake --build --preset cpu-asan -j16 >>"$OUT/asan_build.log" 2>&1 || { echo "cpu-asan BUILD FAILED"; grep -E "error|FAILED" "$OUT/asan_build.log" | head -20; rc=1; }
  ctest --preset cpu-asan -j12 >"$OUT/asan_ctest.log" 2>&1 || rc=1
  grep -E "tests passed|tests failed|Failed|\*\*\*|ERROR: AddressSanitizer|runtime error" "$OUT/asan_ctest.log" | head -30
fi
exit $rc
