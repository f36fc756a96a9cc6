#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried, in one device call:
#   bash scripts/gpu_quick_check.sh          (files under $OUT/r, packed as $OUT/all.tgz)
# A short check for code compiled but not yet run on a GPU: builds gpu_test and
# cuda_kernels_bench (Release, sm_90), runs the gpu tests of TEST_FILTER (and the attention tests
# again with FERRY_ATTN_FWD_MT=1), benches AttnFwdBwd with the default forward and with each
# FERRY_ATTN_FWD_LAZY value of LAZY (default "0 1": the eager forward, lazy with 32-key tiles) against torch SDPA on the same shapes
# (tools/bench/torch_baselines.py, compare.py: cmp_*.txt), then the gpu tests of LATE_FILTER.
# BENCH=0 skips the benches (tests only). BENCH_ENVS="A=1,B=0 C=1": benches again under each set.
# PLAN_CAPS="24 40" also builds ferry and runs `ferry plan --compare` (solved plan and fixed
# policies, largest batch each) for PLAN_GEOMS (default "qwen2.5-3b qwen2.5-7b") at those GPU caps
# (GB), with ModelCompute's scratch overlay (default) and without (FERRY_SCRATCH_OVERLAY=0):
# plan_<geom>_overlay{1,0}.json + .txt.
# FLAKE=1: a repeat check (the former "atomic-dQ flake", the tests' uploads racing their kernels,
# fixed in session 29): KernelsAttention.ForwardBackwardWithinTwiceNaiveBf16 with
# FERRY_ATTN_FWD_MT=1 FLAKE_REPEAT times (10), then under compute-sanitizer racecheck and initcheck
# (attention kernels only): flake_*.log.
# NCU=1: Nsight Compute on the attention kernels of one AttnFwdBwd row (ncu.txt, ncu_details.csv,
# ncu.ncu-rep); NCU_ROW picks the row.
# SAN_WGMMA=1: compute-sanitizer memcheck and initcheck on the warpgroup-MMA attention kernels.
# RESET_PATHS: paths restored to HEAD in this copy first (someone else's unfinished work in the
# working tree that the device's copy must not build).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${RESET_PATHS:-}" ]; then
  git checkout -q -- $RESET_PATHS 2>/dev/null
  git clean -fdq $RESET_PATHS 2>/dev/null
fi
source scripts/device_env.sh
source scripts/lib/gpu_sanitize.sh
B=${FERRY_GPU_BUILD:-build/gpu}
R=${OUT:-/tmp/ferry_quick}/r
mkdir -p "$R"
TEST_FILTER=${TEST_FILTER:-'KernelsAttention.*:*ModelGpu*'}
LATE_FILTER=${LATE_FILTER:-}
LAZY=${LAZY:-"0 1"}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv >"$R/gpu.txt"
git status --short >"$R/gitstatus.txt"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON -DFERRY_BUILD_ROUTE=OFF >"$R/build.log" 2>&1
TARGETS="gpu_test cuda_kernels_bench"
[ -n "${PLAN_CAPS:-}" ] && TARGETS="$TARGETS ferry"
if ! cmake --build "$B" -j16 --target $TARGETS >>"$R/build.log" 2>&1; then
  grep -E "error|FAILED" "$R/build.log" | head -30
  stamp "BUILD FAILED"
  cd "$R/.." && tar czf all.tgz r
  exit 1
fi
stamp "built"
status=0
timeout "${TEST_TIMEOUT:-150}" "$B/tests/gpu_test" --gtest_filter="$TEST_FILTER" >"$R/test.log" 2>&1 || status=1
FERRY_ATTN_FWD_MT=1 timeout 40 "$B/tests/gpu_test" --gtest_filter='KernelsAttention.*' \
  >"$R/test_mt.log" 2>&1 || status=1
grep -E "FAILED|PASSED|Failure" "$R/test.log" "$R/test_mt.log" | head -30
stamp "tests (status $status)"
PY=python3
$PY -c "import torch" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
[ "${BENCH:-1}" = 0 ] && LAZY=""
[ "${BENCH:-1}" != 0 ] && timeout 70 "$B/bench/cuda_kernels_bench" --benchmark_filter='AttnFwdBwd' \
  --benchmark_out="$R/ferry_bench.json" --benchmark_out_format=json >"$R/bench.log" 2>&1
# BENCH_ENVS="VAR=VALUE[,VAR=VALUE] ...": the AttnFwdBwd bench again under each (comma-joined)
# set of assignments (ferry_bench_VAR_VALUE[-VAR_VALUE].json).
for ev in ${BENCH_ENVS:-}; do
  [ "${BENCH:-1}" = 0 ] && break
  env $(echo "$ev" | tr ',' ' ') timeout 70 "$B/bench/cuda_kernels_bench" --benchmark_filter='AttnFwdBwd' \
    --benchmark_out="$R/ferry_bench_$(echo "$ev" | tr '=,' '_-').json" --benchmark_out_format=json \
    >>"$R/bench.log" 2>&1
