#!/usr/bin/env bash
# Run THERE (the GPU machine) after a build (scripts/gpu_train_check.sh builds build/gpu), for
# issue #7's benchmark: at each GPU-memory cap (GiB), the solved plan against the fixed policies, each
# at the largest batch that fits the cap, measured by the streaming executor at full depth.
#   CAPS="24 40 80" GEOMS="qwen2.5-3b qwen2.5-7b" bash scripts/gpu_plan_caps.sh
#   (CAPS_qwen2_5_7b="24" GEOMS=...: per-geometry caps; PROFILE_qwen2_5_3b=FILE reuses a
#   measured profile, e.g. bench/plan/results/h200_2026-12-01_s9_profile_qwen2.5-3b_b40.json,
#   instead of the profile run)
# Per geometry, first a profile: `ferry bench train --geometry G --policies device,host` at the
# run batch (no cap), and the device policy again with every layer that fits GPU-resident
# (`--resident-layers auto`: the resident-saving term, PROFILE_RESIDENT=0 skips it), turned into a
# measured cost profile by `ferry plan --from-bench ... --from-bench-resident ...` (per-layer
# forward / backward / recompute, loss window, optimizer, serial part; scaled linearly to other
# batches; and from the host run beside the device run, the measured cost per GB of boundaries
# homed off the GPU, host_home_ms_per_gb: docs/plan.md). Then per cap: `ferry plan --batch-size
# auto --gpu-mem-gb CAP --profile P` writes the plan, and `ferry bench train --batch-size auto --device-budget-mib CAP*1024 --policies
# every:4,device,host,plan=PLAN` runs every policy at its largest fitting batch (at most
# MAX_BATCH: a 7B step at batch 256 takes most of a minute; the largest batch the cap fits is
# reported beside it), the plan at the batch it was solved for, with its predicted step next to
# the measured one. The bench model is the geometry itself (--geometry: shapes, the real
# vocabulary and tying; random weights and token ids).
# The bench models are Qwen2 (--arch qwen2: q/k/v biases, no q/k norm), the architecture ferry
# plan's built-in geometries describe; before session 16 they ran ferry bench's default qwen3
# (per-head q/k norms: more workspace than the plan counted), which a plan now refuses.
# ROUNDS=R (default 1): each cap's bench run R times with the policy order rotated, merged per
# policy (scripts/lib/merge_bench_rounds.py): a host drift during a call lands on every policy
# (session 18: the same host run measured 7 % apart between calls, identical plans 3-12 % apart
# within one).
# Extra flags: PLAN_EXTRA (ferry plan), BENCH_EXTRA (ferry bench train; default 8-bit states,
# bf16-kahan masters, 1 warm-up + 3 timed steps: one-step runs of the same policy spread 6.8 % between calls in session 15). MAX_BATCH per geometry (default 3B 48, 7B 32).
# TAIL: the device optimizer tail of the capped runs, given to ferry plan and to ferry bench train
# alike so that the plan is solved for the tail the bench runs (its layers in the optimizer gate,
# its staging in GPU memory), e.g. TAIL="--device-update-layers all --device-update-slots 2"
# (default: none); TAIL="--device-update-layers auto": ferry plan chooses K, the plan's bench
# runs the plan's K, the fixed policies none; TAIL_MS="--device-update-ms-per-layer 43" gives ferry plan a measured device
# time per layer (default: derived from the H2D rate, docs/plan.md). The profile run keeps the
# CPU doing every update (the profile's per-layer optimizer times are the CPU's).
# Output: $OUT/plan_caps.jsonl (one line per geometry and cap: {"geometry", "cap_gb", "plan":
# <ferry plan JSON>, "bench": <report>}), the profiles and logs, and a table on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/ferry_plan_caps}
mkdir -p "$OUT"
FERRY=${FERRY_GPU_BUILD:-build/gpu}/apps/ferry/ferry
OPTIM=${OPTIM:---optimizer-states 8bit --master bf16-kahan}
PLAN_EXTRA=${PLAN_EXTRA:---host-mem-gb 120 --time-limit-s 10}
BENCH_EXTRA=${BENCH_EXTRA:---steps 3 --warmup 1}
TAIL=${TAIL:-}
# RESIDENT: GPU-resident layers for the plan AND every fixed policy alike (ferry plan
# --resident-layers and ferry bench train --resident-layers), so the comparison is of activation
# plans at one K. Default 0 (comparable with sessions 9-16). RESIDENT=auto lets ferry plan choose
# its K and the bench run each fixed policy with its own largest K (then the plan's gain includes
# what residency gives every policy: say so when reporting).
RESIDENT=${RESIDENT:-0}
TAIL_MS=${TAIL_MS:-}
if [[ " $PLAN_EXTRA $BENCH_EXTRA " == *" --device-update-"* ]]; then
  echo "gpu_plan_caps: give the device tail's flags in TAIL (plan and bench alike), not in PLAN_EXTRA / BENCH_EXTRA" >&2
  exit 2
