#!/usr/bin/env bash
# The device optimizer tail (ferry train --device-update-layers K|all, --device-update-slots S)
# in the plans made for an executor run (docs/plan.md, "The device optimizer tail in the gate"):
#  1. ferry plan's executor fit counts the tail's staging (S x the largest of its layers'
#     optimizer sections + a widening buffer with bf16 gradients) exactly as the executor does:
#     the bytes it logs for a plan equal `ferry bench train`'s device_planned_bytes for that plan
#     with the same tail, and differ from the run without it by exactly the staging it names
#     (two optimizer modes: bf16-kahan + 8-bit, and fp32 master + 8-bit with bf16 gradients);
#     without --device-update-layers (auto) ferry bench train runs a plan=FILE policy with its
#     plan's tail (the same bytes as given explicitly) and a named policy without one;
#  2. a plan solved with the tail at a binding GPU cap fits the executor with the tail on;
#  3. ferry train --plan auto passes the run's tail: the plan's problem has it, its optimizer
#     phase differs from the run without, and plan and phase equal what ferry plan predicts for
#     the same request;
#  4. a tail with fp32 master + fp32 states (no device kernel) is refused by the executor fit;
#  5. a plan records the model it was solved for, and ferry bench train refuses a plan=FILE for
#     another architecture (H200, session 16: ferry plan --geometry qwen2.5-3b prices Qwen2, the
#     bench's --geometry model is Qwen3 unless --arch qwen2, whose q/k norm buffers in every layer
#     workspace, kept ones included, took 1.2 GB more than the plan's 40 GiB fit at batch 32);
#     with the plan's architecture, at a binding cap with the tail and mixed homes, the executor
#     runs it at its batch with ferry plan's bytes;
#  6. --device-update-layers auto: ferry plan chooses K and writes it (top level = its problem's,
#     named in the text); ferry train --plan auto --device-update-layers auto solves the K of
#     ferry plan for the same request and runs it; --plan FILE runs the plan's K unless a K is
#     given, which is warned about; fp32 master + fp32 states: auto means 0;
#  7. a measured device time per layer: ferry plan --from-bench takes it (the tail's busy time
#     over its units) and its H2D bytes per unit from a policy whose tail ran into the profile,
#     which ferry plan then uses (--device-update-ms-per-layer overrides the time); ferry train
#     --plan auto takes --device-update-ms-per-layer too, and refuses it without --plan auto.
# ctest-cost: 60 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"  # no cached profile from this machine's user leaks in

# The model of `ferry bench train --layers 12 --hidden 64 ...` (the built-in layout) as a folder.
source "$ROOT/tests/cli/lib/bench_model_dir.sh"
bench_model_dir "$TMP/m"
# --resident-layers 0 (and on train below): the tail's checks without GPU-resident layers, which
# would leave the tail fewer layers or none (tests/cli/plan_resident.sh).
plan=(plan --model "$TMP/m" --seq-len 64 --host-mem-gb 8 --time-limit-s 5 --executor-device cpu
      --resident-layers 0
      --no-policies)
bench=(bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 64
       --seq-len 64 --steps 1 --warmup 0)

# executor_bytes LOG -> "bytes staging" from ferry plan's "executor gpu bytes" line.
executor_bytes() {
  sed -n 's/.*executor gpu bytes \([0-9]*\) for the plan at batch [0-9]* (device optimizer tail staging \([0-9]*\) bytes.*/\1 \2/p' "$1" | tail -1
}
# planned_bytes REPORT -> the executor's device bytes of its (only) policy.
planned_bytes() {
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["policies"][0]; assert "error" not in p, p; print(p["device_planned_bytes"])' "$1"
}

