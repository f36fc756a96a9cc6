#!/usr/bin/env bash
# The disk as the executor used it, from `ferry bench train` into `ferry plan --from-bench`'s
# profile (issue #7; docs/plan.md "Predicted vs measured on the GPU", session 32):
#  1. `ferry plan` for the bench's built-in model at caps that leave room for only a few
#     boundaries in GPU and host memory, with an NVMe tier: the plan homes some on NVMe (checked);
#  2. `ferry bench train` (CPU) runs `device` and that plan: the plan's run reports its NVMe bytes
#     per step, the seconds its host spent in the disk calls and the rates = bytes / seconds; the
#     device run moved nothing to NVMe and reports 0;
#  3. `ferry plan --from-bench` writes a profile whose NVMe rates are the plan run's, and says so
#     in its measured_by; from the device run alone the profile keeps the machine's rates;
#  4. `ferry plan --evaluate` prices the plan again at the run's disk rates (and at given ones),
#     next to the run's measured step, and refuses what it cannot price.
# ctest-cost: 20 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"
export TMPDIR="$TMP"  # the bench's NVMe records (ferry_bench_train_nvme) stay in here
mkdir -p "$TMP/nvme"
source "$ROOT/tests/cli/lib/bench_model_dir.sh"
source "$ROOT/tests/cli/lib/probe_caps.sh"
bench_model_dir "$TMP/m"
plan=(plan --model "$TMP/m" --seq-len 64 --batch-size 4 --executor-device cpu --resident-layers 0
      --no-policies --time-limit-s 10 --nvme-dir "$TMP/nvme" --nvme-gb 1)
bench=(bench train --layers 12 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 64
       --seq-len 64 --batch-size 4 --steps 2 --warmup 1)

# 1. Sizes from a roomy probe; then GPU room for 5 boundaries beside the fixed part (fewer leave
#    the CPU executor's own count no room) and host room for the state, the NVMe bounce buffer and
#    one boundary.
"$FERRY" "${plan[@]}" --gpu-mem-gb 1 --host-mem-gb 8 --json "$TMP/probe.json" \
  > "$TMP/probe.out" 2> "$TMP/probe.err" ||
  { echo "plan_nvme_from_bench: probe plan failed"; cat "$TMP/probe.err"; exit 1; }
read -r gpu host < <(probe_caps "$TMP/probe.json" 5 2)
"$FERRY" "${plan[@]}" --gpu-mem-gb "$gpu" --host-mem-gb "$host" --json "$TMP/p.json" \
  > "$TMP/p.out" 2> "$TMP/p.err" ||
  { echo "plan_nvme_from_bench: plan at gpu $gpu GB, host $host GB failed"; cat "$TMP/p.err"; exit 1; }
python3 - "$TMP/p.json" <<'PY'
import json, sys
homes = [b["home"] for b in json.load(open(sys.argv[1]))["boundaries"]]
assert "nvme" in homes, f"plan_nvme_from_bench: the plan has no NVMe home: {homes}"
PY

# 2. The bench: the plan's run reports its disk time and rates.
"$FERRY" "${bench[@]}" --policies "device,plan=$TMP/p.json" --json "$TMP/r.json" \
  > "$TMP/r.log" 2>&1 || { echo "plan_nvme_from_bench: bench failed"; cat "$TMP/r.log"; exit 1; }
python3 - "$TMP/r.json" <<'PY'
import json, sys
runs = {p["policy"].split("=")[0]: p for p in json.load(open(sys.argv[1]))["policies"]}
dev, plan = runs["device"], runs["plan"]
assert "error" not in plan, plan.get("error")
for d in ("write", "read"):
    b, s, g = (plan[f"nvme_{d}_bytes_per_step"], plan[f"nvme_{d}_s_per_step"],
               plan[f"nvme_{d}_gbps"])
    assert b > 0 and s > 0, f"plan run: nvme {d} {b} bytes in {s} s per step"
    assert abs(g - b / s / 1e9) <= 1e-9 * g, f"plan run: nvme_{d}_gbps {g} != {b} / {s} / 1e9"
    assert dev[f"nvme_{d}_bytes_per_step"] == 0 and dev[f"nvme_{d}_s_per_step"] == 0 \
        and dev[f"nvme_{d}_gbps"] == 0, f"device run moved NVMe bytes: {dev}"
