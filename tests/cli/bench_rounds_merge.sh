#!/usr/bin/env bash
# scripts/lib/merge_bench_rounds.py (gpu_plan_caps.sh ROUNDS=R): two real `ferry bench train`
# runs of the same policies in rotated order merge into one report whose per-policy step is the
# mean of the rounds' steps, whose tokens/s and TFLOPS follow from it, in the first round's policy
# order, with each round's step kept; a policy that failed in a round stays an error.
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
bench=(bench train --layers 4 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 64
       --seq-len 64 --batch-size 2 --steps 2 --warmup 0)
"$FERRY" "${bench[@]}" --policies every:2,device,host --json "$TMP/r1.json" > "$TMP/r1.out" 2>&1 ||
  { echo "bench_rounds_merge: round 1 failed"; cat "$TMP/r1.out"; exit 1; }
"$FERRY" "${bench[@]}" --policies device,host,every:2 --json "$TMP/r2.json" > "$TMP/r2.out" 2>&1 ||
  { echo "bench_rounds_merge: round 2 failed"; cat "$TMP/r2.out"; exit 1; }
python3 "$ROOT/scripts/lib/merge_bench_rounds.py" "$TMP/m.json" "$TMP/r1.json" "$TMP/r2.json"
python3 - "$TMP/m.json" "$TMP/r1.json" "$TMP/r2.json" <<'PY'
import json, sys
m, r1, r2 = (json.load(open(p)) for p in sys.argv[1:4])
assert m["rounds"] == 2
names = [p["policy"] for p in m["policies"]]
assert names == ["every:2", "device", "host"], names
one = {p["policy"]: p for p in r1["policies"]}
two = {p["policy"]: p for p in r2["policies"]}
for p in m["policies"]:
    a, b = one[p["policy"]], two[p["policy"]]
    want = (a["step_ms_mean"] + b["step_ms_mean"]) / 2
    assert abs(p["step_ms_mean"] - want) < 1e-9 * want, (p["step_ms_mean"], want)
    assert p["rounds_step_ms"] == [a["step_ms_mean"], b["step_ms_mean"]], p["rounds_step_ms"]
    # tokens/s is batch x seq per mean step, as each round's own report has it per its step.
    tokens = p["batch_size"] * m["seq"] * m.get("grad_accum", 1)
    for q in (a, b):
        assert abs(q["tokens_per_s"] - tokens / (q["step_ms_mean"] / 1e3)) < 1e-6 * q["tokens_per_s"], q
    assert abs(p["tokens_per_s"] - tokens / (p["step_ms_mean"] / 1e3)) < 1e-6 * p["tokens_per_s"], p
    assert abs(p["model_tflops"] / p["tokens_per_s"] - a["model_tflops"] / a["tokens_per_s"]) < \
        1e-9 * a["model_tflops"] / a["tokens_per_s"]
print("bench_rounds_merge: 3 policies, 2 rotated rounds: mean steps "
      + ", ".join(f"{p['policy']} {p['step_ms_mean']:.1f} ms" for p in m["policies"]))
PY
# A policy that failed in one round is an error in the merge.
python3 - "$TMP/r2.json" "$TMP/r2bad.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["policies"][0] = {"policy": r["policies"][0]["policy"], "error": "out of memory (a test edit)"}
json.dump(r, open(sys.argv[2], "w"))
PY
python3 "$ROOT/scripts/lib/merge_bench_rounds.py" "$TMP/mb.json" "$TMP/r1.json" "$TMP/r2bad.json"
python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
p = {q["policy"]: q for q in m["policies"]}
assert "error" in p["device"] and "error" not in p["host"], p
' "$TMP/mb.json"
echo "bench rounds merge cli: ok"
