#!/usr/bin/env bash
# Run THERE (the GPU machine) after a build (scripts/gpu_train_check.sh builds build/gpu), for
# issue #7's benchmark: at each GPU-memory cap, the solved plan against the fixed policies, each
# at the largest batch that fits the cap, measured by the streaming executor at full depth.
#   CAPS="24 40 80" GEOMS="qwen2.5-3b qwen2.5-7b" bash scripts/gpu_plan_caps.sh
# Per (geometry, cap): `ferry plan --batch-size auto --gpu-mem-gb CAP` writes the plan, then
# `ferry bench train --batch-size auto --device-budget-mib CAP*1024 --policies
# every:4,device,host,plan=PLAN` runs every policy at its largest fitting batch (the plan at the
# batch it was solved for) and reports TFLOPS, tokens/s, the batch, and the plan's predicted step
# next to the measured one. The bench model has the geometry's layer shapes with the built-in
# 259-token vocabulary (the plan is solved for the real vocabulary: its globals are larger).
# Extra flags: PLAN_EXTRA (ferry plan), BENCH_EXTRA (ferry bench train; default 8-bit states,
# bf16-kahan masters, 1 warm-up + 2 timed steps). Output: $OUT/plan_caps.jsonl (one line per
# geometry and cap: {"geometry", "cap_gb", "plan": <ferry plan JSON>, "bench": <report>}) and a
# table on stdout. Each 7B cap takes a few minutes: split CAPS / GEOMS over calls.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/ferry_plan_caps}
mkdir -p "$OUT"
FERRY=${FERRY_GPU_BUILD:-build/gpu}/apps/ferry/ferry
PLAN_EXTRA=${PLAN_EXTRA:---host-mem-gb 120 --master bf16-kahan --optimizer-states 8bit --time-limit-s 20}
BENCH_EXTRA=${BENCH_EXTRA:---optimizer-states 8bit --master bf16-kahan --steps 2 --warmup 1 --max-batch 128}
declare -A SHAPE=(
  [qwen2.5-3b]="--layers 36 --hidden 2048 --heads 16 --kv-heads 2 --head-dim 128 --intermediate 11008"
  [qwen2.5-7b]="--layers 28 --hidden 3584 --heads 28 --kv-heads 4 --head-dim 128 --intermediate 18944"
)
for g in ${GEOMS:-qwen2.5-3b qwen2.5-7b}; do
  for cap in ${CAPS:-24 40 80}; do
    plan="$OUT/plan_${g}_${cap}.json"
    rep="/tmp/plan_caps_bench.json"
    rm -f "$rep"
    if ! "$FERRY" plan --geometry "$g" --seq-len 1024 --batch-size auto --gpu-mem-gb "$cap" \
      $PLAN_EXTRA --json "$plan" >"$OUT/plan_${g}_${cap}.log" 2>&1; then
      echo "[$g ${cap} GB] ferry plan failed:"; tail -3 "$OUT/plan_${g}_${cap}.log"; continue
    fi
    timeout "${BENCH_TIMEOUT:-500}" "$FERRY" bench train --device cuda ${SHAPE[$g]} --seq-len 1024 \
      --batch-size auto --device-budget-mib $((cap * 1024)) \
      --policies "every:4,device,host,plan=$plan" $BENCH_EXTRA --json "$rep" \
      >"$OUT/bench_${g}_${cap}.log" 2>&1 || { echo "[$g ${cap} GB] bench failed:"; tail -3 "$OUT/bench_${g}_${cap}.log"; }
    python3 - "$g" "$cap" "$plan" "$rep" "$OUT/plan_caps.jsonl" <<'PY'
import json, sys
g, cap, plan, rep, out = sys.argv[1:6]
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"error": str(e)}
P, B = load(plan), load(rep)
with open(out, "a") as o:
    o.write(json.dumps({"geometry": g, "cap_gb": int(cap), "plan": P, "bench": B}) + "\n")
print(f"[{g} {cap} GB] plan: batch {P.get('batch_size')}, predicted step "
      f"{P.get('predicted', {}).get('step_ms', float('nan')):.0f} ms")
for p in B.get("policies", []):
    if "error" in p:
        print(f"  {p['policy'][:12]:>12}: {p['error']}"); continue
    pred = p.get("predicted_step_ms")
    err = f", predicted {pred:.0f} ms ({100 * (pred / p['step_ms_mean'] - 1):+.1f} %)" if pred else ""
    print(f"  {p['policy'][:12]:>12}: batch {p['batch_size']}, {p['tokens_per_s']:.0f} tok/s, "
          f"{p['model_tflops']:.1f} TFLOPS, step {p['step_ms_mean']:.0f} ms{err}, device peak "
          f"{p['device_peak_bytes'] / 2**30:.1f} GiB")
PY
  done
done
