#!/usr/bin/env bash
# Run THERE (the GPU machine) after a build of ferry in build/gpu, for issue #7: one measured
# training step whose plan homes boundaries on NVMe, with the predicted step beside it.
#   OUT=/tmp/o bash scripts/gpu_plan_nvme.sh
# 1. `ferry plan --measure-machine --nvme-dir D` measures this machine's disk (write then read
#    back through mem::NvmeStore, the executor's own store) and link rates;
# 2. the 3B cost profile of session 17 (per-layer times measured on an H200) gets this machine's
#    measured NVMe and link rates (the plan's NVMe terms are priced with them);
# 3. `ferry plan` at a GPU cap and a host budget that leave no room for every boundary in host
#    memory beside the model state: some boundaries go to host memory, some to NVMe, some are
#    recomputed (defaults: batch 32 x 1024, 9 GB GPU, 31.5 GB host, 8-bit states + bf16-Kahan
#    masters; BATCH, GPU_GB, HOST_GB override);
# 4. `ferry bench train --policies plan=...` runs that plan on the GPU (its NVMe records in the
#    temp dir's ferry_bench_train_nvme) at the same batch and GPU budget, 1 warm-up + 3 steps.
# 5. (CALIBRATE=1, the default) an out-of-sample check with a profile of this machine: `ferry
#    bench train` runs device, host and the step-3 plan at the same batch without a GPU cap;
#    `ferry plan --from-bench` turns it into a measured profile (this machine's layer and optimizer
#    times, the host-home term, and the NVMe rates the executor got in its own disk calls); then
#    a second NVMe plan at BATCH2 (default 24) with that profile, run as in step 4.
# Output in $OUT: machine.json, profile_nvme.json, plan_nvme.{json,log}, bench_nvme.{json,log} (not with FIRST_BENCH=0)
# (calib_bench.*, profile_calibrated.*, plan_nvme2.*, bench_nvme2.*, evaluate_nvme{,2}.json with
# CALIBRATE=1)
# and a summary line per plan (homes per tier, predicted vs measured step, NVMe bytes per step).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
OUT=${OUT:-/tmp/ferry_plan_nvme}
mkdir -p "$OUT"
FERRY=${FERRY_GPU_BUILD:-build/gpu}/apps/ferry/ferry
NV=${NVME_DIR:-/tmp/ferry_plan_nvme_dir}
mkdir -p "$NV"
BATCH=${BATCH:-32}
GPU_GB=${GPU_GB:-9}
HOST_GB=${HOST_GB:-31.5}
PROFILE=${PROFILE:-bench/plan/results/h200_2026-12-02_s17_profile_qwen2.5-3b_b32_resident_saving.json}
OPTIM=(--optimizer-states 8bit --master bf16-kahan)

timeout 200 "$FERRY" plan --measure-machine --geometry qwen2.5-3b --nvme-dir "$NV" \
  --machine-profile "$OUT/machine.json" >"$OUT/machine.log" 2>&1 ||
  { echo "gpu_plan_nvme: measure-machine failed"; tail -5 "$OUT/machine.log"; exit 1; }
python3 - "$PROFILE" "$OUT/machine.json" "$OUT/profile_nvme.json" <<'PY' || exit 1
import json, sys
prof, mach = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rates, measured = mach["rates"], set(mach["measured"])
for k in ("nvme_read_gbps", "nvme_write_gbps", "h2d_gbps", "d2h_gbps", "duplex_gbps",
          "duplex_loaded_gbps"):
    if k in measured:
        prof["link"][k] = rates[k]
prof["measured_by"] += f"; link and NVMe rates: {mach['measured_by']} on {mach['gpu']}"
json.dump(prof, open(sys.argv[3], "w"), indent=2)
print("gpu_plan_nvme: link", prof["link"])
PY
"$FERRY" plan --geometry qwen2.5-3b --profile "$OUT/profile_nvme.json" --batch-size "$BATCH" \
  --seq-len 1024 --gpu-mem-gb "$GPU_GB" --host-mem-gb "$HOST_GB" --nvme-dir "$NV" --nvme-gb 40 \
  --resident-layers 0 --no-policies --time-limit-s 10 "${OPTIM[@]}" --json "$OUT/plan_nvme.json" \
  >"$OUT/plan_nvme.log" 2>&1 || { echo "gpu_plan_nvme: ferry plan failed"; tail -5 "$OUT/plan_nvme.log"; exit 1; }
