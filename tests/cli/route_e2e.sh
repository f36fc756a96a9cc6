#!/bin/bash
# `ferry route serve` + `ferry route agent` as two processes over loopback (docs/route_system.md):
# 1) a healthy run of 400 frames: realised rho within +-0.01 of the target, every frame accounted,
#    no fallback; 2) the server is killed mid-run: the agent falls back to its weak results, no
#    frame lost (local + offloaded_ok + offloaded_fallback = frames), budget still held.
# ctest-cost: 14 (seconds in the CI build: ctest starts the longest tests first)
set -u
FERRY=$1; ROOT=$2
fail() { echo "FAIL: $*"; for f in "$tmp"/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }
tmp=$(mktemp -d)
spid=""
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
SYN=(--synthetic-frames 1000 --seed 7)

"$FERRY" route serve --port 0 "${SYN[@]}" --max-batch 8 --batch-timeout-ms 2 \
  >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 100); do grep -q "^listening port=" "$tmp/serve.out" && break; sleep 0.1; done
port=$(sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$tmp/serve.out")
[ -n "$port" ] || fail "server did not start"
URL=http://127.0.0.1:$port

check() {  # check <json file> <python condition over s>
  python3 - "$1" "$2" <<'PY' || fail "check '$2' on $1: $(cat "$1")"
import json, sys
s = json.load(open(sys.argv[1]))
assert eval(sys.argv[2]), sys.argv[2]
PY
}

# 1) healthy: 400 frames at rho 0.4, generous deadline.
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.4 --frames 400 --deadline-ms 3000 \
  >"$tmp/a1.json" 2>"$tmp/a1.err" || fail "agent run 1 rc=$?"
check "$tmp/a1.json" "s['frames'] == 400 and s['accounted']"
check "$tmp/a1.json" "s['local'] + s['offloaded_ok'] + s['offloaded_fallback'] == 400"
check "$tmp/a1.json" "abs(s['realised_rho'] - 0.4) <= 0.01"
check "$tmp/a1.json" "s['offloaded_fallback'] == 0 and s['offloaded_ok'] > 0"
check "$tmp/a1.json" "0 < s['ap']['weak_only'] < s['ap']['strong_only'] <= 1"
# 1b) the same with the JSON-number upload (the fallback to the binary tensor extension).
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.4 --frames 100 --deadline-ms 3000 \
  --json-upload >"$tmp/a1b.json" 2>"$tmp/a1b.err" || fail "agent run 1b rc=$?"
check "$tmp/a1b.json" "s['accounted'] and s['offloaded_fallback'] == 0 and s['offloaded_ok'] > 0"
curl -sf "$URL/metrics" >"$tmp/metrics.txt" || fail "server /metrics"
grep -q '^ferry_route_server_requests_total{outcome="ok"} ' "$tmp/metrics.txt" || fail "metrics"

# 2) kill the server while the agent streams (400 frames at 200 fps = 2 s).
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.4 --frames 400 --fps 200 \
  --deadline-ms 200 >"$tmp/a2.json" 2>"$tmp/a2.err" &
apid=$!
# Kill the server only once this run has had offloads served (bounded wait), so the check below
# does not depend on how fast a loaded machine starts the agent.
ok_count() { curl -s "$URL/metrics" | awk '/^ferry_route_server_requests_total\{outcome="ok"\} /{print $2}'; }
base=$(ok_count)
for _ in $(seq 1 100); do
  now=$(ok_count)
  if [ -n "$now" ] && [ -n "$base" ] && awk -v a="$now" -v b="$base" 'BEGIN{exit !(a > b)}'; then
    break
  fi
  sleep 0.05
done
kill "$spid"; wait "$spid" 2>/dev/null; spid=""
wait "$apid" || fail "agent run 2 rc=$?"
check "$tmp/a2.json" "s['frames'] == 400 and s['accounted']"
check "$tmp/a2.json" "s['local'] + s['offloaded_ok'] + s['offloaded_fallback'] == 400"
check "$tmp/a2.json" "s['offloaded_ok'] > 0 and s['offloaded_fallback'] > 0"
check "$tmp/a2.json" "s['fallback_reasons']['unavailable'] + s['fallback_reasons']['timeout'] + s['fallback_reasons']['error'] > 0"
check "$tmp/a2.json" "abs(s['realised_rho'] - 0.4) <= 0.01"
check "$tmp/a2.json" "s['latency_ms']['count'] == 400"
echo "route_e2e: ok"