# 1. The staging in the executor fit, byte for byte.
n=0
for mode in "--master bf16-kahan --optimizer-states 8bit|--device-update-layers all --device-update-slots 2" \
            "--master fp32 --optimizer-states 8bit --grad-dtype bf16|--device-update-layers 3 --device-update-slots 3"; do
  n=$((n + 1))
  optim=(${mode%%|*}); tail=(${mode#*|})
  "$FERRY" "${plan[@]}" --batch-size 4 --gpu-mem-gb 1 "${optim[@]}" "${tail[@]}" \
    --json "$TMP/t$n.json" > /dev/null 2> "$TMP/t$n.log" ||
    { echo "plan_tail: ferry plan with the tail failed"; cat "$TMP/t$n.log"; exit 1; }
  read -r with staging <<< "$(executor_bytes "$TMP/t$n.log")"
  [ -n "$with" ] && [ "$staging" -gt 0 ] ||
    { echo "plan_tail: no executor bytes / staging logged"; cat "$TMP/t$n.log"; exit 1; }
  "$FERRY" "${bench[@]}" --batch-size 4 --policies "plan=$TMP/t$n.json" "${optim[@]}" \
    "${tail[@]}" --json "$TMP/bt$n.json" > "$TMP/bt$n.log" 2>&1 ||
    { echo "plan_tail: bench with the tail failed"; cat "$TMP/bt$n.log"; exit 1; }
  "$FERRY" "${bench[@]}" --batch-size 4 --policies "plan=$TMP/t$n.json" "${optim[@]}" \
    --device-update-layers 0 --json "$TMP/bo$n.json" > "$TMP/bo$n.log" 2>&1 ||
    { echo "plan_tail: bench without the tail failed"; cat "$TMP/bo$n.log"; exit 1; }
  # No --device-update-layers (auto): a plan=FILE policy runs the tail its plan was solved with.
  "$FERRY" "${bench[@]}" --batch-size 4 --policies "plan=$TMP/t$n.json,every:4" "${optim[@]}" \
    "${tail[@]:2}" \
    --json "$TMP/ba$n.json" > "$TMP/ba$n.log" 2>&1 ||
    { echo "plan_tail: bench with the plan's own tail failed"; cat "$TMP/ba$n.log"; exit 1; }
  python3 - "$TMP/ba$n.json" "$TMP/bt$n.json" "$TMP/t$n.json" <<'PY'
import json, sys
auto, given, plan = (json.load(open(p)) for p in sys.argv[1:4])
k = plan["problem"]["device_update_layers"]
assert auto["device_update_layers"] == "auto", auto["device_update_layers"]
a, named = auto["policies"]
assert "error" not in a and "error" not in named, auto["policies"]
assert a["device_update_layers_run"] == k and a["plan_device_update_layers"] == k, a
assert named["device_update_layers_run"] == 0, named
assert a["device_planned_bytes"] == given["policies"][0]["device_planned_bytes"], (a, given)
PY
  if grep -q "solved for --device-update-layers" "$TMP/ba$n.log"; then
    echo "plan_tail: the plan's own tail is flagged as another"; cat "$TMP/ba$n.log"; exit 1
  fi
  got=$(planned_bytes "$TMP/bt$n.json"); off=$(planned_bytes "$TMP/bo$n.json")
  [ "$with" -eq "$got" ] ||
    { echo "plan_tail: ${mode}: ferry plan counts $with bytes, the executor $got"; exit 1; }
  [ $((got - off)) -eq "$staging" ] ||
    { echo "plan_tail: ${mode}: staging $staging bytes, the executor's tail adds $((got - off))"; exit 1; }
  grep -q "solved for --device-update-layers" "$TMP/bo$n.log" ||
    { echo "plan_tail: a plan solved with the tail run without it is not flagged"; cat "$TMP/bo$n.log"; exit 1; }
  echo "plan_tail: ${mode}: ferry plan's executor bytes $with = the executor's, staging $staging"
done

# 2. At a binding cap (4 MiB) the plan solved with the tail fits the executor with the tail.
optim=(--master bf16-kahan --optimizer-states 8bit)
tail=(--device-update-layers all --device-update-slots 2)
for t in off on; do
  extra=(); [ "$t" = on ] && extra=("${tail[@]}")
  "$FERRY" "${plan[@]}" --batch-size auto --max-batch 64 --gpu-mem-gb 0.004194304 "${optim[@]}" \
    "${extra[@]}" --json "$TMP/cap_$t.json" > /dev/null 2> "$TMP/cap_$t.log" ||
    { echo "plan_tail: capped plan ($t) failed"; cat "$TMP/cap_$t.log"; exit 1; }
done
"$FERRY" "${bench[@]}" --batch-size auto --max-batch 64 --device-budget-mib 4 "${optim[@]}" \
  "${tail[@]}" --policies "plan=$TMP/cap_on.json" --json "$TMP/bcap.json" > "$TMP/bcap.log" 2>&1 ||
  { echo "plan_tail: capped bench failed"; cat "$TMP/bcap.log"; exit 1; }
python3 - "$TMP/bcap.json" "$TMP/cap_on.json" "$TMP/cap_off.json" <<'PY'
import json, sys
fit = json.load(open(sys.argv[1]))["policies"][0]
on, off = (json.load(open(p)) for p in sys.argv[2:4])
assert "error" not in fit, fit
assert fit["plan_batch"] == on["batch_size"] and fit["batch_size"] == fit["plan_batch"], fit
assert fit["largest_fitting_batch"] >= fit["plan_batch"], fit
assert fit["device_planned_bytes"] <= 4 << 20, fit
assert fit["plan_device_update_layers"] == 12, fit
assert on["problem"]["device_update_layers"] == 12 and "device_update_layers" not in off["problem"]
# The staging takes room the plan without the tail used.
assert on["batch_size"] <= off["batch_size"], (on["batch_size"], off["batch_size"])
print(f"plan_tail: at 4 MiB the plan with the tail (batch {on['batch_size']}, without "
      f"{off['batch_size']}) fits the executor with it (largest {fit['largest_fitting_batch']})")
PY

# 3. ferry train --plan auto with the run's tail.
train=(train --demo-layers 4 --demo-hidden 32 --seq-len 128 --batch-size 4 --max-steps 1
       --resident-layers 0
       --eval-every 0 --seed 11 --plan auto --device-budget-mib 3000 "${optim[@]}")
"$FERRY" "${train[@]}" --output-dir "$TMP/r0" > "$TMP/r0.log" 2> "$TMP/r0.err" ||
  { echo "plan_tail: train --plan auto failed"; cat "$TMP/r0.err"; exit 1; }
"$FERRY" "${train[@]}" --device-update-layers all --output-dir "$TMP/r1" > "$TMP/r1.log" \
  2> "$TMP/r1.err" || { echo "plan_tail: train --plan auto with the tail failed"; cat "$TMP/r1.err"; exit 1; }
grep -q 'policy plan:solved' "$TMP/r1.err" "$TMP/r1.log" || { echo "plan_tail: tail plan not run"; exit 1; }
# The same request through ferry plan (the run's exported config, its caps as the plan recorded).
caps=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["problem"]; print(repr(p["gpu_cap_gb"]), repr(p["host_cap_gb"]))' "$TMP/r1/plan.json")
read -r gpu host <<< "$caps"
"$FERRY" plan --model "$TMP/r1" --seq-len 128 --batch-size 4 --gpu-mem-gb "$gpu" --host-mem-gb "$host" \
  --executor-device cpu "${optim[@]}" --device-update-layers all --no-policies --resident-layers 0 \
  --json "$TMP/p1.json" > /dev/null 2> "$TMP/p1.log" ||
  { echo "plan_tail: ferry plan of the same request failed"; cat "$TMP/p1.log"; exit 1; }
python3 - "$TMP/r0/plan.json" "$TMP/r1/plan.json" "$TMP/p1.json" <<'PY'
import json, sys
off, on, ref = (json.load(open(p)) for p in sys.argv[1:4])
L = on["num_layers"]
assert on["problem"]["device_update_layers"] == L, on["problem"].get("device_update_layers")
assert "device_update_layers" not in off["problem"], off["problem"]
po, pn = off["predicted"]["optimizer_phase_ms"], on["predicted"]["optimizer_phase_ms"]
assert po == off["problem"]["cpu_optimizer_ms"] and pn != po, (po, pn)
for k in ("optimizer_phase_ms", "step_ms", "optimizer_wait_ms", "gpu_peak_gb"):
    assert on["predicted"][k] == ref["predicted"][k], (k, on["predicted"][k], ref["predicted"][k])
assert on["boundaries"] == ref["boundaries"] and on["problem"] == ref["problem"]
print(f"plan_tail: train --plan auto: optimizer phase {po:.6f} ms without the tail, {pn:.6f} ms "
      f"with all {L} layers (= ferry plan's), step {on['predicted']['step_ms']:.4f} ms")
PY

# 4. No device kernel for fp32 master + fp32 states: refused, naming the way out.
set +e
"$FERRY" "${plan[@]}" --batch-size 4 --gpu-mem-gb 1 --device-update-layers 2 > /dev/null \
  2> "$TMP/r.err"; rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "no kernel for fp32 master + fp32 states" "$TMP/r.err" ||
  { echo "plan_tail: fp32 + fp32 tail: rc=$rc"; cat "$TMP/r.err"; exit 1; }
# 5. The plan's model: Qwen2 (q/k/v biases, no q/k norm) of the same shapes.
mkdir -p "$TMP/m2"
python3 - "$TMP/m/config.json" "$TMP/m2/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"})
c.pop("attention_bias", None)
json.dump(c, open(sys.argv[2], "w"))
PY
plan2=(plan --model "$TMP/m2" "${plan[@]:3}")
"$FERRY" "${plan2[@]}" --batch-size auto --max-batch 64 --gpu-mem-gb 0.004194304 "${optim[@]}" \
  "${tail[@]}" --json "$TMP/q2.json" > /dev/null 2> "$TMP/q2.log" ||
  { echo "plan_tail: qwen2 plan failed"; cat "$TMP/q2.log"; exit 1; }
