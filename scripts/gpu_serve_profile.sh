#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_serve_profile.sh
# Where a serve decode step's GPU time goes, per kernel: builds ferry (Release, CUDA, sm_90) and
# runs `ferry bench serve` on a small geometry under Nsight Compute with one metric
# (gpu__time_duration.sum; --clock-control none), then sums the durations per kernel name.
# ncu serializes kernels, so the table says what each kernel costs, not the step's wall time
# (launch gaps and host syncs are not in it): compare its total per decode token with the
# bench's decode ms/token from the same process to see the part that is not kernel time.
# Env: PROF_GEOM (default qwen3-30b-a3b-2l), PROF_MODES (default resident), PROF_DTYPE (bf16),
# PROF_PROMPT (16), PROF_DECODE (32), PROF_EXTRA (more bench flags), FERRY_GPU_BUILD.
# Files in $OUT: build.log, ncu.csv, kernels.txt (per kernel: launches, total us, mean us,
# share), bench.txt (the bench's own output under ncu, its tok/s are not meaningful).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_serve_profile}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu-serve}
{
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF \
    -DFERRY_BUILD_ROUTE=OFF
  cmake --build "$B" -j16 --target ferry
} >"$OUT/build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
  exit 1
}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
# shellcheck disable=SC2086
timeout "${PROF_TIMEOUT:-300}" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
  --csv --print-units base --log-file "$OUT/ncu.csv" \
  "$B/apps/ferry/ferry" bench serve --device cuda --geometry "${PROF_GEOM:-qwen3-30b-a3b-2l}" \
  --modes "${PROF_MODES:-resident}" --expert-dtype "${PROF_DTYPE:-bf16}" \
  --prompt-tokens "${PROF_PROMPT:-16}" --decode-tokens "${PROF_DECODE:-32}" ${PROF_EXTRA:-} \
  >"$OUT/bench.txt" 2>&1 || echo "profiled bench exited $?"
python3 - "$OUT/ncu.csv" "${PROF_DECODE:-32}" >"$OUT/kernels.txt" <<'PY'
import csv, sys, collections
path, decode = sys.argv[1], int(sys.argv[2])
rows = []
with open(path) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        rows.append((r["Kernel Name"][:90], float(r["Metric Value"].replace(",", "")) / 1e3))
agg = collections.defaultdict(lambda: [0, 0.0])
for name, us in rows:
    agg[name][0] += 1
    agg[name][1] += us
total = sum(v[1] for v in agg.values())
print(f"{len(rows)} kernel launches, {total:.1f} us in total ({total / max(decode, 1):.1f} us per decode token if all were decode)")
print(f"{'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}  kernel")
for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:8d} {us:10.1f} {us / n:9.2f} {100 * us / max(total, 1e-9):5.1f}%  {name}")
PY
head -40 "$OUT/kernels.txt"