print(f"plan_nvme_from_bench: the plan run's disk: write {plan['nvme_write_gbps']:.3f} GB/s, "
      f"read {plan['nvme_read_gbps']:.3f} GB/s", file=sys.stderr)
PY

# 3. The profile takes the plan run's rates; from the device run alone, the machine's.
"$FERRY" plan --from-bench "$TMP/r.json" --write-profile "$TMP/prof.json" \
  > "$TMP/fb.out" 2> "$TMP/fb.err" ||
  { echo "plan_nvme_from_bench: from-bench failed"; cat "$TMP/fb.err"; exit 1; }
python3 - "$TMP/r.json" "$TMP/prof.json" "$TMP/dev_only.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
plan = next(p for p in rep["policies"] if p["policy"].startswith("plan="))
prof = json.load(open(sys.argv[2]))
for d in ("write", "read"):
    assert prof["link"][f"nvme_{d}_gbps"] == plan[f"nvme_{d}_gbps"], (prof["link"], d)
assert "NVMe rates: the executor's disk calls in policy plan=" in prof["measured_by"], \
    prof["measured_by"]
rep["policies"] = [p for p in rep["policies"] if p["policy"] == "device"]
json.dump(rep, open(sys.argv[3], "w"))
PY
"$FERRY" plan --from-bench "$TMP/dev_only.json" --write-profile "$TMP/prof_dev.json" \
  > "$TMP/fb2.out" 2> "$TMP/fb2.err" ||
  { echo "plan_nvme_from_bench: from-bench (device only) failed"; cat "$TMP/fb2.err"; exit 1; }
python3 - "$TMP/r.json" "$TMP/prof_dev.json" <<'PY'
import json, sys
plan = next(p for p in json.load(open(sys.argv[1]))["policies"] if p["policy"].startswith("plan="))
prof = json.load(open(sys.argv[2]))
assert "NVMe rates" not in prof["measured_by"], prof["measured_by"]
assert prof["link"]["nvme_write_gbps"] != plan["nvme_write_gbps"], prof["link"]
PY
# 4. `ferry plan --evaluate`: the plan priced again at the disk rates its run measured, beside the
#    measured step; at explicit rates; refused without --evaluate, and for a document without its
#    problem or not JSON.
"$FERRY" plan --evaluate "$TMP/p.json" --from-bench "$TMP/r.json" --json "$TMP/e.json" \
  > "$TMP/e.out" 2> "$TMP/e.err" ||
  { echo "plan_nvme_from_bench: --evaluate failed"; cat "$TMP/e.err"; exit 1; }
"$FERRY" plan --evaluate "$TMP/p.json" --nvme-read-gbps 0.5 --nvme-write-gbps 0.25 \
  --json "$TMP/e2.json" > "$TMP/e2.out" 2> "$TMP/e2.err" ||
  { echo "plan_nvme_from_bench: --evaluate at given rates failed"; cat "$TMP/e2.err"; exit 1; }
python3 - "$TMP/p.json" "$TMP/r.json" "$TMP/e.json" "$TMP/e2.json" "$TMP/e.out" <<'PY'
import json, sys
P, R, E, E2 = (json.load(open(f)) for f in sys.argv[1:5])
out = open(sys.argv[5]).read()
run = next(p for p in R["policies"] if p["policy"].startswith("plan="))
solved = P["predicted"]["step_ms"]
assert abs(E["as_solved"]["step_ms"] - solved) <= 1e-9 * solved, (E["as_solved"]["step_ms"], solved)
assert E["solved_rates"] == P["problem"]["link"], (E["solved_rates"], P["problem"]["link"])
for d in ("write", "read"):
    assert E["rates"][f"nvme_{d}_gbps"] == run[f"nvme_{d}_gbps"], (E["rates"], d)
