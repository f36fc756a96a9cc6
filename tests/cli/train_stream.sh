#!/usr/bin/env bash
# `ferry train --executor stream --policy every:2` on the embedded task:
#  1. the same per-step losses and gradient norms (metrics JSONL) and the same exported weights
#     as `--executor memory`;
#  2. a stream run SIGKILLed mid-way and resumed from its newest checkpoint reproduces the
#     uninterrupted stream run's losses and final weights (model.safetensors bytes);
#  3. a batch over --device-budget-mib exits non-zero naming the largest batch that fits, and
#     that batch does run under the same budget.
#  Also: kept layer internals (--policy ...+keep:LIST) give the memory executor's losses and
#  weights, and `ferry bench train` reports one re-forward less per kept layer.
# ctest-cost: 400 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
base=(--demo-layers 4 --demo-hidden 32 --seq-len 128 --eval-every 0 --seed 11 --lr 3e-3
      --warmup-steps 3 --max-grad-norm 0.5)
common=("${base[@]}" --batch-size 4 --max-steps 24)
stream=(--executor stream --policy every:2 --prefetch 2)

compare_losses() {  # reference.jsonl candidate.jsonl what
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def steps(p):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(p))
            if r["type"] == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert b, f"{sys.argv[3]}: no step lines"
for s, v in b.items():
    assert a[s] == v, (sys.argv[3], s, a[s], v)
print(f"train_stream: {sys.argv[3]}: steps {min(b)}..{max(b)} identical")
PY
}

# 1. stream == memory.
"$FERRY" train "${common[@]}" --output-dir "$TMP/mem" --metrics-out "$TMP/mem.jsonl" \
  > "$TMP/mem.log" 2> "$TMP/mem.err"
"$FERRY" train "${common[@]}" "${stream[@]}" --output-dir "$TMP/a" --metrics-out "$TMP/a.jsonl" \
  > "$TMP/a.log" 2> "$TMP/a.err"
grep -q "executor: stream on cpu | f32 GEMMs | f32 weights | f32 grads | policy every:2" "$TMP/a.log" "$TMP/a.err" ||
  { echo "train_stream: the stream executor did not run"; cat "$TMP/a.log" "$TMP/a.err"; exit 1; }
[ "$(grep -c '"type":"step"' "$TMP/a.jsonl")" = 24 ] || { echo "expected 24 step lines"; exit 1; }
compare_losses "$TMP/mem.jsonl" "$TMP/a.jsonl" "stream vs memory"
cmp "$TMP/mem/model.safetensors" "$TMP/a/model.safetensors" ||
  { echo "train_stream: stream and memory executors export different weights"; exit 1; }

# 1b. --weights-dtype bf16 (an fp32 master computing with, and streaming, its bf16 rounding):
#     stream == memory again, and the run differs from the f32-weights one.
"$FERRY" train "${common[@]}" --weights-dtype bf16 --output-dir "$TMP/mem16" \
  --metrics-out "$TMP/mem16.jsonl" > "$TMP/mem16.log" 2> "$TMP/mem16.err"
"$FERRY" train "${common[@]}" "${stream[@]}" --weights-dtype bf16 --output-dir "$TMP/a16" \
  --metrics-out "$TMP/a16.jsonl" > "$TMP/a16.log" 2> "$TMP/a16.err"
grep -q "executor: stream on cpu | f32 GEMMs | bf16 weights | f32 grads | policy every:2" "$TMP/a16.log" \
  "$TMP/a16.err" || { echo "train_stream: bf16 weights not in use"; cat "$TMP/a16.err"; exit 1; }
compare_losses "$TMP/mem16.jsonl" "$TMP/a16.jsonl" "bf16 weights: stream vs memory"
cmp "$TMP/mem16/model.safetensors" "$TMP/a16/model.safetensors" ||
  { echo "train_stream: bf16 weights: stream and memory export different weights"; exit 1; }
if cmp -s "$TMP/a/model.safetensors" "$TMP/a16/model.safetensors"; then
  echo "train_stream: --weights-dtype bf16 changed nothing"; exit 1
