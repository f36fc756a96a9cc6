#!/usr/bin/env bash
# GPU-resident layers chosen by the planner (docs/plan.md, "resident layers"):
#  1. with plenty of GPU memory `ferry plan` (--resident-layers auto, the default) makes layers
#     resident: the text names K, the resident GB and the optimizer-wait change, the policy table
#     has the "fixed + resident K" row, the plan JSON and its problem carry resident_layers, the
#     predicted wait is below the K = 0 plan's and the GPU peak (resident bytes included) is within
#     the cap; --resident-layers K forces K;
#  2. `ferry bench train ... plan=FILE` runs the plan's K (the per-policy resident_layers) with
#     exactly the GPU bytes ferry plan counts; an explicit --resident-layers overrides the plan;
#  3. at a binding cap (4 MiB, batch auto) the plan still fits the executor with its K;
#  4. `ferry train --plan auto` runs the K of the plan it solved, and --resident-layers K solves
#     and runs with K.
# ctest-cost: 90 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"

source "$ROOT/tests/cli/lib/bench_model_dir.sh"
bench_model_dir "$TMP/m"
optim=(--master bf16-kahan --optimizer-states 8bit)
plan=(plan --model "$TMP/m" --seq-len 64 --host-mem-gb 8 --time-limit-s 5 --executor-device cpu
      "${optim[@]}")
bench=(bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 64
       --seq-len 64 --steps 1 --warmup 0 "${optim[@]}")
executor_bytes() {
  sed -n 's/.*executor gpu bytes \([0-9]*\) for the plan at batch.*/\1/p' "$1" | tail -1
}

# 1. Plenty of memory: resident layers, and K forced.
"$FERRY" "${plan[@]}" --batch-size 4 --gpu-mem-gb 1 --json "$TMP/auto.json" > "$TMP/auto.out" \
  2> "$TMP/auto.log" || { echo "plan_resident: auto failed"; cat "$TMP/auto.log"; exit 1; }
grep -q "^resident layers: [1-9][0-9]* (0\.\.[0-9]* on the gpu, .* GB; .*optimizer wait .* ms vs K = 0)" \
  "$TMP/auto.out" || { echo "plan_resident: no resident line"; cat "$TMP/auto.out"; exit 1; }
grep -q "^fixed + resident [1-9]" "$TMP/auto.out" ||
  { echo "plan_resident: no 'fixed + resident' row"; cat "$TMP/auto.out"; exit 1; }
for k in 0 3; do
  "$FERRY" "${plan[@]}" --batch-size 4 --gpu-mem-gb 1 --resident-layers "$k" --no-policies \
    --json "$TMP/k$k.json" > "$TMP/k$k.out" 2> "$TMP/k$k.log" ||
    { echo "plan_resident: --resident-layers $k failed"; cat "$TMP/k$k.log"; exit 1; }
done
python3 - "$TMP/auto.json" "$TMP/k0.json" "$TMP/k3.json" <<'PY'
import json, sys
auto, k0, k3 = (json.load(open(p)) for p in sys.argv[1:4])
K = auto["resident_layers"]
assert 0 < K <= 12 and auto["problem"]["resident_layers"] == K, K
pr = auto["predicted"]
assert pr["resident_gb"] > 0 and pr["gpu_peak_gb"] <= auto["problem"]["gpu_cap_gb"] + 1e-9, pr
layers = auto["problem"]["layers"]
assert abs(pr["resident_gb"] - sum(l["resident_gb"] for l in layers[:K])) < 1e-12
assert pr["optimizer_wait_ms"] < k0["predicted"]["optimizer_wait_ms"], (pr["optimizer_wait_ms"], k0["predicted"]["optimizer_wait_ms"])
assert pr["step_ms"] <= k0["predicted"]["step_ms"] + 1e-9
assert k0["resident_layers"] == 0 and "resident_layers" not in k0["problem"]
assert k3["resident_layers"] == 3 and k3["problem"]["resident_layers"] == 3
print(f"plan_resident: auto K={K} ({pr['resident_gb']*1e3:.3f} MB), optimizer wait "
      f"{k0['predicted']['optimizer_wait_ms']:.4f} -> {pr['optimizer_wait_ms']:.4f} ms")
PY

# 2. The bench runs the plan's K with ferry plan's bytes; --resident-layers overrides.
for name in auto k3; do
  log="$TMP/$name.log"; [ "$name" = k3 ] && log="$TMP/k3.log"
  want=$(executor_bytes "$log")
  "$FERRY" "${bench[@]}" --batch-size 4 --policies "plan=$TMP/$name.json" --json "$TMP/b$name.json" \
    > "$TMP/b$name.out" 2>&1 || { echo "plan_resident: bench $name failed"; cat "$TMP/b$name.out"; exit 1; }
  python3 - "$TMP/b$name.json" "$TMP/$name.json" "$want" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
plan = json.load(open(sys.argv[2]))
assert "error" not in p, p
assert p["resident_layers"] == plan["resident_layers"], (p["resident_layers"], plan["resident_layers"])
assert p["device_planned_bytes"] == int(sys.argv[3]), (p["device_planned_bytes"], sys.argv[3])
assert p["device_resident_bytes"] > 0 and p["resident_updates"] > 0, p
print(f"plan_resident: bench plan={sys.argv[2].split('/')[-1]} ran resident_layers "
      f"{p['resident_layers']} with ferry plan's {p['device_planned_bytes']} bytes")
