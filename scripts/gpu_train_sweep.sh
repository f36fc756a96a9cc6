#!/usr/bin/env bash
# Run THERE (the GPU machine) after a build (scripts/gpu_train_check.sh builds build/gpu):
#   FERRY_TRAIN_SWEEP='name|ferry bench train flags;name2|...' bash scripts/gpu_train_sweep.sh
# For each ';'-separated case: `ferry bench train --device cuda FLAGS` and the PyTorch baseline
# (tools/bench/train_torch_baseline.py) on the same geometry, batch and sequence length, one after
# the other in this script (same machine, same minute). Flags the baseline does not take
# (--policies, --optimizer-states, --master, --grad-dtype, --weights-dtype, --gemm-precision, --prefetch, --device-budget-mib, --device-update-layers, --device-update-slots, --device-update-prestage, --head-update) are dropped for it; add
# `--checkpointing` to a case's name part as `name+ckpt` to run the baseline with HF's activation
# checkpointing (what a resident run of a big model needs). --grad-accum goes to both: the baseline
# then also steps its optimizer once per that many micro-batches (the same work per step). One JSON line per case goes to
# $OUT/train_sweep.jsonl ({"case", "ferry": report, "torch": report}); a ratio table to stdout.
# Cases whose baseline flags equal the previous case's (e.g. the same geometry with another ferry
# option) reuse that baseline's report from this same script run instead of running torch again.
# FERRY_SWEEP_DEADLINE (epoch s): start no case after it (the device call's own limit).
# A case's flags may start with VAR=VALUE words: environment of that case's ferry run only
# ('q2ga4-atomic+ckpt|FERRY_ATTN_BWD_DQ=atomic --geometry ...').
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_train}
mkdir -p "$OUT"
B=${FERRY_GPU_BUILD:-build/gpu}
FERRY="$B/apps/ferry/ferry"
source scripts/device_env.sh
PY=python3
$PY -c "import transformers" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
: >"$OUT/train_sweep.jsonl"
prev_tkey=""
IFS=';' read -ra CASES <<<"${FERRY_TRAIN_SWEEP:?set FERRY_TRAIN_SWEEP}"
for c in "${CASES[@]}"; do
  name=${c%%|*}
  flags=${c#*|}
  # Leading VAR=VALUE words are environment for ferry's run only (e.g. FERRY_ATTN_BWD_DQ=atomic):
  # the baseline never sees them, so a case differing only in them reuses the baseline.
  fenv=()
  read -ra words <<<"$flags"
  while [ ${#words[@]} -gt 0 ] && [[ "${words[0]}" =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]]; do
    fenv+=("${words[0]}")
    words=("${words[@]:1}")
  done
  flags="${words[*]}"
  if [ -n "${FERRY_SWEEP_DEADLINE:-}" ] && [ "$(date +%s)" -ge "$FERRY_SWEEP_DEADLINE" ]; then
    echo "[$name] not started: past FERRY_SWEEP_DEADLINE"
    continue
  fi
  rm -f /tmp/sweep_ferry.json
  timeout "${FERRY_SWEEP_TIMEOUT:-400}" env "${fenv[@]}" "$FERRY" bench train --device cuda $flags \
    --json /tmp/sweep_ferry.json >"/tmp/sweep_ferry.log" 2>&1 || {
    echo "[$name] ferry bench train failed:"
    tail -5 /tmp/sweep_ferry.log
  }
  tflags=$(echo " $flags " | sed -E 's/ --(policies|optimizer-states|master|grad-dtype|weights-dtype|gemm-precision|prefetch|optimizer-threads|device-budget-mib|device-update-layers|device-update-slots|device-update-prestage|head-update) [^ ]+//g; s/--batch-size/--batch/; s/--seq-len/--seq/')
  ck=""
  [[ "$name" == *+ckpt* ]] && ck="--checkpointing"
  tkey="$tflags $ck"
  if [ "$tkey" != "$prev_tkey" ] || [ ! -f /tmp/sweep_torch.json ]; then
    rm -f /tmp/sweep_torch.json
    timeout 300 $PY tools/bench/train_torch_baseline.py $tflags $ck --out /tmp/sweep_torch.json \
      >/tmp/sweep_torch.log 2>&1 || {
      echo "[$name] torch baseline failed:"
      tail -3 /tmp/sweep_torch.log
    }
    prev_tkey=$tkey
  else
    echo "[$name] torch baseline: the previous case's run (same flags)"
  fi
  $PY - "$name" /tmp/sweep_ferry.json /tmp/sweep_torch.json "$OUT/train_sweep.jsonl" <<'PYEOF'
import json, sys
name, fpath, tpath, out = sys.argv[1:5]
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"error": str(e)}
f, t = load(fpath), load(tpath)
with open(out, "a") as o:
    o.write(json.dumps({"case": name, "ferry": f, "torch": t}) + "\n")
tt = t.get("tokens_per_s")
head = f"[{name}] torch {tt:.0f} tok/s, {t['model_tflops']:.1f} TFLOPS, peak " \
       f"{t['peak_gpu_bytes'] / 2**30:.1f} GiB" if tt else f"[{name}] torch: {t.get('error', '?')}"
print(head)
for p in f.get("policies", []):
    if "error" in p:
        print(f"  ferry {p['policy']}: error {p['error']}")
        continue
    ratio = f"{p['tokens_per_s'] / tt:.3f}x torch" if tt else "no ratio"
    print(f"  ferry {p['policy']:>10}: {p['tokens_per_s']:.0f} tok/s = {ratio} | "
          f"{p['model_tflops']:.1f} TFLOPS | step {p['step_ms_mean']:.1f} ms, exposed "
          f"{p['exposed_ms_per_step']:.1f}, optimizer {p['optimizer_ms_per_step']:.1f} | device "
          f"peak {p['device_peak_bytes'] / 2**30:.2f} GiB, host {p['host_peak_bytes'] / 2**30:.1f} GiB")
PYEOF
done