fi
# 7B: 32 (at 40 GiB the host policy fits 32, every:4 28; session 18's batch-16 cap hid that the
# CPU optimizer is amortized there: 4 913 -> 7 167 tok/s for the plan).
declare -A MAXB=([qwen2.5-3b]=48 [qwen2.5-7b]=32)
for g in ${GEOMS:-qwen2.5-3b qwen2.5-7b}; do
  maxb=${MAX_BATCH:-${MAXB[$g]:-32}}
  prof="$OUT/profile_${g}.json"
  prof_var="PROFILE_${g//[.-]/_}"  # e.g. PROFILE_qwen2_5_3b=bench/plan/results/...json: reuse it
  if [[ -n "${!prof_var:-}" && ! -s "$prof" ]]; then cp "${!prof_var}" "$prof"; fi
  if [[ ! -s "$prof" ]]; then
    timeout "${BENCH_TIMEOUT:-500}" "$FERRY" bench train --device cuda --geometry "$g" --arch qwen2 --seq-len 1024 \
      --batch-size "$maxb" --policies device,host $OPTIM $BENCH_EXTRA --json "$OUT/profile_bench_${g}.json" \
      >"$OUT/profile_bench_${g}.log" 2>&1 || { echo "[$g] profile bench failed:"; tail -3 "$OUT/profile_bench_${g}.log"; continue; }
    # The same model and batch with every layer that fits GPU-resident (device policy): the
    # resident-saving term (docs/plan.md). PROFILE_RESIDENT=0 leaves it out.
    res_args=()
    if [[ "${PROFILE_RESIDENT:-1}" != 0 ]] && timeout "${BENCH_TIMEOUT:-500}" "$FERRY" bench train --device cuda \
      --geometry "$g" --arch qwen2 --seq-len 1024 --batch-size "$maxb" --policies device \
      --resident-layers auto $OPTIM $BENCH_EXTRA --json "$OUT/profile_bench_${g}_resident.json" \
      >"$OUT/profile_bench_${g}_resident.log" 2>&1; then
      res_args=(--from-bench-resident "$OUT/profile_bench_${g}_resident.json")
    fi
    "$FERRY" plan --from-bench "$OUT/profile_bench_${g}.json" "${res_args[@]}" --write-profile "$prof" \
      >"$OUT/profile_${g}.log" 2>&1 || { echo "[$g] from-bench failed:"; tail -3 "$OUT/profile_${g}.log"; continue; }
    echo "[$g] profile at batch $maxb:"; grep -E "serial|device|resident saving" "$OUT/profile_${g}.log" | head -4
  fi
  caps_var="CAPS_${g//[.-]/_}"  # e.g. CAPS_qwen2_5_7b="24 40": this geometry's caps
  for cap in ${!caps_var:-${CAPS:-24 40 80}}; do
    # A cap above the card's memory cannot run (session 30: the 80 GiB plan on an 80 GB H100 was
    # refused by the executor after its bench rounds): skipped, said so.
    dev_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    if [[ "$dev_mib" =~ ^[0-9]+$ ]] && ((cap * 1024 > dev_mib)); then
      echo "[$g ${cap} GiB] skipped: the GPU has ${dev_mib} MiB (run this cap on a larger card)"
      continue
    fi
    plan="$OUT/plan_${g}_${cap}.json"
    # CAP is in GiB (what a 24 GB card has: 24 GiB), the bench's budget in MiB; ferry plan counts
    # GB = 1e9 bytes, so it gets the same bytes as CAP x 1.073741824 (before session 16 it got CAP
    # GB, 7 % less than the policies it was compared with).
    plan_gb=$(awk -v c="$cap" 'BEGIN { printf "%.6f", c * 1.073741824 }')
    rep="/tmp/plan_caps_bench.json"
    rm -f "$rep" "$rep".round*
    if ! "$FERRY" plan --geometry "$g" --seq-len 1024 --batch-size auto --max-batch "$maxb" \
      --gpu-mem-gb "$plan_gb" --profile "$prof" --resident-layers "$RESIDENT" $OPTIM $TAIL $TAIL_MS $PLAN_EXTRA --json "$plan" >"$OUT/plan_${g}_${cap}.log" 2>&1; then
      echo "[$g ${cap} GiB] ferry plan failed:"; tail -3 "$OUT/plan_${g}_${cap}.log"; continue
    fi
    # ROUNDS=R: the bench R times, the policy order rotated each time, merged per policy
    # (scripts/lib/merge_bench_rounds.py: mean step, each round's step kept).
    pols=(every:4 device host "plan=$plan")
    round_reps=()
    for ((r = 0; r < ${ROUNDS:-1}; r++)); do
      k=$((r % ${#pols[@]}))
      order=("${pols[@]:k}" "${pols[@]:0:k}")
      rr="$rep.round$r"
      round_reps+=("$rr")
      timeout "${BENCH_TIMEOUT:-500}" "$FERRY" bench train --device cuda --geometry "$g" --arch qwen2 --seq-len 1024 \
        --batch-size auto --max-batch "$maxb" --device-budget-mib $((cap * 1024)) \
        --policies "$(IFS=,; echo "${order[*]}")" --resident-layers "$RESIDENT" $OPTIM $TAIL $BENCH_EXTRA --json "$rr" \
        >"$OUT/bench_${g}_${cap}_round$r.log" 2>&1 || { echo "[$g ${cap} GiB] bench round $r failed:"; tail -3 "$OUT/bench_${g}_${cap}_round$r.log"; }
    done
    python3 scripts/lib/merge_bench_rounds.py "$rep" "${round_reps[@]}" ||
      echo "[$g ${cap} GiB] merging the rounds failed"
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
print(f"[{g} {cap} GiB] plan: batch {P.get('batch_size')}, predicted step "
      f"{P.get('predicted', {}).get('step_ms', float('nan')):.0f} ms")
for p in B.get("policies", []):
    if "error" in p:
        print(f"  {p['policy'][:12]:>12}: {p['error']}"); continue
    pred = p.get("predicted_step_ms")
    err = f", predicted {pred:.0f} ms ({100 * (pred / p['step_ms_mean'] - 1):+.1f} %)" if pred else ""
    if pred and p.get("plan_batch") != p["batch_size"]:
        err += f" [ran at batch {p['batch_size']}, predicted at {p.get('plan_batch')}]"
    print(f"  {p['policy'][:12]:>12}: batch {p['batch_size']} (fits {p.get('largest_fitting_batch')}), "
          f"{p['tokens_per_s']:.0f} tok/s, "
          f"{p['model_tflops']:.1f} TFLOPS, step {p['step_ms_mean']:.0f} ms{err}, device peak "
          f"{p['device_peak_bytes'] / 2**30:.1f} GiB"
          + (f", rounds {' / '.join(f'{v:.0f}' for v in p['rounds_step_ms'])} ms"
             if len(p.get("rounds_step_ms", [])) > 1 else ""))
PY
  done
done
