#!/bin/bash
# Edge agent and cloud server as separate processes over an emulated WAN, without root:
# `ferry route serve` <- `ferry route wan` (user-space link model: 20 ms each way, 50 Mbit/s
# uplink) <- `ferry route agent`. Offloads succeed and take at least one RTT; with the deadline
# below the RTT every offload falls back to the weak result and no frame is lost; killing the
# emulator mid-run (the WAN goes down) loses no frame either. tests/cli/route_netns.sh does the
# same between network namespaces with tc netem where that is available.
# ctest-cost: 18 (seconds in the CI build: ctest starts the longest tests first)
set -u
FERRY=$1; ROOT=$2
fail() { echo "FAIL: $*"; for f in "$tmp"/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }
tmp=$(mktemp -d)
spid=""; wpid=""
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
SYN=(--synthetic-frames 800 --seed 11)
wait_port() {  # wait_port <stdout file> -> prints the port
  for _ in $(seq 100); do grep -q "^listening port=" "$1" && break; sleep 0.1; done
  sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$1"
}

"$FERRY" route serve --port 0 "${SYN[@]}" >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
sport=$(wait_port "$tmp/serve.out")
[ -n "$sport" ] || fail "server did not start"
"$FERRY" route wan --port 0 --upstream-port "$sport" --delay-ms 20 --uplink-mbps 50 \
  >"$tmp/wan.out" 2>"$tmp/wan.err" &
wpid=$!
wport=$(wait_port "$tmp/wan.out")
[ -n "$wport" ] || fail "wan emulator did not start"
URL=http://127.0.0.1:$wport

check() {
  python3 - "$1" "$2" <<'PY' || fail "check '$2' on $1: $(cat "$1")"
import json, sys
s = json.load(open(sys.argv[1]))
assert eval(sys.argv[2]), sys.argv[2]
PY
}

# Deadline well above the RTT: offloads succeed and take at least one RTT (40 ms).
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.5 --frames 200 --fps 100 \
  --deadline-ms 5000 --frame-bytes 4096 --concurrency 32 >"$tmp/a1.json" 2>"$tmp/a1.err" ||
  fail "agent run 1"
check "$tmp/a1.json" "s['accounted'] and s['frames'] == 200"
check "$tmp/a1.json" "abs(s['realised_rho'] - 0.5) <= 0.01"
check "$tmp/a1.json" "s['offloaded_ok'] >= 90 and s['offload_latency_ms']['p50'] >= 40"
check "$tmp/a1.json" "s['latency_ms']['p50'] < s['offload_latency_ms']['p50']"

# Deadline below the RTT: every offload falls back to the weak result; nothing is lost.
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.5 --frames 100 --fps 100 \
  --deadline-ms 25 --concurrency 16 >"$tmp/a2.json" 2>"$tmp/a2.err" || fail "agent run 2"
check "$tmp/a2.json" "s['accounted'] and s['frames'] == 100"
check "$tmp/a2.json" "s['offloaded_ok'] == 0 and s['offloaded_fallback'] == 50"
check "$tmp/a2.json" "s['ap']['produced'] == s['ap']['weak_only']"

# The WAN goes down mid-run (the emulator is killed once the server has answered 20 of this
# run's offloads through it): no frame lost, budget held.
ok_count() {
  curl -s "http://127.0.0.1:$sport/metrics" |
    awk '/^ferry_route_server_requests_total\{outcome="ok"\} /{print int($2)}'
}
before=$(ok_count)
"$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.5 --frames 300 --fps 100 \
  --deadline-ms 500 --concurrency 16 >"$tmp/a3.json" 2>"$tmp/a3.err" &
apid=$!
for _ in $(seq 600); do
  now=$(ok_count)
  [ -n "$now" ] && [ "$now" -ge $((before + 20)) ] && break
  sleep 0.02
done
kill "$wpid"
wait "$apid" || fail "agent run 3"
wait "$wpid" 2>/dev/null; wpid=""
check "$tmp/a3.json" "s['accounted'] and s['frames'] == 300"
check "$tmp/a3.json" "s['local'] + s['offloaded_ok'] + s['offloaded_fallback'] == 300"
check "$tmp/a3.json" "abs(s['realised_rho'] - 0.5) <= 0.01"
check "$tmp/a3.json" "s['offloaded_ok'] > 0 and s['offloaded_fallback'] > 0"
echo "route_wan: ok"