read -r with staging <<< "$(executor_bytes "$TMP/q2.log")"
for arch in qwen2 qwen3; do
  "$FERRY" "${bench[@]}" --arch "$arch" --batch-size auto --max-batch 64 --device-budget-mib 4 \
    "${optim[@]}" "${tail[@]}" --policies "plan=$TMP/q2.json" --json "$TMP/b_$arch.json" \
    > "$TMP/b_$arch.log" 2>&1 ||
    { echo "plan_tail: bench --arch $arch failed"; cat "$TMP/b_$arch.log"; exit 1; }
done
python3 - "$TMP/q2.json" "$TMP/b_qwen2.json" "$TMP/b_qwen3.json" "$with" <<'PY'
import json, sys
plan, same, other = (json.load(open(p)) for p in sys.argv[1:4])
want = int(sys.argv[4])
assert plan.get("model", {}).get("model_type") == "qwen2", plan.get("model")
assert plan["model"]["qkv_bias"], plan["model"]
homes = {b["home"] for b in plan["boundaries"]}
assert len(homes) > 1, homes  # a mixed plan at this cap
p = same["policies"][0]
assert "error" not in p, p
assert p["batch_size"] == plan["batch_size"] == p["plan_batch"], (p["batch_size"], plan["batch_size"])
assert p["device_planned_bytes"] == want, (p["device_planned_bytes"], want)
q = other["policies"][0]
assert "error" in q and "solved for another model" in q["error"] and "model_type" in q["error"], q
print(f"plan_tail: a qwen2 plan (batch {plan['batch_size']}, homes {sorted(homes)}) runs at its "
      f"batch with ferry plan's {want} bytes under --arch qwen2; a qwen3 bench refuses it")
