#!/usr/bin/env bash
# The test command (README, .ci/run): install packages, check formatting, build and run every
# non-GPU test under ASan + UBSan, compile every CUDA file, then a short fuzzing run.
#   - with nvcc (CI has /usr/local/cuda, no GPU): one Debug build, host code instrumented with
#     ASan + UBSan, CUDA on: it compiles every .cu file, the GPU tests and the benchmarks; all
#     non-GPU tests run in it and the GPU tests report that they skipped. Without nvcc the same
#     runs as a CPU-only build (cpu-ci) and says CUDA was skipped. One build instead of a plain
#     and a sanitizer build keeps CI (2 cores) well inside its time. The CI presets' host code
#     has line tables only (-g1: all a sanitizer report or a backtrace needs), which measured
#     8-12 % less compile time per file than -g and much smaller binaries.
#   - GPU tests run on a GPU machine through scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${FERRY_JOBS:-$(nproc)}"
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start ))s] $*"; }

scripts/setup.sh

stamp "format check"
scripts/check_format.sh

stamp "fuzzers"
scripts/run_fuzzers.sh

if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  PRESET=cuda-ci
else
  PRESET=cpu-ci
  stamp "no nvcc on this machine: CUDA compilation SKIPPED"
fi
stamp "$PRESET: build (CPU code under ASan/UBSan, every CUDA file, tests, benchmarks)"
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j "$JOBS"
log_dir="build/$PRESET/test-logs"
mkdir -p "$log_dir"
# Failures are remembered, not fatal here: the closing count below is printed either way.
rc=0
gpu_test="build/$PRESET/tests/gpu_test"
gpu_log_kind=ctest
if nvidia-smi -L >/dev/null 2>&1 || [ ! -x "$gpu_test" ]; then
  stamp "gpu tests (ctest -L gpu)"
  ctest --test-dir "build/$PRESET" -L gpu -j "$JOBS" --output-on-failure 2>&1 | tee "$log_dir/gpu.log" || rc=1
else
  # No device: every GPU test skips, saying so. One gpu_test process lists them all (~1 s) where
  # ctest would start the 150 MB sanitizer binary once per test (~2.5 s each, 55+ tests).
  stamp "gpu tests: no GPU, gpu_test runs once and each test reports SKIPPED"
  gpu_log_kind=gtest
  LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp" "$gpu_test" 2>&1 | tee "$log_dir/gpu.log" || rc=1
fi

stamp "$PRESET: tests"
# set -o pipefail makes a failing ctest fail the pipeline through the tee.
ctest --preset "$PRESET" -j "$JOBS" 2>&1 | tee "$log_dir/cpu.log" || rc=1

# One closing line over both runs, counted from ctest's own summaries (the CI reads a test
# runner's closing lines; ours would otherwise end in the fuzzers' output).
count() {  # count FILE -> "total failed skipped"
  local total failed skipped
  total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$1" | tail -n1)
  failed=$(sed -n 's/.* \([0-9]*\) tests failed out of.*/\1/p' "$1" | tail -n1)
  skipped=$(grep -c '(Skipped)' "$1" || true)
  echo "${total:-0} ${failed:-0} ${skipped:-0}"
}
read -r t1 f1 s1 < <(count "$log_dir/cpu.log")
# gpu.log is ctest's (a GPU machine) or one gtest binary's (no GPU): count either.
count_gtest() {  # count_gtest FILE -> "total failed skipped"
  local total failed skipped
  total=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran.*/\1/p' "$1" | tail -n1)
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$1" | tail -n1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$1" | tail -n1)
  echo "${total:-0} ${failed:-0} ${skipped:-0}"
}
if [ "$gpu_log_kind" = gtest ]; then
  read -r t2 f2 s2 < <(count_gtest "$log_dir/gpu.log")
else
  read -r t2 f2 s2 < <(count "$log_dir/gpu.log")
fi
if [ "$t1" -eq 0 ]; then echo "no test ran"; exit 1; fi
if [ "$rc" -eq 0 ]; then stamp "all passed"; else stamp "FAILED (the failing tests are listed above)"; fi
echo "ctest: $(( t1 + t2 - f1 - f2 - s1 - s2 )) passed, $(( f1 + f2 )) failed, $(( s1 + s2 )) skipped"
exit "$rc"