done
for l in $LAZY; do
  FERRY_ATTN_FWD_LAZY=$l timeout 70 "$B/bench/cuda_kernels_bench" --benchmark_filter='AttnFwdBwd' \
    --benchmark_out="$R/ferry_bench_lazy$l.json" --benchmark_out_format=json >>"$R/bench.log" 2>&1
done
[ "${BENCH:-1}" != 0 ] && timeout 100 $PY tools/bench/torch_baselines.py --out "$R/torch_bench.json" \
  >>"$R/bench.log" 2>&1
for f in "$R"/ferry_bench*.json; do
  [ -f "$f" ] || continue
  n=$(basename "$f" .json)
  $PY tools/bench/compare.py "$f" "$R/torch_bench.json" --out "$R/cmp_$n.json" >"$R/cmp_$n.txt" 2>&1
done
grep -i attn "$R"/cmp_*.txt | head -40
stamp "benches"
if [ -n "${PLAN_CAPS:-}" ]; then
  caps=$(echo "$PLAN_CAPS" | tr ' ' ',')
  for geom in ${PLAN_GEOMS:-qwen2.5-3b qwen2.5-7b}; do
    for ov in 1 0; do
      FERRY_SCRATCH_OVERLAY=$ov timeout 120 "$B/apps/ferry/ferry" plan --geometry "$geom" --compare \
        --gpu-caps "$caps" --seq-len 1024 --host-mem-gb 125 --json "$R/plan_${geom}_overlay$ov.json" \
        >"$R/plan_${geom}_overlay$ov.txt" 2>&1 || echo "ferry plan $geom overlay $ov: exit $?"
    done
  done
  stamp "plans"
fi
if [ "${NCU:-0}" = 1 ]; then
  # Nsight Compute on the attention kernels of one fwd + bwd row (NCU_ROW, default 2048 x 4, 16/2,
  # D 128, with the workspace): the first launch of each kernel after a warm-up, the sections
  # that say what bounds it (tensor pipe, shared-memory wavefronts, warp stalls, occupancy).
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute*/ncu 2>/dev/null | head -1)
  if [ -z "$NCU_BIN" ]; then
    echo "ncu: not found" | tee "$R/ncu.txt"
  else
    row=${NCU_ROW:-'BM_AttnFwdBwd/2048/4/16/2/128/0'}
    timeout "${NCU_TIMEOUT:-200}" "$NCU_BIN" --kernel-name regex:attention --launch-skip 8 \
      --launch-count "${NCU_COUNT:-8}" --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section SchedulerStats --section LaunchStats --metrics \
      sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_pipe_tensor.sum \
      -o "$R/ncu" -f "$B/bench/cuda_kernels_bench" --benchmark_filter="^$row/" \
      --benchmark_min_time=0.05 >"$R/ncu_run.log" 2>&1
    "$NCU_BIN" --import "$R/ncu.ncu-rep" --page details --csv >"$R/ncu_details.csv" 2>>"$R/ncu_run.log"
    "$NCU_BIN" --import "$R/ncu.ncu-rep" --page details >"$R/ncu.txt" 2>>"$R/ncu_run.log"
    grep -E "attention_|Duration|Compute \(SM\) Throughput|Memory Throughput|Tensor|Shared|Stall|Registers|Achieved Occupancy" "$R/ncu.txt" | head -80
  fi
  stamp "ncu"
fi
if [ "${FLAKE:-0}" = 1 ]; then
  # Repeats (docs/cuda.md, "Session 29: the cause was the tests"), then racecheck / initcheck on the
  # attention backward kernels only (the rest of the test runs unchecked).
  t=KernelsAttention.ForwardBackwardWithinTwiceNaiveBf16
  FERRY_ATTN_FWD_MT=1 timeout "${FLAKE_TIMEOUT:-150}" "$B/tests/gpu_test" --gtest_filter=$t \
    --gtest_repeat="${FLAKE_REPEAT:-10}" >"$R/flake_repeat.log" 2>&1 || status=1
  echo "flake repeat: $(grep -c '^\[       OK' "$R/flake_repeat.log") ok, $(grep -c '^\[  FAILED  \] Kernels' "$R/flake_repeat.log") failed"
  FERRY_ATTN_FWD_MT=1 sanitize_gpu_test "$R/flake" attention "$t" racecheck initcheck
  stamp "flake"
fi
if [ "${SAN_WGMMA:-0}" = 1 ]; then
  # compute-sanitizer memcheck and initcheck on the warpgroup-MMA attention kernels (the rest of
  # the attention tests runs unchecked): san_wgmma_*.log.
  sanitize_gpu_test "$R/san_wgmma" wgmma \
    'KernelsAttention.ForwardBackwardWithinTwiceNaiveBf16:KernelsAttention.SequenceResultDoesNotDependOnPacking' \
    memcheck initcheck
  stamp "wgmma sanitizers"
fi
if [ -n "$LATE_FILTER" ]; then
  timeout "${LATE_TIMEOUT:-120}" "$B/tests/gpu_test" --gtest_filter="$LATE_FILTER" >"$R/test_late.log" 2>&1 || status=1
  grep -E "FAILED|PASSED" "$R/test_late.log" | head
  stamp "late tests"
fi
cd "$R/.." && tar czf all.tgz r
exit $status
