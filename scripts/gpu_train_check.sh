#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_train_check.sh
# The streaming trainer on the GPU in one call: builds gpu_test and ferry (Release, CUDA, sm_90),
# runs the GPU tests (default filter: the stream executor's; FERRY_GPU_FILTER to change),
# compute-sanitizer memcheck over the executor's GPU-vs-CPU test, then `ferry bench train` on the
# GPU and the PyTorch baseline (tools/bench/train_torch_baseline.py) on the same geometry, and a
# ratio summary. Geometry: FERRY_BENCH_GEOM (ferry bench train flags; default: Qwen2.5-3B layer
# shapes, 8 layers, vocab 259). Files in $OUT: build.log gpu_test.log memcheck.log
# bench_train.json torch_train.json summary.log (+ bench_train_extra.jsonl with
# FERRY_BENCH_EXTRA, train_cuda.log: `ferry train --device cuda --plan auto` on the embedded task).
# Exit status: non-zero when the build or the tests fail (the benchmark still runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_train}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu}
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
    -DFERRY_BUILD_ROUTE=OFF
  cmake --build "$B" -j16 --target gpu_test ferry
} >"$OUT/build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60
  exit 1
}
echo "build ok"
GT="$B/tests/gpu_test"
FERRY="$B/apps/ferry/ferry"
FILTER=${FERRY_GPU_FILTER:-TrainStreamGpu.*}
timeout 300 "$GT" --gtest_filter="$FILTER" >"$OUT/gpu_test.log" 2>&1 || status=1
grep -E "^\[  PASSED|^\[  FAILED|^\[  SKIPPED|^\[       OK|train_stream_gpu|Failure|Expected|Which is|error" \
  "$OUT/gpu_test.log" | head -80
MEMCHECK=${FERRY_MEMCHECK_FILTER:-TrainStreamGpu.DenseGradients*:TrainStreamGpu.DenseEvery*}
if command -v compute-sanitizer >/dev/null 2>&1; then
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$GT" \
    --gtest_filter="$MEMCHECK" >"$OUT/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -5
fi

# FERRY_SKIP_BENCH=1: build, tests and memcheck only (benches then go through gpu_train_sweep.sh).
if [ -n "${FERRY_SKIP_BENCH:-}" ]; then exit $status; fi
GEOM=${FERRY_BENCH_GEOM:---layers 8 --hidden 2048 --heads 16 --kv-heads 2 --head-dim 128 --intermediate 11008}
RUN=${FERRY_BENCH_RUN:---batch-size 4 --seq-len 1024 --steps 4 --warmup 1}
POL=${FERRY_BENCH_POLICIES:-device,every:4,host}
timeout 400 "$FERRY" bench train --device cuda $GEOM $RUN --policies "$POL" \
  --json "$OUT/bench_train.json" >"$OUT/summary.log" 2>&1 || echo "bench train failed (see summary.log)"
# More benches (e.g. f32 GEMMs for the before/after ratio, 8-bit states, larger batches):
# FERRY_BENCH_EXTRA holds ';'-separated flag sets; their reports go to bench_train_extra.jsonl,
# one JSON document per line, in order.
if [ -n "${FERRY_BENCH_EXTRA:-}" ]; then
  : >"$OUT/bench_train_extra.jsonl"
  IFS=';' read -ra EXTRAS <<<"$FERRY_BENCH_EXTRA"
  for extra in "${EXTRAS[@]}"; do
    timeout 400 "$FERRY" bench train --device cuda $GEOM $extra --json /tmp/ferry_extra.json \
      >>"$OUT/summary.log" 2>&1 || echo "extra bench failed: $extra"
    [ -f /tmp/ferry_extra.json ] && { tr -d '\n' </tmp/ferry_extra.json; echo; } \
      >>"$OUT/bench_train_extra.jsonl" && rm -f /tmp/ferry_extra.json
  done
fi
# The CLI end to end on the GPU: the embedded task, a plan solved for a budget, windows reported.
timeout 120 "$FERRY" train --device cuda --plan auto --device-budget-mib 2000 --max-steps 40 \
  --eval-every 0 --output-dir /tmp/ferry_train_cuda --log-every 10 >"$OUT/train_cuda.log" 2>&1 ||
  echo "ferry train --device cuda failed (train_cuda.log)"
{ grep -E "executor|step +(10|20|30|40)/" "$OUT/train_cuda.log"; tail -28 "$OUT/train_cuda.log"; } \
  >>"$OUT/summary.log"
cat "$OUT/summary.log"
PY=python3
$PY -c "import transformers" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
# Same flags, torch spelling.
TG=$(echo "$GEOM $RUN" | sed 's/--batch-size/--batch/; s/--seq-len/--seq/; s/--optimizer-states [a-z0-9]*//')
timeout 300 $PY tools/bench/train_torch_baseline.py $TG --out "$OUT/torch_train.json" \
  >>"$OUT/summary.log" 2>&1 || echo "torch baseline failed (see summary.log)"
$PY - "$OUT/bench_train.json" "$OUT/torch_train.json" <<'PYEOF' | tee -a "$OUT/summary.log"
import json, sys
try:
    f = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
except Exception as e:
    print("no ratio:", e); sys.exit(0)
print(f"torch resident bf16: {t['tokens_per_s']:.0f} tok/s, {t['model_tflops']:.1f} TFLOPS, "
      f"peak {t['peak_gpu_bytes']/2**30:.1f} GiB")
for p in f["policies"]:
    if "error" in p:
        print(p["policy"], "error", p["error"]); continue
    print(f"ferry {p['policy']:>12}: {p['tokens_per_s']:.0f} tok/s = "
          f"{p['tokens_per_s']/t['tokens_per_s']:.3f}x torch | exposed {p['exposed_ms_per_step']:.1f}"
          f" ms/step of {p['step_ms_mean']:.1f} | device peak {p['device_peak_bytes']/2**30:.2f} GiB")
PYEOF
exit $status
