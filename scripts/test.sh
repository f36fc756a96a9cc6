#!/usr/bin/env bash
# The test command (README, .ci/run): install packages, check formatting, build the CPU code and
# run every non-GPU test, then compile every CUDA file (when nvcc is present) and run the
# ASan/UBSan suite. GPU tests run on the GPU machine through scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${FERRY_JOBS:-$(nproc)}"

scripts/setup.sh

echo "== format check"
scripts/check_format.sh

echo "== cpu-debug build + tests"
cmake --preset cpu-debug >/dev/null
cmake --build --preset cpu-debug -j "$JOBS"
ctest --preset cpu-debug -j "$JOBS"

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  echo "== cuda-ci: compile every CUDA file, GPU tests and benchmarks (nothing launched)"
  cmake --preset cuda-ci >/dev/null
  cmake --build --preset cuda-ci -j "$JOBS"
  ctest --test-dir build/cuda-ci -L gpu -j "$JOBS" --output-on-failure  # each GPU test skips
else
  echo "== cuda-ci: SKIPPED (no nvcc on this machine)"
fi

echo "== cpu-asan build + tests (ASan + UBSan)"
cmake --preset cpu-asan >/dev/null
cmake --build --preset cpu-asan -j "$JOBS"
ctest --preset cpu-asan -j "$JOBS"

scripts/run_fuzzers.sh
