#!/bin/bash
# serve_split_engine_bench --kv-dtype (bench/serve/serve_split_engine_bench.cpp) on the CPU engine's
# --scaled geometry (the 2-layer CUDA run's split problem at 1/32 of the widths), a short agentic
# workload, policies fixed-50, kv-heavy and live, once with f32 and once with bf16 K/V at the same
# pool budget: the bf16 run reports kv_dtype bf16 (JSON "run" and the setup line), plans with half
# the block bytes, so 50/50 and kv-heavy start with exactly twice the blocks (the simulator's
# --kv-bytes 2 splits: 7,118 and 11,438), and every policy completes, which it cannot if the flag
# misses an engine (run_policy refuses a cache whose block bytes differ from the plan's); live
# stays within the pool budget. A bad value is a usage error. The bench is the build's, beside ferry
# (apps/ferry/ferry -> bench/); a build without benches skips.
# ctest-cost: 5
set -u
FERRY=$1
BUILD=$(cd "$(dirname "$FERRY")/../.." && pwd)
BENCH=$BUILD/bench/serve_split_engine_bench
if [ ! -x "$BENCH" ]; then
  echo "SKIPPED: $BENCH not built (FERRY_BUILD_BENCH=OFF or not built yet)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.txt; do echo "== $f"; tail -20 "$f"; done; exit 1; }

for dt in f32 bf16; do
  "$BENCH" --device cpu --scaled --sessions 2 --turns 2 --prefix 64 --user-max 64 \
    --output-max 64 --policies fixed-50,kv-heavy,live --kv-dtype "$dt" \
    --json "$tmp/$dt.json" >"$tmp/$dt.txt" 2>&1 || fail "$dt: exit $?"
  grep -q "kv block [0-9.]* MiB ($dt)" "$tmp/$dt.txt" || fail "$dt: the setup line names no kv dtype"
done
python3 - "$tmp/f32.json" "$tmp/bf16.json" <<'PY' || fail "json"
import json, sys
f32, bf16 = (json.load(open(p)) for p in sys.argv[1:3])
assert f32["run"]["kv_dtype"] == "f32" and bf16["run"]["kv_dtype"] == "bf16", (f32["run"], bf16["run"])
assert bf16["budget"]["pool_budget_bytes"] == f32["budget"]["pool_budget_bytes"]
assert 2 * bf16["geometry"]["kv_block_bytes"] == f32["geometry"]["kv_block_bytes"], \
    (f32["geometry"], bf16["geometry"])
by = {d: {p["policy"]: p for p in doc["policies"]} for d, doc in (("f32", f32), ("bf16", bf16))}
for d, doc in (("f32", f32), ("bf16", bf16)):
    for name, p in by[d].items():
        assert p["complete"], (d, name, p["error"])
        assert p["pool_max_bytes"] <= doc["budget"]["pool_budget_bytes"], (d, name)
    assert by[d]["live"]["live_decisions"] > 0, d
for name in ("fixed 50/50", "kv-heavy"):
    a, b = by["f32"][name], by["bf16"][name]
    assert a["start_split"]["slots"] == b["start_split"]["slots"], name
    assert b["start_split"]["kv_blocks"] == 2 * a["start_split"]["kv_blocks"], (name, a["start_split"], b["start_split"])
    assert b["final_split"]["kv_blocks"] == b["start_split"]["kv_blocks"], name
assert by["bf16"]["fixed 50/50"]["start_split"]["kv_blocks"] == 7118
assert by["bf16"]["kv-heavy"]["start_split"]["kv_blocks"] == 11438
print("ok: bf16 blocks", by["bf16"]["fixed 50/50"]["start_split"]["kv_blocks"],
      "(f32", by["f32"]["fixed 50/50"]["start_split"]["kv_blocks"], ")")
PY

"$BENCH" --device cpu --scaled --kv-dtype fp8 >"$tmp/bad.txt" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "--kv-dtype fp8: exit $rc, want 2"
grep -q "kv dtype 'fp8'" "$tmp/bad.txt" || fail "--kv-dtype fp8: $(cat "$tmp/bad.txt")"
echo "PASSED"