PY
done
"$FERRY" "${bench[@]}" --batch-size 4 --resident-layers 2 --policies "plan=$TMP/auto.json" \
  --json "$TMP/bo.json" > "$TMP/bo.out" 2>&1 || { echo "plan_resident: override failed"; cat "$TMP/bo.out"; exit 1; }
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["policies"][0]; assert p["resident_layers"] == 2, p' "$TMP/bo.json"
# An explicit 0 overrides the plan's K too; auto leaves the plan its own K (its solve chose it).
for asked in 0 auto; do
  "$FERRY" "${bench[@]}" --batch-size 4 --resident-layers "$asked" --policies "plan=$TMP/auto.json" \
    --json "$TMP/bo$asked.json" > "$TMP/bo$asked.out" 2>&1 ||
    { echo "plan_resident: --resident-layers $asked with a plan failed"; cat "$TMP/bo$asked.out"; exit 1; }
done
python3 - "$TMP/bo0.json" "$TMP/boauto.json" "$TMP/auto.json" <<'PY'
import json, sys
p0, pa = (json.load(open(f))["policies"][0] for f in sys.argv[1:3])
K = json.load(open(sys.argv[3]))["resident_layers"]
assert p0["resident_layers"] == 0 and p0["device_resident_bytes"] == 0, p0
assert pa["resident_layers"] == K > 0, (pa["resident_layers"], K)
print(f"plan_resident: --resident-layers 0 ran 0 layers of the plan's {K}; auto ran the plan's {K}")
PY
# With bf16 gradients (the executor's one bf16 rounding scratch): bytes equal too.
"$FERRY" "${plan[@]}" --grad-dtype bf16 --batch-size 4 --gpu-mem-gb 1 --resident-layers 5 \
  --no-policies --json "$TMP/g16.json" > /dev/null 2> "$TMP/g16.log" ||
  { echo "plan_resident: bf16 grads plan failed"; cat "$TMP/g16.log"; exit 1; }
want=$(executor_bytes "$TMP/g16.log")
"$FERRY" "${bench[@]}" --grad-dtype bf16 --batch-size 4 --policies "plan=$TMP/g16.json" \
  --json "$TMP/bg16.json" > "$TMP/bg16.out" 2>&1 || { echo "plan_resident: bf16 bench failed"; cat "$TMP/bg16.out"; exit 1; }
python3 - "$TMP/bg16.json" "$want" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert "error" not in p and p["resident_layers"] == 5, p
assert p["device_planned_bytes"] == int(sys.argv[2]), (p["device_planned_bytes"], sys.argv[2])
print(f"plan_resident: bf16 gradients, 5 resident layers: ferry plan's {sys.argv[2]} bytes = the executor's")
PY

# 3. A binding cap: the plan's K fits the executor at the plan's batch.
"$FERRY" "${plan[@]}" --batch-size auto --max-batch 64 --gpu-mem-gb 0.004194304 --no-policies \
  --json "$TMP/cap.json" > /dev/null 2> "$TMP/cap.log" ||
  { echo "plan_resident: capped plan failed"; cat "$TMP/cap.log"; exit 1; }
"$FERRY" "${bench[@]}" --batch-size auto --max-batch 64 --device-budget-mib 4 \
  --policies "plan=$TMP/cap.json" --json "$TMP/bcap.json" > "$TMP/bcap.out" 2>&1 ||
  { echo "plan_resident: capped bench failed"; cat "$TMP/bcap.out"; exit 1; }
python3 - "$TMP/bcap.json" "$TMP/cap.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
plan = json.load(open(sys.argv[2]))
assert "error" not in p, p
assert p["resident_layers"] == plan["resident_layers"] and p["batch_size"] == plan["batch_size"], (p, plan["resident_layers"])
assert p["device_planned_bytes"] <= 4 << 20, p
print(f"plan_resident: at 4 MiB the plan (batch {plan['batch_size']}, K {plan['resident_layers']}) "
      f"fits the executor: {p['device_planned_bytes']} bytes")
PY

# 4. ferry train --plan auto runs its plan's K; --resident-layers K solves and runs with K.
train=(train --demo-layers 4 --demo-hidden 32 --seq-len 128 --batch-size 4 --max-steps 1
       --eval-every 0 --seed 11 --plan auto --device-budget-mib 3000 "${optim[@]}")
"$FERRY" "${train[@]}" --output-dir "$TMP/r0" > "$TMP/r0.log" 2> "$TMP/r0.err" ||
  { echo "plan_resident: train --plan auto failed"; cat "$TMP/r0.err"; exit 1; }
K=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["resident_layers"])' "$TMP/r0/plan.json")
[ "$K" -gt 0 ] || { echo "plan_resident: train --plan auto chose no resident layers"; exit 1; }
grep -q "resident layers: 0\.\.$((K - 1)) on the device" "$TMP/r0.err" "$TMP/r0.log" ||
  { echo "plan_resident: train did not run the plan's $K resident layers"; cat "$TMP/r0.err"; exit 1; }
"$FERRY" "${train[@]}" --resident-layers 1 --output-dir "$TMP/r1" > "$TMP/r1.log" 2> "$TMP/r1.err" ||
  { echo "plan_resident: train --plan auto --resident-layers 1 failed"; cat "$TMP/r1.err"; exit 1; }
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["resident_layers"] == 1' "$TMP/r1/plan.json"
grep -q "resident layers: 0\.\.0 on the device" "$TMP/r1.err" "$TMP/r1.log" ||
  { echo "plan_resident: train did not run 1 resident layer"; cat "$TMP/r1.err"; exit 1; }
echo "plan_resident: train --plan auto ran the plan's $K resident layers; --resident-layers 1 ran 1"
echo "plan resident cli: ok"