fi

# 1c. --grad-dtype bf16 (gradients kept and moved as bf16, rounded after every micro-batch):
#     stream == memory, and the run differs from the f32-gradient one.
"$FERRY" train "${common[@]}" --grad-dtype bf16 --output-dir "$TMP/memg" \
  --metrics-out "$TMP/memg.jsonl" > "$TMP/memg.log" 2> "$TMP/memg.err"
"$FERRY" train "${common[@]}" "${stream[@]}" --grad-dtype bf16 --output-dir "$TMP/ag" \
  --metrics-out "$TMP/ag.jsonl" > "$TMP/ag.log" 2> "$TMP/ag.err"
grep -q "executor: stream on cpu | f32 GEMMs | f32 weights | bf16 grads | policy every:2" \
  "$TMP/ag.log" "$TMP/ag.err" || { echo "train_stream: bf16 grads not in use"; cat "$TMP/ag.err"; exit 1; }
compare_losses "$TMP/memg.jsonl" "$TMP/ag.jsonl" "bf16 grads: stream vs memory"
cmp "$TMP/memg/model.safetensors" "$TMP/ag/model.safetensors" ||
  { echo "train_stream: bf16 grads: stream and memory export different weights"; exit 1; }
if cmp -s "$TMP/a/model.safetensors" "$TMP/ag/model.safetensors"; then
  echo "train_stream: --grad-dtype bf16 changed nothing"; exit 1
fi

# 1d. Kept layer internals (+keep:LIST, #7): layer 1 recomputed in its span and kept, layer 3 on
#     top of its span; still the memory executor's losses and weights.
"$FERRY" train "${common[@]}" --executor stream --policy every:2+keep:1,3 --prefetch 2 \
  --output-dir "$TMP/ak" --metrics-out "$TMP/ak.jsonl" > "$TMP/ak.log" 2> "$TMP/ak.err"
grep -q "policy every:2+keep:1,3 = drdr keep 1,3" "$TMP/ak.log" "$TMP/ak.err" ||
  { echo "train_stream: the keep policy did not run"; cat "$TMP/ak.log" "$TMP/ak.err"; exit 1; }
compare_losses "$TMP/mem.jsonl" "$TMP/ak.jsonl" "kept internals: stream vs memory"
cmp "$TMP/mem/model.safetensors" "$TMP/ak/model.safetensors" ||
  { echo "train_stream: kept internals: stream and memory export different weights"; exit 1; }

# 2. SIGKILL mid-way, resume.
"$FERRY" train "${common[@]}" "${stream[@]}" --output-dir "$TMP/b" --save-every 4 \
  > "$TMP/b1.log" 2> "$TMP/b1.err" &
pid=$!
for _ in $(seq 1 6000); do
  [ -d "$TMP/b/checkpoint-8" ] && break
  sleep 0.01
done
kill -9 "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
if [ -f "$TMP/b/model.safetensors" ]; then
  echo "train_stream: the child finished before it was killed; the test did not test anything"
  exit 1
fi
ls "$TMP/b" | grep -q '^checkpoint-' || { echo "no checkpoint written before the kill"; exit 1; }
"$FERRY" train "${common[@]}" "${stream[@]}" --output-dir "$TMP/b" --save-every 4 \
  --resume "$TMP/b" --metrics-out "$TMP/b2.jsonl" > "$TMP/b2.log" 2> "$TMP/b2.err"