PY

# 6. The tail as the planner's choice.
train_auto=(train --demo-layers 4 --demo-hidden 32 --seq-len 128 --batch-size 4 --max-steps 1
            --resident-layers 0 --eval-every 0 --seed 11 --device-budget-mib 3000 "${optim[@]}")
"$FERRY" "${train_auto[@]}" --plan auto --device-update-layers auto --output-dir "$TMP/ra" \
  > "$TMP/ra.log" 2> "$TMP/ra.err" ||
  { echo "plan_tail: train --plan auto --device-update-layers auto failed"; cat "$TMP/ra.err"; exit 1; }
caps=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["problem"]; print(repr(p["gpu_cap_gb"]), repr(p["host_cap_gb"]))' "$TMP/ra/plan.json")
read -r gpu host <<< "$caps"
"$FERRY" plan --model "$TMP/ra" --seq-len 128 --batch-size 4 --gpu-mem-gb "$gpu" --host-mem-gb "$host" \
  --executor-device cpu "${optim[@]}" --device-update-layers auto --no-policies --resident-layers 0 \
  --json "$TMP/pa.json" > "$TMP/pa.out" 2> "$TMP/pa.log" ||
  { echo "plan_tail: ferry plan --device-update-layers auto failed"; cat "$TMP/pa.log"; exit 1; }
