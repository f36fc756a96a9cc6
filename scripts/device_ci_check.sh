#!/usr/bin/env bash
# Run THERE (the GPU machine, 16 cores), carrying .debs: the CI configurations built and tested
# with more cores than CI has — the cuda-ci Debug build (every .cu for sm_86/89/90, all non-GPU
# tests, then the GPU tests on the real device) and the ASan/UBSan suite. ferry route is left
# out there (its OpenCV/xgboost packages are not carried); it is covered by CI itself.
#   bash scripts/device_ci_check.sh [cuda|asan|all]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_ci_check}
mkdir -p "$OUT"
source scripts/device_env.sh
what=${1:-all}
rc=0
if [ "$what" = cuda ] || [ "$what" = all ]; then
  cmake --preset cuda-ci -DFERRY_BUILD_ROUTE=OFF -DCMAKE_CXX_COMPILER_LAUNCHER= \
    -DCMAKE_CUDA_COMPILER_LAUNCHER= >"$OUT/cuda_build.log" 2>&1 &&
    cmake --build --preset cuda-ci -j16 >>"$OUT/cuda_build.log" 2>&1 || { echo "cuda-ci BUILD FAILED"; grep -E "error|FAILED" "$OUT/cuda_build.log" | head -20; rc=1; }
  if [ $rc -eq 0 ]; then
    ctest --preset cuda-ci -j12 >"$OUT/cuda_ctest.log" 2>&1 || rc=1
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
