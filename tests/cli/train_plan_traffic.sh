#!/usr/bin/env bash
# `ferry train --plan FILE` does exactly the boundary traffic and recomputes its plan says, counted
# (issue #7; docs/plan.md "Plan traffic report", src/train/stream/plan_traffic.h):
#  1. `ferry plan` for the embedded demo model (8 layers, C 32; its config.json exported by a
#     one-step run) at caps taken from a roomy probe plan's own problem: GPU memory for its fixed
#     part + 3 boundaries, host memory for the model state + the NVMe bounce buffer + 2 boundaries,
#     NVMe plenty. The plan must home boundaries in host memory and on NVMe and recompute some
#     (checked, so that every kind is exercised: a planner change that drops one fails here).
#  2. `ferry train --plan` on the CPU, 2 steps x accumulation 2, NVMe homes under a temp dir: the
#     text says "plan traffic: match", and the metrics' plan_traffic line has measured == expected
#     for every counter, the homes of the plan JSON, and expectations recomputed here from the plan
#     JSON and the steps' token counts (boundary bytes T*C*4 each way per host/NVMe boundary, NVMe
#     records B*S*C*4 rounded up to 4 KiB, one recompute per recomputed boundary), all non-zero.
#  3. Without a plan (--policy every:2) there is no plan traffic report.
# ctest-cost: 15 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"
source "$ROOT/tests/cli/lib/probe_caps.sh"
mkdir -p "$TMP/nvme"
demo=(--demo-layers 8 --demo-hidden 32 --seq-len 128 --batch-size 4 --eval-every 0 --seed 11)

# The demo model's config.json, for ferry plan --model.
"$FERRY" train "${demo[@]}" --max-steps 1 --output-dir "$TMP/m" > "$TMP/m.log" 2> "$TMP/m.err" ||
  { echo "train_plan_traffic: demo export failed"; cat "$TMP/m.err"; exit 1; }
plan=(plan --model "$TMP/m" --seq-len 128 --batch-size 4 --executor-device cpu
      --resident-layers 0 --no-policies --time-limit-s 10 --nvme-dir "$TMP/nvme")

# 1. A roomy probe gives the sizes; the caps leave room for only a few boundaries per tier.
"$FERRY" "${plan[@]}" --gpu-mem-gb 1 --host-mem-gb 8 --nvme-gb 1 --json "$TMP/probe.json" \
  > "$TMP/probe.out" 2> "$TMP/probe.err" ||
  { echo "train_plan_traffic: probe plan failed"; cat "$TMP/probe.err"; exit 1; }
read -r gpu host < <(probe_caps "$TMP/probe.json" 3 3)
"$FERRY" "${plan[@]}" --gpu-mem-gb "$gpu" --host-mem-gb "$host" --nvme-gb 1 --json "$TMP/p.json" \
  > "$TMP/p.out" 2> "$TMP/p.err" ||
  { echo "train_plan_traffic: plan at gpu $gpu GB, host $host GB failed"; cat "$TMP/p.err"; exit 1; }
python3 - "$TMP/p.json" <<'PY' || { cat "$TMP/p.out"; exit 1; }
import json, sys
homes = [b["home"] for b in json.load(open(sys.argv[1]))["boundaries"]]
for kind in ("host", "nvme", "recompute"):
    assert kind in homes, f"train_plan_traffic: the plan has no {kind} boundary: {homes}"
print("train_plan_traffic: plan homes " + " ".join(homes), file=sys.stderr)
PY

# 2. The run follows the plan; the report compares.
"$FERRY" train "${demo[@]}" --max-steps 2 --grad-accum 2 --plan "$TMP/p.json" \
  --nvme-dir "$TMP/nvme" --output-dir "$TMP/t" --metrics-out "$TMP/t.jsonl" \
  > "$TMP/t.log" 2> "$TMP/t.err" ||
  { echo "train_plan_traffic: train --plan failed"; cat "$TMP/t.err"; exit 1; }
grep -q "^plan traffic: match (every counter of all 2 steps)" "$TMP/t.log" ||
  { echo "train_plan_traffic: no match line"; cat "$TMP/t.log" "$TMP/t.err"; exit 1; }
python3 - "$TMP/t.jsonl" "$TMP/p.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
plan = json.load(open(sys.argv[2]))
t = [r for r in rows if r["type"] == "plan_traffic"]
assert len(t) == 1, f"train_plan_traffic: {len(t)} plan_traffic lines"
t = t[0]
exp, got = t["expected"], t["measured"]
assert set(exp) == set(got) and len(exp) == 8, (exp, got)
for k in exp:
    assert exp[k] == got[k], f"train_plan_traffic: {k}: plan {exp[k]}, measured {got[k]}"
assert t["match"] and t["mismatched_steps"] == 0 and t["steps"] == 2 and t["micro_batches"] == 4, t
# The report's plan is the JSON's: homes, and the expectations recomputed from them.
L, B, S = plan["num_layers"], plan["batch_size"], plan["seq_len"]
C = 32
homes = [b["home"] for b in plan["boundaries"]][:L]
n = {k: homes.count(k) for k in ("gpu", "host", "nvme", "recompute")}
assert t["homes"] == {"device": n["gpu"], "host": n["host"], "nvme": n["nvme"],
                      "recompute": n["recompute"]}, (t["homes"], homes)
tokens = sum(r["computed_tokens"] for r in rows if r["type"] == "step")
assert t["tokens"] == tokens, (t["tokens"], tokens)
micro = t["micro_batches"]
record = (B * S * C * 4 + 4095) // 4096 * 4096
kept = sum(1 for k in plan.get("keep_internals", []) if k)
want = {"act_d2h_bytes": (n["host"] + n["nvme"]) * tokens * C * 4,
        "act_h2d_bytes": (n["host"] + n["nvme"]) * tokens * C * 4,
        "nvme_write_bytes": n["nvme"] * record * micro,
        "nvme_read_bytes": n["nvme"] * record * micro,
        "recompute_forwards": n["recompute"] * micro,
        "kept_layers": kept * micro,
        "internals_forwards": (L - kept) * micro,
        "layer_forwards": (L + n["recompute"] + L - kept) * micro}
for k, v in want.items():
    assert got[k] == v, f"train_plan_traffic: {k}: measured {got[k]}, the plan JSON says {v}"
for k in ("act_d2h_bytes", "nvme_write_bytes", "recompute_forwards"):
    assert got[k] > 0, k
print(f"train_plan_traffic: {micro} micro-batches, {tokens} tokens: boundaries out/back "
      f"{got['act_d2h_bytes']} B, nvme write/read {got['nvme_write_bytes']} B, recomputes "
      f"{got['recompute_forwards']}, kept {got['kept_layers']}: measured == plan")
PY

# 3. No plan, no report.
"$FERRY" train "${demo[@]}" --max-steps 1 --executor stream --policy every:2 \
  --output-dir "$TMP/s" --metrics-out "$TMP/s.jsonl" > "$TMP/s.log" 2> "$TMP/s.err" ||
  { echo "train_plan_traffic: stream run without a plan failed"; cat "$TMP/s.err"; exit 1; }
if grep -q "plan traffic" "$TMP/s.log" || grep -q '"plan_traffic"' "$TMP/s.jsonl"; then
  echo "train_plan_traffic: a run without a plan printed a plan traffic report"; exit 1
fi
echo "train plan traffic cli: ok"