k=$(python3 - "$TMP/ra/plan.json" "$TMP/pa.json" "$TMP/r1/plan.json" <<'PY'
import json, sys
run, ref, full = (json.load(open(p)) for p in sys.argv[1:4])
k = ref["device_update_layers"]
assert run["device_update_layers"] == k, (run["device_update_layers"], k)
assert ref["problem"].get("device_update_layers", 0) == k, ref["problem"]
assert run["problem"] == ref["problem"] and run["boundaries"] == ref["boundaries"]
for key in ("step_ms", "optimizer_wait_ms", "optimizer_phase_ms", "gpu_peak_gb"):
    assert run["predicted"][key] == ref["predicted"][key], (key, run["predicted"][key], ref["predicted"][key])
# The choice is the best: no slower than the plan solved with every layer allowed (section 3),
# up to ferry plan's MIP gap (--mip-gap, 1e-3 of the objective).
assert ref["predicted"]["objective_ms"] <= full["predicted"]["objective_ms"] * (1 + 1e-3), \
    (ref["predicted"]["objective_ms"], full["predicted"]["objective_ms"])
assert ref["problem"]["device_update_staging_gb"] > 0, ref["problem"]
print(k)
PY
)
grep -q "^device optimizer tail: $k (auto" "$TMP/pa.out" ||
  { echo "plan_tail: ferry plan's text does not name the tail $k"; cat "$TMP/pa.out"; exit 1; }
if [ "$k" -gt 0 ]; then
  grep -q "device optimizer tail of $k layers (the plan's" "$TMP/ra.err" ||
    { echo "plan_tail: train --plan auto did not run the plan's tail $k"; cat "$TMP/ra.err"; exit 1; }
  # A plan file's tail runs without the flag; a given K that differs is warned about.
  "$FERRY" "${train_auto[@]}" --plan "$TMP/pa.json" --output-dir "$TMP/rf" > /dev/null \
    2> "$TMP/rf.err" || { echo "plan_tail: train --plan FILE failed"; cat "$TMP/rf.err"; exit 1; }
  grep -q "device optimizer tail of $k layers (the plan's" "$TMP/rf.err" ||
    { echo "plan_tail: train --plan FILE did not run the plan's tail"; cat "$TMP/rf.err"; exit 1; }
  "$FERRY" "${train_auto[@]}" --plan "$TMP/pa.json" --device-update-layers 0 \
    --output-dir "$TMP/rg" > /dev/null 2> "$TMP/rg.err" ||
    { echo "plan_tail: train --plan FILE --device-update-layers 0 failed"; cat "$TMP/rg.err"; exit 1; }
  grep -q "was solved for --device-update-layers $k, this run uses 0" "$TMP/rg.err" ||
    { echo "plan_tail: a given K unlike the plan's is not warned about"; cat "$TMP/rg.err"; exit 1; }
fi
echo "plan_tail: --device-update-layers auto: ferry plan and train --plan auto chose K = $k"
# fp32 master + fp32 states: no device kernel, auto means 0 (not a refusal).
"$FERRY" "${plan[@]}" --batch-size 4 --gpu-mem-gb 1 --device-update-layers auto --json "$TMP/pz.json" \
  > "$TMP/pz.out" 2> "$TMP/pz.log" || { echo "plan_tail: auto with fp32 failed"; cat "$TMP/pz.log"; exit 1; }
grep -q "^device optimizer tail: 0 (auto: no device kernel" "$TMP/pz.out" ||
  { echo "plan_tail: auto with fp32 + fp32 is not 0"; cat "$TMP/pz.out"; exit 1; }
