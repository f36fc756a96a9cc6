#!/usr/bin/env bash
# The test command (README, .ci/run): install packages, check formatting, build and run every
# non-GPU test under ASan + UBSan, compile every CUDA file, then a short fuzzing run.
#   - with nvcc (CI has /usr/local/cuda, no GPU): one Debug build, host code instrumented with
#     ASan + UBSan, CUDA on: it compiles every .cu file, the GPU tests and the benchmarks; all
#     non-GPU tests run in it and the GPU tests report that they skipped. Without nvcc the same
#     runs as a CPU-only build (cpu-ci) and says CUDA was skipped. One build instead of a plain
#     and a sanitizer build keeps CI (2 cores) well inside its time.
#   - GPU tests run on a GPU machine through scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${FERRY_JOBS:-$(nproc)}"
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start ))s] $*"; }

scripts/setup.sh

stamp "format check"
scripts/check_format.sh

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  PRESET=cuda-ci
else
  PRESET=cpu-ci
  stamp "no nvcc on this machine: CUDA compilation SKIPPED"
fi
stamp "$PRESET: build (CPU code under ASan/UBSan, every CUDA file, tests, benchmarks)"
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j "$JOBS"
stamp "$PRESET: tests"
ctest --preset "$PRESET" -j "$JOBS"
stamp "gpu tests (each reports SKIPPED without a device)"
ctest --test-dir "build/$PRESET" -L gpu -j "$JOBS" --output-on-failure

stamp "fuzzers"
scripts/run_fuzzers.sh
stamp "all passed"
