#!/usr/bin/env bash
# CLI checks of `ferry plan` on a built-in geometry (no download): a fixed batch prints the
# boundary and window tables, the prediction and the policy comparison, and writes a JSON plan
# whose predicted peaks respect the budgets; --batch-size auto picks a batch; a GPU budget no plan
# fits exits 1 naming the binding constraint and the smallest budget, and that budget works;
# usage errors exit 2.
# ctest-cost: 40 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"  # no cached profile from this machine's user leaks in
# --resident-layers 0: these checks are about the activation plan and the optimizer gate without
# GPU-resident layers (tests/cli/plan_resident.sh covers the search over them).
base=(plan --geometry qwen2.5-0.5b --seq-len 512 --host-mem-gb 64 --time-limit-s 10 --max-batch 64
      --resident-layers 0)

"$FERRY" "${base[@]}" --batch-size 8 --gpu-mem-gb 24 --json "$TMP/p.json" > "$TMP/out" 2> "$TMP/err" ||
  { echo "plan failed"; cat "$TMP/err"; exit 1; }
for want in "^boundary  home" "^window  compute_ms" "^predicted step" "^peak memory: gpu" \
            "^solved " "^checkpoint-every-4 " "^all-gpu " "^all-host "; do
  grep -q "$want" "$TMP/out" || { echo "missing '$want'"; cat "$TMP/out"; exit 1; }
done
python3 - "$TMP/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "ferry-plan" and j["batch_size"] == 8 and j["num_layers"] == 24, j.keys()
assert len(j["boundaries"]) == 25 and len(j["predicted"]["window_exposed_ms"]) == 49
pr, prob = j["predicted"], j["problem"]
assert 0 < pr["gpu_peak_gb"] <= prob["gpu_cap_gb"] + 1e-6, pr["gpu_peak_gb"]
assert pr["host_peak_gb"] <= prob["host_cap_gb"] + 1e-6
assert pr["step_ms"] > 0 and pr["tflops"] > 0
assert j["spans"][0]["start"] == 0 and j["spans"][-1]["end"] == 24
# The CPU optimizer per step: forward windows held by it (per window, summing to the total), the
# step = gpu + wait + bound + host homes (0 here: the analytic model has no measured host-home
# term), and the solver's objective = that step + the move penalty.
w = pr["window_optimizer_wait_ms"]
assert len(w) == 49 and all(x >= 0 for x in w) and all(x == 0 for x in w[24:]), w
assert abs(sum(w) - pr["optimizer_wait_ms"]) < 1e-6, (sum(w), pr["optimizer_wait_ms"])
assert pr["optimizer_wait_ms"] > 0  # 0.5B at 2 Gparam/s: ~247 ms of updates vs a ~60 ms forward
opt = prob["cpu_optimizer_ms"]
assert pr["host_home_ms"] == 0 and "host_home_ms_per_gb" not in prob, pr["host_home_ms"]
assert abs(pr["step_ms"] - (pr["gpu_step_ms"] + pr["optimizer_wait_ms"] + pr["optimizer_bound_ms"] + pr["host_home_ms"])) < 1e-6
assert abs(pr["step_ms"] - max(pr["gpu_step_ms"] + pr["optimizer_wait_ms"], opt) - pr["host_home_ms"]) < 1e-6
# The penalty counts kept internals' bytes too (between equally fast plans, keep less).
pen = prob["move_penalty_ms_per_gb"] * (pr["moved_gb"] + pr["kept_internals_gb"])
assert abs(j["solver"]["objective_ms"] - (pr["step_ms"] + pen)) <= 1e-6 * pr["step_ms"], j["solver"]
# Kept internals: one 0/1 flag per layer (what the executor reads), their bytes in the prediction.
keep = j["keep_internals"]
assert len(keep) == 24 and all(k in (0, 1) for k in keep), keep
kept_gb = sum(l["internals_gb"] for l, k in zip(prob["layers"], keep) if k)
assert abs(pr["kept_internals_gb"] - kept_gb) <= 1e-9, (pr["kept_internals_gb"], kept_gb)
PY
grep -q "^kept internals: " "$TMP/out" || { echo "no kept internals line"; cat "$TMP/out"; exit 1; }
grep -q "optimizer wait [0-9.]* (forward held by the cpu optimizer)" "$TMP/out" ||
  { echo "no optimizer wait in the text"; cat "$TMP/out"; exit 1; }