# Without a plan, auto is refused.
set +e
"$FERRY" "${train_auto[@]}" --executor stream --device-update-layers auto --output-dir "$TMP/rn" \
  > /dev/null 2> "$TMP/rn.err"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "auto needs --plan" "$TMP/rn.err" ||
  { echo "plan_tail: --device-update-layers auto without --plan: rc=$rc"; cat "$TMP/rn.err"; exit 1; }

# 7. A measured device time per layer. The session-17 H200 report (Qwen2.5-3B shapes) with a
# tail run added beside its device run: 40 units, busy 1.2 s (30 ms per layer; one unit 47 ms),
# 32 GB up (0.8 GB per unit).
R17="$ROOT/bench/plan/results/h200_2026-12-02_s17_profile_bench_qwen2.5-3b_device_host.json"
python3 - "$R17" "$TMP/tb.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = dict(next(p for p in r["policies"] if p["policy"] == "device"))
t["policy"] = "plan=tail.json"
t.update({"device_update_units": 40, "device_update_units_per_step": 10.0,
          "device_update_busy_s": 1.2, "device_update_unit_ms_mean": 47.0,
          "device_update_h2d_bytes": 40 * 8e8, "device_update_slots": 2})
r["policies"].append(t)
json.dump(r, open(sys.argv[2], "w"))
PY
"$FERRY" plan --from-bench "$TMP/tb.json" --write-profile "$TMP/tp.json" > "$TMP/tb.out" \
  2> "$TMP/tb.err" || { echo "plan_tail: from-bench with a tail run failed"; cat "$TMP/tb.err"; exit 1; }
grep -q "^device optimizer tail: 30.00 ms and 0.800 GB H2D per layer (.*plan=tail.json" "$TMP/tb.out" ||
  { echo "plan_tail: the profile does not carry the tail"; cat "$TMP/tb.out"; exit 1; }
geo=(plan --geometry qwen2.5-3b --seq-len 1024 --batch-size 4 --gpu-mem-gb 80 --host-mem-gb 200
     --executor-device none --resident-layers 0 --no-policies --time-limit-s 5
     --device-update-layers all --profile "$TMP/tp.json")
"$FERRY" "${geo[@]}" --json "$TMP/tm.json" > /dev/null 2> "$TMP/tm.err" ||
  { echo "plan_tail: plan with the tail's profile failed"; cat "$TMP/tm.err"; exit 1; }
"$FERRY" "${geo[@]}" --device-update-ms-per-layer 9 --json "$TMP/tn.json" > /dev/null \
  2> "$TMP/tn.err" || { echo "plan_tail: plan with a given ms failed"; cat "$TMP/tn.err"; exit 1; }
"$FERRY" "${train_auto[@]}" --plan auto --device-update-layers all --device-update-ms-per-layer 7.5 \
  --output-dir "$TMP/rm" > /dev/null 2> "$TMP/rm.err" ||
  { echo "plan_tail: train --plan auto --device-update-ms-per-layer failed"; cat "$TMP/rm.err"; exit 1; }
python3 - "$TMP/tm.json" "$TMP/tn.json" "$TMP/rm/plan.json" <<'PY'
import json, sys
prof, given, train = (json.load(open(p))["problem"] for p in sys.argv[1:4])
assert prof["device_update_ms_per_layer"] == 30.0, prof.get("device_update_ms_per_layer")
assert prof["device_update_h2d_gb_per_layer"] == 0.8, prof.get("device_update_h2d_gb_per_layer")
assert given["device_update_ms_per_layer"] == 9.0 and given["device_update_h2d_gb_per_layer"] == 0.8
assert train["device_update_ms_per_layer"] == 7.5, train.get("device_update_ms_per_layer")
PY
set +e
"$FERRY" "${train_auto[@]}" --executor stream --device-update-ms-per-layer 7.5 --output-dir "$TMP/rx" \
  > /dev/null 2> "$TMP/rx.err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "needs --plan auto" "$TMP/rx.err" ||
  { echo "plan_tail: --device-update-ms-per-layer without --plan auto: rc=$rc"; cat "$TMP/rx.err"; exit 1; }
echo "plan_tail: a measured device time per layer: from the bench into the profile and the plan"

echo "plan tail cli: ok"
