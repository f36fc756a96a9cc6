# Sourced by the GPU scripts (scripts/gpu_quick_check.sh, scripts/gpu_min_check.sh).
# sanitize_gpu_test LOG_PREFIX KERNEL_SUBSTRING GTEST_FILTER TOOL...: compute-sanitizer TOOL on
# $B/tests/gpu_test (B: the caller's build folder) with the GTEST_FILTER tests, checking only the
# kernels whose name contains KERNEL_SUBSTRING (initcheck then also flags inputs that unchecked
# kernels wrote), each within SAN_TIMEOUT seconds (default 150); the log of each tool is
# LOG_PREFIX_TOOL.log, its summary line printed. Variables set on the call (e.g.
# FERRY_ATTN_FWD_MT=1 sanitize_gpu_test ...) reach the test binary.
sanitize_gpu_test() {
  local prefix=$1 kns=$2 filter=$3 tool cs=compute-sanitizer
  shift 3
  command -v $cs >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
  for tool in "$@"; do
    timeout "${SAN_TIMEOUT:-150}" $cs --tool "$tool" --kernel-name "kns=$kns" --error-exitcode 9 \
      "$B/tests/gpu_test" --gtest_filter="$filter" >"${prefix}_$tool.log" 2>&1
    echo "$tool ($kns) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "${prefix}_$tool.log" | tail -2 | tr '\n' ' ')"
  done
}
