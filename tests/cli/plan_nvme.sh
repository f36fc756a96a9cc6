#!/usr/bin/env bash
# `ferry plan` with an NVMe tier (docs/plan.md, "NVMe staging in host memory" and "NVMe traffic
# through the bounce buffer"), on the built-in qwen2.5-0.5b geometry of plan_cli.sh with the CPU
# executor fit (f32 boundaries): at a GPU budget that makes boundaries leave the GPU and a host
# budget too small for host homes beside the model state,
#  1. the plan fails, naming the binding constraint and the smallest budgets, host memory among
#     them (the state + the one bounce buffer);
#  2. at that host budget the plan homes boundaries on NVMe: the boundary table names nvme, the
#     text prints the bounce buffer and its store / fetch times, and the JSON carries them
#     (predicted.nvme_bounce_gb, nvme_store_ms, nvme_fetch_ms = the rates' k x the NVMe bytes,
#     computed here from the JSON's own problem, each store at least the exposure of the window
#     that produced its boundary). The JSON's read-back is nvme_bounce_test's (plan_from_json).
# ctest-cost: 60 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
export FERRY_CACHE_DIR="$TMP/cache"
mkdir -p "$TMP/nvme"
base=(plan --geometry qwen2.5-0.5b --seq-len 512 --batch-size 64 --gpu-mem-gb 7.5
      --executor-device cpu --resident-layers 0 --no-policies --time-limit-s 20
      --nvme-dir "$TMP/nvme" --nvme-gb 100)

# 1. Host memory for the model state and not one boundary more: no plan fits.
set +e
"$FERRY" "${base[@]}" --host-mem-gb 7.95 > "$TMP/inf.out" 2> "$TMP/inf.err"; rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "plan_nvme: infeasible host budget: rc=$rc"; cat "$TMP/inf.err"; exit 1; }
grep -q "no plan fits at batch 64 x seq 512: binding constraint gpu memory (capacity 7.50 GB)" \
  "$TMP/inf.err" || { echo "plan_nvme: no binding constraint"; cat "$TMP/inf.err"; exit 1; }
host=$(sed -n 's/.*or host memory >= \([0-9.]*\) GB.*/\1/p' "$TMP/inf.err")
[ -n "$host" ] || { echo "plan_nvme: no smallest host budget named"; cat "$TMP/inf.err"; exit 1; }

# 2. At the host budget it names, the plan fits with NVMe homes.
"$FERRY" "${base[@]}" --host-mem-gb "$host" --json "$TMP/p.json" > "$TMP/p.out" 2> "$TMP/p.err" ||
  { echo "plan_nvme: the named host budget $host does not fit"; cat "$TMP/p.err"; exit 1; }
grep -Eq "^[0-9]+ +nvme " "$TMP/p.out" ||
  { echo "plan_nvme: no nvme home in the boundary table"; cat "$TMP/p.out"; exit 1; }
grep -q "nvme bounce buffer)" "$TMP/p.out" ||
  { echo "plan_nvme: no bounce buffer in the peak line"; cat "$TMP/p.out"; exit 1; }
grep -q "^nvme traffic through the one bounce buffer: stores [0-9.]* ms" "$TMP/p.out" ||
  { echo "plan_nvme: no nvme timing line"; cat "$TMP/p.out"; exit 1; }
python3 - "$TMP/p.json" "$host" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
host = float(sys.argv[2])
pr, prob = j["predicted"], j["problem"]
A = prob["boundary_gb"]
homes = {b["boundary"]: b["home"] for b in j["boundaries"]}
nv = [i for i, h in homes.items() if h == "nvme"]
assert nv, homes
assert not [i for i, h in homes.items() if h == "host"], homes  # no room beside the buffer
L = j["num_layers"]
bounce = max(A[:L])
assert abs(pr["nvme_bounce_gb"] - bounce) < 1e-9, (pr["nvme_bounce_gb"], bounce)
assert abs(pr["host_peak_gb"] - (prob["host_fixed_gb"] + bounce)) < 1e-9, pr["host_peak_gb"]
assert pr["host_peak_gb"] <= host + 1e-6 and prob["host_fixed_gb"] + 2 * bounce > host
assert abs(pr["nvme_peak_gb"] - sum(A[i] for i in nv)) < 1e-9
link = prob["link"]
ks = 1e3 / link["d2h_gbps"] + 1e3 / link["nvme_write_gbps"]
kf = 1e3 / link["nvme_read_gbps"] + 1e3 / link["h2d_gbps"]
nv_gb = sum(A[i] for i in nv)
assert abs(pr["nvme_store_ms"] - ks * nv_gb) < 1e-6 * ks * nv_gb, (pr["nvme_store_ms"], ks * nv_gb)
assert abs(pr["nvme_fetch_ms"] - kf * nv_gb) < 1e-6 * kf * nv_gb, (pr["nvme_fetch_ms"], kf * nv_gb)
# Each store is exposure of the window that produced its boundary (f(i-1); boundary 0 in f0).
store = [0.0] * (2 * L + 1)
for i in nv:
    store[max(0, i - 1)] += ks * A[i]
for t, s in enumerate(store):
    assert pr["window_exposed_ms"][t] >= s - 1e-6, (t, pr["window_exposed_ms"][t], s)
# NVMe stores leave in the window that reads the boundary.
for x in j["transfers"]:
    if x["tier"] == "nvme" and x["direction"] == "d2h":
        assert x["window"] == x["boundary"], x
print(f"plan_nvme: host {host} GB: {len(nv)} boundaries on NVMe, bounce buffer {bounce:.3f} GB, "
      f"stores {pr['nvme_store_ms']:.1f} ms, fetches {pr['nvme_fetch_ms']:.1f} ms, "
      f"step {pr['step_ms']:.1f} ms", file=sys.stderr)
PY
echo "plan nvme cli: ok"