assert E["measured_step_ms"] == run["step_ms_mean"], (E["measured_step_ms"], run["step_ms_mean"])
fp = run["plan_fingerprint"]  # the run names the document it ran
assert isinstance(fp, str) and len(fp) == 16 and int(fp, 16) >= 0, fp
for k, pred in (("error_as_solved", E["as_solved"]), ("error_re_priced", E["re_priced"])):
    want = pred["step_ms"] / run["step_ms_mean"] - 1
    assert abs(E[k] - want) <= 1e-12, (k, E[k], want)
# The plan's decisions, the report's rates: the NVMe terms move with the rates, memory does not.
if E["rates"] != E["solved_rates"]:
    assert E["re_priced"]["nvme_store_ms"] != E["as_solved"]["nvme_store_ms"], E
assert E["re_priced"]["gpu_peak_gb"] == E["as_solved"]["gpu_peak_gb"]
assert "measured:" in out and "re-priced" in out, out
# Slower disk than either: every NVMe term and the step grow.
assert E2["rates"]["nvme_read_gbps"] == 0.5 and E2["rates"]["nvme_write_gbps"] == 0.25, E2["rates"]
assert E2["re_priced"]["nvme_store_ms"] > E2["as_solved"]["nvme_store_ms"], E2
assert E2["re_priced"]["nvme_fetch_ms"] > E2["as_solved"]["nvme_fetch_ms"], E2
assert E2["re_priced"]["step_ms"] > E2["as_solved"]["step_ms"], E2
assert "measured_step_ms" not in E2
print(f"plan_nvme_from_bench: --evaluate: solved {solved:.1f} ms, at the run's disk rates "
      f"{E['re_priced']['step_ms']:.1f} ms, measured {run['step_ms_mean']:.1f} ms", file=sys.stderr)
PY
# Another document with the same predicted step (the plan plus one key) is not the run's plan:
# re-priced, but with no measured step beside it.
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['note']='a copy'; \
json.dump(d, open(sys.argv[2], 'w'))" "$TMP/p.json" "$TMP/pcopy.json"
"$FERRY" plan --evaluate "$TMP/pcopy.json" --from-bench "$TMP/r.json" --json "$TMP/e3.json" \
  > "$TMP/e3.out" 2> "$TMP/e3.err" ||
  { echo "plan_nvme_from_bench: --evaluate of a copy failed"; cat "$TMP/e3.err"; exit 1; }
python3 - "$TMP/e3.json" "$TMP/e3.out" <<'PY'
import json, sys
E3 = json.load(open(sys.argv[1]))
assert "measured_step_ms" not in E3, E3
assert "measured: no run of" in open(sys.argv[2]).read()
PY
expect_fail() {  # expect_fail NAME PATTERN ARGS...: exit 1 and PATTERN on stderr
  local name="$1" pattern="$2"; shift 2
  if "$FERRY" "$@" > "$TMP/f.out" 2> "$TMP/f.err"; then
    echo "plan_nvme_from_bench: $name: expected a failure"; exit 1
  fi
  grep -q -- "$pattern" "$TMP/f.err" ||
    { echo "plan_nvme_from_bench: $name: no '$pattern' in:"; cat "$TMP/f.err"; exit 1; }
}
expect_fail "rates without --evaluate" "go with --evaluate" plan --from-bench "$TMP/r.json" \
  --nvme-read-gbps 2
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('problem'); \
json.dump(d, open(sys.argv[2], 'w'))" "$TMP/p.json" "$TMP/noproblem.json"
expect_fail "no problem" 'has no "problem"' plan --evaluate "$TMP/noproblem.json"
head -c 100 "$TMP/p.json" > "$TMP/cut.json"
expect_fail "cut document" "cut.json" plan --evaluate "$TMP/cut.json"
expect_fail "bench report as plan" "plan json" plan --evaluate "$TMP/r.json"
echo '{"bench": "train"}' > "$TMP/nopolicies.json"
expect_fail "report without policies" 'no "policies" array' plan --evaluate "$TMP/p.json" \
  --from-bench "$TMP/nopolicies.json"
echo "plan_nvme_from_bench: ok"