grep -q "opt_wait_ms" "$TMP/out" || { echo "no opt_wait_ms column"; cat "$TMP/out"; exit 1; }

"$FERRY" "${base[@]}" --batch-size auto --gpu-mem-gb 24 --no-policies --json "$TMP/a.json" \
  > "$TMP/out" 2> "$TMP/err" || { echo "auto failed"; cat "$TMP/err"; exit 1; }
grep -q "batch=auto -> .*optimizer wait" "$TMP/err" || { echo "no auto line"; cat "$TMP/err"; exit 1; }
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['batch_size'] >= 8, j['batch_size']" "$TMP/a.json"

set +e
"$FERRY" "${base[@]}" --batch-size 64 --gpu-mem-gb 4 --no-policies > /dev/null 2> "$TMP/err"; rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "infeasible: rc=$rc"; cat "$TMP/err"; exit 1; }
grep -q "binding constraint gpu memory (capacity 4.00 GB)" "$TMP/err" || { cat "$TMP/err"; exit 1; }
need=$(sed -n 's/.*smallest gpu memory budget that fits is \([0-9.]*\) GB.*/\1/p' "$TMP/err")
[ -n "$need" ] || { echo "no budget in message"; cat "$TMP/err"; exit 1; }
"$FERRY" "${base[@]}" --batch-size 64 --gpu-mem-gb "$need" --no-policies > /dev/null 2> "$TMP/err" ||
  { echo "reported budget $need does not fit"; cat "$TMP/err"; exit 1; }

set +e
"$FERRY" plan --geometry qwen2.5-0.5b --batch-size 4 --host-mem-gb 64 > /dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || { echo "missing --gpu-mem-gb: rc=$rc"; exit 1; }
"$FERRY" plan --geometry qwen2.5-0.5b --batch-size zero --gpu-mem-gb 8 --host-mem-gb 64 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "positive integer or auto" "$TMP/err" || { echo "bad batch: rc=$rc"; exit 1; }
"$FERRY" plan --geometry nope --batch-size 4 --gpu-mem-gb 8 --host-mem-gb 64 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "no built-in geometry" "$TMP/err" || { echo "bad geometry: rc=$rc"; exit 1; }
set -e

# The optimizer mode sets the host state per parameter (the arena ferry train would build).
"$FERRY" "${base[@]}" --batch-size 8 --gpu-mem-gb 24 --no-policies --master bf16-kahan \
  --optimizer-states 8bit > /dev/null 2> "$TMP/err" || { echo "mode plan failed"; cat "$TMP/err"; exit 1; }
grep -q "host state 10.004 bytes/param (master=bf16-kahan states=8bit" "$TMP/err" ||
  { echo "no host-state line"; cat "$TMP/err"; exit 1; }
# ... with ferry train's --grad-dtype bf16, 2 bytes less (the arena's bf16 gradients).
"$FERRY" "${base[@]}" --batch-size 8 --gpu-mem-gb 24 --no-policies --master bf16-kahan \
  --optimizer-states 8bit --grad-dtype bf16 > /dev/null 2> "$TMP/err" ||
  { echo "bf16-grads plan failed"; cat "$TMP/err"; exit 1; }
grep -q "host state 8.004 bytes/param (master=bf16-kahan states=8bit" "$TMP/err" ||
  { echo "no bf16-grads host-state line"; cat "$TMP/err"; exit 1; }
set +e
"$FERRY" "${base[@]}" --batch-size 8 --gpu-mem-gb 24 --master fp32 --host-state-bytes-per-param 12 \
  > /dev/null 2> "$TMP/err"; rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "not both" "$TMP/err" || { echo "mode + bytes: rc=$rc"; cat "$TMP/err"; exit 1; }

# --measure-machine writes a machine profile (the cache for --machine by default); a plan for
# that machine then uses it and says so. Small NVMe records and total (the defaults move ~11 GiB
# of disk I/O, which a CI disk need not do for this check).
"$FERRY" plan --measure-machine --geometry qwen2.5-0.5b --machine testbox --nvme-dir "$TMP/nvme" \
  --nvme-record-mib 4 --nvme-measure-mib 16 \
  > "$TMP/out" 2> "$TMP/err" || { echo "measure failed"; cat "$TMP/err"; exit 1; }
for want in "^cpu_optimizer_gparams_per_s" "^nvme_read_gbps" "^written to $TMP/cache/plan/"; do
  grep -q "$want" "$TMP/out" || { echo "missing '$want'"; cat "$TMP/out"; exit 1; }