python3 - "$TMP/b2.jsonl" <<'PY'
import json, sys
steps = [r["step"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert steps and steps[0] > 1 and steps[-1] == 24, steps
PY
compare_losses "$TMP/a.jsonl" "$TMP/b2.jsonl" "killed + resumed vs uninterrupted"
cmp "$TMP/a/model.safetensors" "$TMP/b/model.safetensors" ||
  { echo "train_stream: weights differ after kill + resume"; exit 1; }

# 3. Over the device budget: refused before training, naming the largest batch that fits.
set +e
"$FERRY" train "${base[@]}" "${stream[@]}" --batch-size 64 --max-steps 24 --device-budget-mib 2 \
  --output-dir "$TMP/c" > "$TMP/c.log" 2> "$TMP/c.err"; rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "train_stream: an over-budget batch was accepted"; exit 1; }
best="$(grep -ho 'the largest batch that fits is [0-9]*' "$TMP/c.log" "$TMP/c.err" | grep -o '[0-9]*$' || true)"
[ -n "$best" ] && [ "$best" -ge 1 ] && [ "$best" -lt 64 ] ||
  { echo "train_stream: no largest batch named"; cat "$TMP/c.log" "$TMP/c.err"; exit 1; }
[ -f "$TMP/c/model.safetensors" ] && { echo "train_stream: refused run wrote weights"; exit 1; }
"$FERRY" train "${base[@]}" "${stream[@]}" --batch-size "$best" --device-budget-mib 2 \
  --max-steps 2 --output-dir "$TMP/d" > "$TMP/d.log" 2> "$TMP/d.err" ||
  { echo "train_stream: the named batch $best does not run under the budget"; cat "$TMP/d.err"; exit 1; }
echo "train_stream: over-budget batch 64 refused, largest batch $best runs"

# 4. --plan auto: a plan is solved for the budget, written next to the run, followed, and the
#    per-window report prints measured next to predicted; without a budget it is refused.
"$FERRY" train "${base[@]}" --plan auto --device-budget-mib 3000 --max-steps 2 \
  --output-dir "$TMP/e" --metrics-out "$TMP/e.jsonl" > "$TMP/e.log" 2> "$TMP/e.err" ||
  { echo "train_stream: --plan auto failed"; cat "$TMP/e.err"; exit 1; }
grep -q '"format": "ferry-plan"' "$TMP/e/plan.json" || { echo "no plan.json written"; exit 1; }
grep -q 'policy plan:solved' "$TMP/e.err" "$TMP/e.log" || { echo "solved plan not run"; exit 1; }
grep -q 'per-window times.*predicted by the plan' "$TMP/e.log" ||
  { echo "train_stream: no per-window report"; cat "$TMP/e.log"; exit 1; }
grep -q '"type":"windows"' "$TMP/e.jsonl" || { echo "no windows record in the metrics"; exit 1; }
set +e
"$FERRY" train "${base[@]}" --plan auto --max-steps 2 --output-dir "$TMP/f" \
  > "$TMP/f.log" 2> "$TMP/f.err"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q 'needs --device-budget-mib' "$TMP/f.err" ||
  { echo "train_stream: --plan auto without a budget not refused clearly"; exit 1; }
# A model too shallow for checkpoint-every-4 still plans (the executor fit skips that policy).
"$FERRY" train --demo-layers 2 --demo-hidden 32 --seq-len 128 --batch-size 2 --max-steps 1 \
  --eval-every 0 --executor stream --plan auto --device-budget-mib 64 --output-dir "$TMP/g" \
  > "$TMP/g.log" 2> "$TMP/g.err" || { echo "train_stream: --plan auto, 2 layers"; cat "$TMP/g.err"; exit 1; }
grep -q 'policy plan:solved' "$TMP/g.err" "$TMP/g.log" || { echo "2-layer plan not run"; exit 1; }
echo "train_stream: --plan auto solved, ran and reported its windows"

# 5. `ferry bench train`: every policy runs, reports throughput and the bytes it moved; the
#    offloading policies move activations, the device policy none; --device cuda without a GPU
#    fails with a clear error (or runs, on a GPU machine).
"$FERRY" bench train --layers 2 --hidden 64 --heads 2 --kv-heads 1 --intermediate 128 \
  --batch-size 2 --seq-len 32 --steps 2 --policies device,every:2:host \
  --json "$TMP/bench.json" > "$TMP/bench.log" 2>&1 ||
  { echo "train_stream: bench train failed"; cat "$TMP/bench.log"; exit 1; }
python3 - "$TMP/bench.json" <<'PY' || { echo "train_stream: bad bench train report"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
p = {x["policy"]: x for x in r["policies"]}
assert set(p) == {"device", "every:2:host"}, p.keys()
for x in p.values():
    assert "error" not in x, x
    assert x["tokens_per_s"] > 0 and x["step_ms_median"] > 0, x
    assert x["weight_h2d_bytes_per_step"] > 0 and x["grad_d2h_bytes_per_step"] > 0, x
    assert len(x["windows"]["measured_ms"]) == 2 * 2 + 1, x["windows"]
assert p["device"]["act_bytes_per_step"] == 0, p["device"]
assert p["every:2:host"]["act_bytes_per_step"] > 0, p["every:2:host"]
assert r["grad_accum"] == 1 and r["gemm_precision"] == "f32", r  # auto on a CPU: f32
PY
# Gradient accumulation streams the weights twice per micro-batch (3 micro-batches: 3x the bytes
# of one), and bf16 GEMMs on the CPU run the twin; the optimizer still runs once per step.
"$FERRY" bench train --layers 2 --hidden 64 --heads 2 --kv-heads 1 --intermediate 128 \
  --batch-size 2 --seq-len 32 --steps 2 --policies device --grad-accum 3 --gemm-precision bf16 \
  --json "$TMP/bench3.json" > "$TMP/bench3.log" 2>&1 ||
  { echo "train_stream: bench train --grad-accum failed"; cat "$TMP/bench3.log"; exit 1; }
python3 - "$TMP/bench.json" "$TMP/bench3.json" <<'PY' || { echo "train_stream: bad accum report"; exit 1; }
import json, sys
one = json.load(open(sys.argv[1]))["policies"][0]
r = json.load(open(sys.argv[2]))
three = r["policies"][0]
assert r["grad_accum"] == 3 and r["gemm_precision"] == "bf16", r
assert three["weight_h2d_bytes_per_step"] > 2.5 * one["weight_h2d_bytes_per_step"], (one, three)
assert three["grad_d2h_bytes_per_step"] > 2.5 * one["grad_d2h_bytes_per_step"], (one, three)
PY
# GPU-resident layers (--resident-layers): the same losses, the resident layers' weights and
# gradients off the link (all: no weight streaming at all), their updates counted, reported.
for k in 0 2 all; do
  "$FERRY" bench train --layers 4 --hidden 64 --heads 2 --kv-heads 1 --intermediate 128 \
    --batch-size 2 --seq-len 32 --steps 2 --grad-accum 2 --policies every:2 \
    --optimizer-states 8bit --resident-layers $k \
    --json "$TMP/benchr$k.json" > "$TMP/benchr$k.log" 2>&1 ||
    { echo "train_stream: bench train --resident-layers $k failed"; cat "$TMP/benchr$k.log"; exit 1; }
done
python3 - "$TMP" <<'PY' || { echo "train_stream: bad resident report"; exit 1; }
import json, sys
p = {k: json.load(open(f"{sys.argv[1]}/benchr{k}.json"))["policies"][0] for k in ("0", "2", "all")}
for k, x in p.items():
    assert "error" not in x, x
assert [p[k]["resident_layers"] for k in ("0", "2", "all")] == [0, 2, 4], p
assert p["0"]["loss_last"] == p["2"]["loss_last"] == p["all"]["loss_last"], p
assert p["0"]["device_resident_bytes"] == 0 < p["2"]["device_resident_bytes"], p
assert p["2"]["weight_h2d_bytes_per_step"] < p["0"]["weight_h2d_bytes_per_step"], p
assert p["all"]["weight_h2d_bytes_per_step"] == 0, p
assert p["2"]["grad_d2h_bytes_per_step"] < p["0"]["grad_d2h_bytes_per_step"], p
assert p["2"]["resident_updates"] == 2 * 3, p  # 2 layers x (1 warmup + 2 timed) steps
PY
# Kept internals through --policies (its commas split the list; the keep list's are put back):
# one layer forward less per kept layer and micro-batch, the same bytes moved and the same
# losses as without, the kept workspaces counted in the device plan.
"$FERRY" bench train --layers 4 --hidden 64 --heads 2 --kv-heads 1 --intermediate 128 \
  --batch-size 2 --seq-len 32 --steps 2 --grad-accum 2 \
  --policies device,device+keep:top:2,every:2,every:2+keep:0,3 \
  --json "$TMP/benchk.json" > "$TMP/benchk.log" 2>&1 ||
  { echo "train_stream: bench train with keeps failed"; cat "$TMP/benchk.log"; exit 1; }
python3 - "$TMP/benchk.json" <<'PY' || { echo "train_stream: bad keep report"; exit 1; }
import json, sys
p = {x["policy"]: x for x in json.load(open(sys.argv[1]))["policies"]}
assert list(p) == ["device", "device+keep:top:2", "every:2", "every:2+keep:0,3"], list(p)
for base, kept, n in (("device", "device+keep:top:2", 2), ("every:2", "every:2+keep:0,3", 2)):
    b, k = p[base], p[kept]
    assert "error" not in b and "error" not in k, (b, k)
    assert b["kept_layers"] == 0 and k["kept_layers"] == n, (b, k)
    # 2 micro-batches per step
    assert k["layer_forwards_per_step"] == b["layer_forwards_per_step"] - 2 * n, (b, k)
    assert k["kept_layer_backwards_per_step"] == 2 * n, k
    assert k["layer_backwards_per_step"] == b["layer_backwards_per_step"] == 2 * 4, (b, k)
    # The re-forward before each backward is internals-only: one per layer not kept and
    # micro-batch; the rest of layer_forwards are full (the forward pass, every:K's recomputes).
    for x, kept_n in ((b, 0), (k, n)):
        assert x["internals_forwards_per_step"] == 2 * (4 - kept_n), x
    full = {"device": 2 * 4, "every:2": 2 * (4 + 2)}[base]
    assert b["layer_forwards_per_step"] - b["internals_forwards_per_step"] == full, b
    assert k["loss_first"] == b["loss_first"] and k["loss_last"] == b["loss_last"], (b, k)
    assert k["weight_h2d_bytes_per_step"] == b["weight_h2d_bytes_per_step"], (b, k)
    assert k["device_kept_bytes"] > 0 and b["device_kept_bytes"] == 0, (b, k)
    assert k["device_planned_bytes"] == b["device_planned_bytes"] + k["device_kept_bytes"], (b, k)
    assert k["device_peak_bytes"] == k["device_planned_bytes"], k
assert p["every:2+keep:0,3"]["describe"] == "every:2+keep:0,3 = drdr keep 0,3", p
print("train_stream: bench train keeps: one re-forward less per kept layer, same losses")
PY
if "$FERRY" bench train --layers 1 --hidden 64 --heads 2 --kv-heads 1 --intermediate 128 \
  --steps 1 --gemm-precision fp8 > "$TMP/bp.log" 2>&1; then
  echo "train_stream: --gemm-precision fp8 accepted"; exit 1
fi
grep -q "gemm-precision" "$TMP/bp.log" ||
  { echo "train_stream: bad --gemm-precision error unclear"; cat "$TMP/bp.log"; exit 1; }
set +e
"$FERRY" bench train --device cuda --layers 1 --hidden 64 --heads 2 --kv-heads 1 \
  --intermediate 128 --steps 1 --seq-len 16 --batch-size 1 > "$TMP/bc.log" 2>&1; rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  grep -qi 'cuda\|gpu\|device' "$TMP/bc.log" ||
    { echo "train_stream: --device cuda failure unclear"; cat "$TMP/bc.log"; exit 1; }
fi
# --batch-size auto under a device cap: each policy gets the largest batch that fits (recompute
# fits more than keeping every boundary), and plan=FILE runs a plan document's homes at its batch.
python3 - "$TMP/plan.json" <<'PY'
import json, sys
homes = ["gpu"] + ["recompute", "host"] * 5 + ["recompute", "gpu"]  # boundaries 0..12
json.dump({"format": "ferry-plan", "num_layers": 12, "batch_size": 2, "seq_len": 64,
           "policy": "hand", "boundaries": [{"boundary": i, "home": h} for i, h in enumerate(homes)],
           "spans": [], "predicted": {"window_compute_ms": [1.0] * 25,
                                      "window_exposed_ms": [0.0] * 25, "step_ms": 12.5}},
          open(sys.argv[1], "w"))
PY
"$FERRY" bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 \
  --intermediate 64 --seq-len 64 --steps 1 --warmup 0 --batch-size auto --max-batch 64 \
  --device-budget-mib 4 --policies "device,every:4,host,plan=$TMP/plan.json" --json "$TMP/ba.json" \
  > "$TMP/ba.log" 2>&1 || { echo "train_stream: bench --batch-size auto failed"; cat "$TMP/ba.log"; exit 1; }
python3 - "$TMP/ba.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = {x["policy"].split("=")[0]: x for x in r["policies"]}
assert r["batch_auto"] and r["device_budget_bytes"] == 4 << 20, r
for x in p.values():
    assert "error" not in x and x["device_planned_bytes"] <= 4 << 20, x
b = {k: x["batch_size"] for k, x in p.items()}
assert b["host"] > b["every:4"] > b["device"] >= 1, b
assert b["plan"] == 2 and p["plan"]["predicted_step_ms"] == 12.5, p["plan"]
assert p["plan"]["describe"].endswith("drhrhrhrhrhr"), p["plan"]["describe"]
PY
if "$FERRY" plan --from-bench "$TMP/ba.json" > /dev/null 2> "$TMP/bf.err"; then
  echo "train_stream: a --batch-size auto report should not give a profile"; exit 1
fi
grep -q "batch-size auto" "$TMP/bf.err" || { cat "$TMP/bf.err"; exit 1; }
echo "train_stream: bench train reported every policy"

# A solved plan fits the executor's own byte count at the batch it was solved for: ferry plan
# sizes GPU memory as the stream executor allocates it (--executor-device). (The cost model's
# estimate, --executor-device none, solved batch 64 for Qwen2.5-3B at 24 GB on the H200, where the
# executor held 25; at this size its reserved CUDA context alone exceeds the cap.)
source "$ROOT/tests/cli/lib/bench_model_dir.sh"
bench_model_dir "$TMP/m"
"$FERRY" plan --model "$TMP/m" --seq-len 64 --batch-size auto --max-batch 64 \
  --gpu-mem-gb 0.004194304 --host-mem-gb 8 --time-limit-s 5 --executor-device cpu \
  --no-policies --json "$TMP/solved.json" > "$TMP/pl.log" 2>&1 ||
  { echo "train_stream: ferry plan --executor-device cpu failed"; cat "$TMP/pl.log"; exit 1; }
"$FERRY" bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 \
  --intermediate 64 --seq-len 64 --steps 1 --warmup 0 --batch-size auto --max-batch 64 \
  --device-budget-mib 4 --policies "host,device,every:4,plan=$TMP/solved.json" \
  --json "$TMP/bs.json" > "$TMP/bs.log" 2>&1 ||
  { echo "train_stream: bench of solved plans failed"; cat "$TMP/bs.log"; exit 1; }
# ... and the planner reaches every batch the executor holds with a fixed policy (the cost
# model's memory fit alone refused all-host at the executor's largest batch: H200, 3B at 24 GB).
planned_largest="$(grep -o 'largest fitting [0-9]*' "$TMP/pl.log" | head -1 | grep -o '[0-9]*$')"
python3 - "$TMP/bs.json" "$planned_largest" <<'PY'
import json, sys
*fixed, fit = json.load(open(sys.argv[1]))["policies"]
assert fit["plan_batch"] >= 2 and fit["largest_fitting_batch"] >= fit["plan_batch"], fit
assert fit["batch_size"] == fit["plan_batch"], fit
best_fixed = max(p["largest_fitting_batch"] for p in fixed)
assert int(sys.argv[2]) >= best_fixed, (sys.argv[2], [(p["policy"], p["largest_fitting_batch"]) for p in fixed])
print(f"train_stream: solved plan batch {fit['plan_batch']} fits the executor "
      f"(largest {fit['largest_fitting_batch']}); the planner's largest {sys.argv[2]} >= "
      f"the fixed policies' {best_fixed}")
PY
# A solved plan that keeps layer internals (#7): on a GPU-bound profile (written here: 10 ms
# forwards, the CPU optimizer 1 ms) with room under a 5 MiB cap the planner keeps layers; the
# executor's byte count it logs for that plan equals the bench's device_planned_bytes (kept
# workspaces included) and fits the cap, and the bench runs the plan's keeps (one re-forward less
# per kept layer). --no-keep-internals keeps none.
python3 - "$TMP/kprof.json" <<'PY'
import json, sys
json.dump({"format": "ferry-plan-profile", "version": 1, "machine": "h200",
           "geometry": "qwen3-L12-C64-F64-H4-KV2-D16-V259-E0", "batch_size": 2, "seq_len": 64,
           "measured_by": "hand (train_stream.sh)",
           "layers": [{"fwd_ms": 10.0, "bwd_ms": 20.0, "rec_ms": 10.0}] * 12,
           "loss_ms": 5.0, "cpu_optimizer_ms": 1.0,
           "link": {"h2d_gbps": 50, "d2h_gbps": 50, "duplex_gbps": 90, "duplex_loaded_gbps": 80,
                    "nvme_read_gbps": 5, "nvme_write_gbps": 4}}, open(sys.argv[1], "w"))
PY
kplan=("$FERRY" plan --model "$TMP/m" --profile "$TMP/kprof.json" --seq-len 64 --batch-size 2
  --gpu-mem-gb 0.00524288 --host-mem-gb 8 --time-limit-s 5 --executor-device cpu --no-policies)
"${kplan[@]}" --json "$TMP/keep.json" > "$TMP/kp.log" 2>&1 ||
  { echo "train_stream: ferry plan (keeps) failed"; cat "$TMP/kp.log"; exit 1; }
"${kplan[@]}" --no-keep-internals --json "$TMP/nokeep.json" > "$TMP/nkp.log" 2>&1 ||
  { echo "train_stream: ferry plan --no-keep-internals failed"; cat "$TMP/nkp.log"; exit 1; }
grep -q "kept internals: none" "$TMP/nkp.log" ||
  { echo "train_stream: --no-keep-internals kept layers"; cat "$TMP/nkp.log"; exit 1; }
"$FERRY" bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 \
  --intermediate 64 --seq-len 64 --steps 1 --warmup 0 --batch-size 2 --device-budget-mib 5 \
  --policies "plan=$TMP/keep.json,plan=$TMP/nokeep.json" --json "$TMP/bkeep.json" \
  > "$TMP/bkeep.log" 2>&1 || { echo "train_stream: bench of a keep plan failed"; cat "$TMP/bkeep.log"; exit 1; }
logged="$(grep -o 'executor gpu bytes [0-9]*' "$TMP/kp.log" | head -1 | grep -o '[0-9]*$')"
python3 - "$TMP/keep.json" "$TMP/bkeep.json" "$logged" <<'PY'
import json, sys
plan, rep, logged = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
kept = sum(plan["keep_internals"])
keep, nokeep = rep["policies"]
assert 1 <= kept <= 12, plan["keep_internals"]
assert "error" not in keep and "error" not in nokeep, rep
assert keep["kept_layers"] == kept, (keep["kept_layers"], kept)
assert keep["device_planned_bytes"] == logged <= 5 << 20, (keep["device_planned_bytes"], logged)
assert keep["device_kept_bytes"] > 0 and nokeep["device_kept_bytes"] == 0, rep
assert keep["layer_forwards_per_step"] == nokeep["layer_forwards_per_step"] - kept, rep
print(f"train_stream: the solved plan keeps {kept} of 12 layers; the executor holds it in "
      f"{logged} bytes (5 MiB cap), {kept} re-forwards fewer than the same plan without keeps")
PY

echo "train stream cli: ok"