budget_mib=$(awk -v g="$GPU_GB" 'BEGIN { printf "%d", g * 1e9 / 1048576 }')
summary() {
python3 - "$1" "$2" <<'PY'
import json, sys
P, B = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
homes = {}
for b in P["boundaries"]:
    homes[b["home"]] = homes.get(b["home"], 0) + 1
pr = P["predicted"]
print(f"plan: homes {homes}, predicted step {pr['step_ms']:.1f} ms (nvme stores "
      f"{pr.get('nvme_store_ms', 0):.1f} ms, fetches {pr.get('nvme_fetch_ms', 0):.1f} ms)")
for p in B.get("policies", []):
    print(json.dumps({k: p.get(k) for k in (
        "policy", "batch_size", "step_ms_mean", "predicted_step_ms", "tokens_per_s", "model_tflops",
        "act_bytes_per_step", "nvme_write_bytes_per_step", "nvme_read_bytes_per_step",
        "layer_forwards_per_step", "nvme_write_s_per_step", "nvme_read_s_per_step",
        "nvme_write_gbps", "nvme_read_gbps", "device_peak_bytes", "error")}))
PY
}
# bench_at_cap BATCH PLAN OUTNAME: the plan $OUT/PLAN.json run at the GPU cap (1 warm-up + 3 steps),
# its report in $OUT/OUTNAME.{json,log}, then its summary line.
bench_at_cap() {
  timeout "${BENCH_TIMEOUT:-300}" "$FERRY" bench train --device cuda --geometry qwen2.5-3b --arch qwen2 \
    --seq-len 1024 --batch-size "$1" --device-budget-mib "$budget_mib" \
    --policies "plan=$OUT/$2.json" --resident-layers 0 "${OPTIM[@]}" --steps 3 --warmup 1 \
    --json "$OUT/$3.json" >"$OUT/$3.log" 2>&1 ||
    { echo "gpu_plan_nvme: bench of $2 failed"; tail -5 "$OUT/$3.log"; exit 1; }
  summary "$OUT/$2.json" "$OUT/$3.json"
}
# FIRST_BENCH=0 skips step 4 when CALIBRATE is on: the calibration bench below runs the same plan
# (uncapped; the cap changes no placement) and its summary line has that plan's predicted and
# measured step, so a call short of device time saves one bench (~60-90 s).
if [[ "${FIRST_BENCH:-1}" != 0 || "${CALIBRATE:-1}" == 0 ]]; then
  bench_at_cap "$BATCH" plan_nvme bench_nvme
fi
[[ "${CALIBRATE:-1}" == 0 ]] && exit 0

BATCH2=${BATCH2:-24}
timeout "${BENCH_TIMEOUT:-300}" "$FERRY" bench train --device cuda --geometry qwen2.5-3b --arch qwen2 \
  --seq-len 1024 --batch-size "$BATCH" --policies "device,host,plan=$OUT/plan_nvme.json" \
  --resident-layers 0 "${OPTIM[@]}" --steps 3 --warmup 1 --json "$OUT/calib_bench.json" \
  >"$OUT/calib_bench.log" 2>&1 || { echo "gpu_plan_nvme: calibration bench failed"; tail -5 "$OUT/calib_bench.log"; exit 1; }
[[ "${FIRST_BENCH:-1}" == 0 ]] && summary "$OUT/plan_nvme.json" "$OUT/calib_bench.json"
"$FERRY" plan --from-bench "$OUT/calib_bench.json" --machine-profile "$OUT/machine.json" \
  --write-profile "$OUT/profile_calibrated.json" >"$OUT/profile_calibrated.log" 2>&1 ||
  { echo "gpu_plan_nvme: from-bench failed"; tail -5 "$OUT/profile_calibrated.log"; exit 1; }
grep -E "NVMe rates|device |host " "$OUT/profile_calibrated.log" | head -5
"$FERRY" plan --geometry qwen2.5-3b --profile "$OUT/profile_calibrated.json" --batch-size "$BATCH2" \
  --seq-len 1024 --gpu-mem-gb "$GPU_GB" --host-mem-gb "$HOST_GB" --nvme-dir "$NV" --nvme-gb 40 \
  --resident-layers 0 --no-policies --time-limit-s 10 "${OPTIM[@]}" --json "$OUT/plan_nvme2.json" \
  >"$OUT/plan_nvme2.log" 2>&1 || { echo "gpu_plan_nvme: second plan failed"; tail -5 "$OUT/plan_nvme2.log"; exit 1; }
bench_at_cap "$BATCH2" plan_nvme2 bench_nvme2
# Each NVMe plan priced again at the disk rates its own run measured (in sample, beside the
# out-of-sample line above): how much of an error is the disk rate and how much the model.
"$FERRY" plan --evaluate "$OUT/plan_nvme.json" --from-bench "$OUT/calib_bench.json" \
  --json "$OUT/evaluate_nvme.json" | grep -E "re-priced|measured:" || true
"$FERRY" plan --evaluate "$OUT/plan_nvme2.json" --from-bench "$OUT/bench_nvme2.json" \
  --json "$OUT/evaluate_nvme2.json" | grep -E "re-priced|measured:" || true