done
python3 - "$TMP/cache/plan/machine__testbox.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "ferry-machine-profile" and j["machine"] == "testbox", j
assert "cpu_optimizer_gparams_per_s" in j["measured"] and j["rates"]["nvme_read_gbps"] > 0
PY
"$FERRY" "${base[@]}" --machine testbox --batch-size 8 --gpu-mem-gb 24 --no-policies \
  > /dev/null 2> "$TMP/err" || { echo "plan with machine profile failed"; cat "$TMP/err"; exit 1; }
grep -q "machine profile=$TMP/cache/plan/machine__testbox.json" "$TMP/err" ||
  { echo "machine profile not used"; cat "$TMP/err"; exit 1; }

# --from-bench: a `ferry bench train` report measured on the H200 (committed with the bench) gives
# a profile and predicted vs measured per policy; --write-profile auto caches the profile, which a
# later plan for that geometry then uses.
BENCH="$ROOT/bench/train/results/h200_2026-11-30_bench_train.json"
"$FERRY" plan --from-bench "$BENCH" --machine testbox --write-profile auto --json "$TMP/pvm.json" \
  > "$TMP/out" 2> "$TMP/err" || { echo "from-bench failed"; cat "$TMP/err"; exit 1; }
grep -q "checkpoint-every-4" "$TMP/out" || { echo "no every:4 prediction"; cat "$TMP/out"; exit 1; }
python3 - "$TMP/pvm.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
checks = {c["policy"]: c for c in j["checks"]}
assert set(checks) == {"device", "every:4", "host"}, checks.keys()
for c in checks.values():
    assert c["measured_step_ms"] > 0 and c["predicted_step_ms"] > 0, c
assert j["profile"]["format"] == "ferry-plan-profile" and len(j["profile"]["layers"]) == 8
PY
ls "$TMP"/cache/plan/testbox__qwen3-L8-*.json > /dev/null ||
  { echo "profile not cached"; ls -R "$TMP/cache"; exit 1; }
set +e
"$FERRY" plan --from-bench "$TMP/err" > /dev/null 2> "$TMP/err2"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "from-bench" "$TMP/err2" || { echo "bad report not refused"; exit 1; }
# A Qwen2 bench (--arch qwen2, session 17 on the H200) with its resident-layers run: the profile
# is keyed by the benched architecture and carries the measured resident saving; a plan for other
# shapes refuses it, a plan for the same shapes of the other architecture reads it with a warning.
R17="$ROOT/bench/plan/results/h200_2026-12-02_s17_profile_bench_qwen2.5-3b"
"$FERRY" plan --from-bench "${R17}_device_host.json" --from-bench-resident "${R17}_device_resident.json" \
  --write-profile "$TMP/q2.json" > "$TMP/out" 2> "$TMP/err" ||
  { echo "from-bench qwen2 failed"; cat "$TMP/err"; exit 1; }
grep -q "^resident saving: [0-9.]* ms/layer (.*K = 36 resident layers" "$TMP/out" ||
  { echo "no resident saving"; cat "$TMP/out"; exit 1; }
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p["geometry"].startswith("qwen2-L36-"), p["geometry"]; assert p["resident_saved_ms"] > 0' "$TMP/q2.json"
set +e
"$FERRY" plan --geometry qwen2.5-7b --seq-len 1024 --batch-size 4 --gpu-mem-gb 80 --host-mem-gb 200 \
  --profile "$TMP/q2.json" --no-policies > /dev/null 2> "$TMP/err3"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "another model's" "$TMP/err3" ||
  { echo "a profile of other shapes was not refused"; cat "$TMP/err3"; exit 1; }
sed 's/"qwen2-L36-/"qwen3-L36-/' "$TMP/q2.json" > "$TMP/q3.json"
"$FERRY" plan --geometry qwen2.5-3b --seq-len 1024 --batch-size 4 --gpu-mem-gb 80 --host-mem-gb 200 \
  --profile "$TMP/q3.json" --no-policies > /dev/null 2> "$TMP/err4" ||
  { echo "a same-shapes profile of the other architecture failed"; cat "$TMP/err4"; exit 1; }
grep -q "the same shapes, another architecture" "$TMP/err4" ||
  { echo "no architecture warning"; cat "$TMP/err4"; exit 1; }
echo "plan cli: ok"
