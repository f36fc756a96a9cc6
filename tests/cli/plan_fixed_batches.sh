#!/usr/bin/env bash
# The planner's batch search reaches every fixed policy's largest batch (docs/plan.md, "The step as
# windows"): at a binding GPU cap (6 MiB), ferry plan --batch-size auto (its executor fit on the CPU
# backend) reports a largest fitting batch no smaller than the largest batch `ferry bench train
# --batch-size auto` fits for each of the executor's fixed policies (every:4, device, host) under
# the same cap, and its plan at the host policy's batch fits the executor with ferry plan's bytes.
# Why: the planner pinned boundary 0 (the embedding's output) to the GPU for the whole step while
# the executor's host policy homes it in host memory, so the plan fitted one batch less than the
# host policy ran (H200, 3B at 24 GiB: 39 where host ran 40, session 18).
# ctest-cost: 15 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"

source "$ROOT/tests/cli/lib/bench_model_dir.sh"
bench_model_dir "$TMP/m"
optim=(--master bf16-kahan --optimizer-states 8bit)
cap_mib=6
cap_gb=$(python3 -c "print($cap_mib * 1048576 / 1e9)")
plan=(plan --model "$TMP/m" --seq-len 64 --host-mem-gb 8 --time-limit-s 5 --executor-device cpu
      --max-batch 64 --gpu-mem-gb "$cap_gb" --resident-layers 0 --no-policies "${optim[@]}")
bench=(bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 64
       --seq-len 64 --steps 1 --warmup 0 --max-batch 64 --device-budget-mib "$cap_mib"
       "${optim[@]}")

"$FERRY" "${plan[@]}" --batch-size auto --json "$TMP/auto.json" > /dev/null 2> "$TMP/auto.log" ||
  { echo "plan_fixed_batches: ferry plan failed"; cat "$TMP/auto.log"; exit 1; }
largest=$(sed -n 's/.*batch=auto -> [0-9]* (largest fitting \([0-9]*\);.*/\1/p' "$TMP/auto.log")
[ -n "$largest" ] || { echo "plan_fixed_batches: no 'largest fitting' in the log"; cat "$TMP/auto.log"; exit 1; }
"$FERRY" "${bench[@]}" --batch-size auto --policies every:4,device,host --json "$TMP/fixed.json" \
  > "$TMP/fixed.out" 2>&1 || { echo "plan_fixed_batches: bench failed"; cat "$TMP/fixed.out"; exit 1; }
host_batch=$(python3 - "$TMP/fixed.json" "$largest" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
largest = int(sys.argv[2])
fits = {p["policy"]: p["largest_fitting_batch"] for p in rep["policies"]}
assert set(fits) == {"every:4", "device", "host"} and all(v and v > 0 for v in fits.values()), fits
# The cap binds below --max-batch for every policy, or the check says nothing.
assert max(fits.values()) < 64, fits
for name, b in fits.items():
    assert largest >= b, f"ferry plan fits batch {largest} at most, the executor's {name} policy {b}"
print(f"plan_fixed_batches: ferry plan fits batch {largest}; the executor's fixed policies "
      + ", ".join(f"{k} {v}" for k, v in sorted(fits.items())), file=sys.stderr)
print(fits["host"])
PY
)
# The plan at the host policy's largest batch fits the executor, with the bytes ferry plan counts.
"$FERRY" "${plan[@]}" --batch-size "$host_batch" --json "$TMP/hb.json" > /dev/null 2> "$TMP/hb.log" ||
  { echo "plan_fixed_batches: ferry plan at batch $host_batch failed"; cat "$TMP/hb.log"; exit 1; }
want=$(sed -n 's/.*executor gpu bytes \([0-9]*\) for the plan at batch.*/\1/p' "$TMP/hb.log" | tail -1)
"$FERRY" "${bench[@]}" --batch-size "$host_batch" --policies "plan=$TMP/hb.json" \
  --json "$TMP/bhb.json" > "$TMP/bhb.out" 2>&1 ||
  { echo "plan_fixed_batches: bench of the plan failed"; cat "$TMP/bhb.out"; exit 1; }
python3 - "$TMP/bhb.json" "$want" "$cap_mib" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert "error" not in p, p
assert p["device_planned_bytes"] == int(sys.argv[2]), (p["device_planned_bytes"], sys.argv[2])
assert p["device_planned_bytes"] <= int(sys.argv[3]) << 20, p
print(f"plan_fixed_batches: the plan at batch {p['batch_size']} runs in {p['device_planned_bytes']} "
      f"bytes, ferry plan's count")
PY
