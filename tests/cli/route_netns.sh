#!/bin/bash
# WAN emulation for `ferry route serve` / `ferry route agent`: two network namespaces joined by a
# veth pair, tc netem on both ends (20 ms each way = 40 ms RTT, 50 mbit/s). Where the kernel has
# no sch_netem, the same link is emulated by `ferry route wan` running in the agent's namespace
# (user-space proxy to the server across the veth pair) and the script says so. Checks that
# offloaded frames see the delay (offload latency >= RTT) while local frames do not, and that a
# deadline below the RTT makes every offload fall back, all frames accounted. Needs root
# (CAP_NET_ADMIN) for the namespaces; otherwise prints "SKIPPED: <reason>" and exits 0.
# Namespaces are always removed.
set -u
FERRY=$1; ROOT=$2
skip() { echo "SKIPPED: $*"; exit 0; }
command -v ip >/dev/null || skip "ip (iproute2) not installed"
command -v tc >/dev/null || skip "tc (iproute2) not installed"
NS_S=ferry_rs_$$; NS_A=ferry_ra_$$; VS=frs$$; VA=fra$$
tmp=$(mktemp -d)
spid=""; wpid=""
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null; ip netns del "$NS_A" 2>/dev/null
  ip link del "$VS" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }

ip netns add "$NS_S" 2>/dev/null || skip "ip netns add not permitted"
ip netns add "$NS_A" 2>/dev/null || skip "ip netns add not permitted"
ip link add "$VS" type veth peer name "$VA" 2>/dev/null || skip "cannot create a veth pair"
ip link set "$VS" netns "$NS_S" && ip link set "$VA" netns "$NS_A" || fail "move veth"
ip -n "$NS_S" addr add 10.213.0.1/24 dev "$VS" && ip -n "$NS_A" addr add 10.213.0.2/24 dev "$VA"
ip -n "$NS_S" link set "$VS" up && ip -n "$NS_A" link set "$VA" up || fail "link up"
ip -n "$NS_S" link set lo up && ip -n "$NS_A" link set lo up
netem=1
for pair in "$NS_S $VS" "$NS_A $VA"; do
  set -- $pair
  ip netns exec "$1" tc qdisc add dev "$2" root netem delay 20ms rate 50mbit 2>/dev/null || netem=0
done

SYN=(--synthetic-frames 800 --seed 11)
ip netns exec "$NS_S" "$FERRY" route serve --host 10.213.0.1 --port 8000 "${SYN[@]}" \
  >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 100); do grep -q "^listening port=" "$tmp/serve.out" && break; sleep 0.1; done
grep -q "^listening port=8000" "$tmp/serve.out" || fail "server did not start"
URL=http://10.213.0.1:8000
if [ "$netem" = 0 ]; then
  echo "tc netem not available (sch_netem): emulating the link with ferry route wan in $NS_A"
  ip netns exec "$NS_A" "$FERRY" route wan --host 127.0.0.1 --port 8001 --upstream-host 10.213.0.1 \
    --upstream-port 8000 --delay-ms 20 --uplink-mbps 50 --downlink-mbps 50 \
    >"$tmp/wan.out" 2>"$tmp/wan.err" &
  wpid=$!
  for _ in $(seq 100); do grep -q "^listening port=" "$tmp/wan.out" && break; sleep 0.1; done
  grep -q "^listening port=8001" "$tmp/wan.out" || fail "wan emulator did not start"
  URL=http://127.0.0.1:8001
fi

check() {
  python3 - "$1" "$2" <<'PY' || fail "check '$2' on $1: $(cat "$1")"
import json, sys
s = json.load(open(sys.argv[1]))
assert eval(sys.argv[2]), sys.argv[2]
PY
}

# Deadline well above the RTT: offloads succeed and take at least one RTT (40 ms).
ip netns exec "$NS_A" "$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.5 --frames 200 \
  --fps 100 --deadline-ms 5000 --frame-bytes 4096 --concurrency 32 \
  >"$tmp/a1.json" 2>"$tmp/a1.err" || fail "agent run 1"
check "$tmp/a1.json" "s['accounted'] and s['frames'] == 200"
check "$tmp/a1.json" "abs(s['realised_rho'] - 0.5) <= 0.01"
check "$tmp/a1.json" "s['offloaded_ok'] >= 90 and s['offload_latency_ms']['p50'] >= 40"
check "$tmp/a1.json" "s['latency_ms']['p50'] < s['offload_latency_ms']['p50']"

# Deadline below the RTT: every offload falls back to the weak result; nothing is lost.
ip netns exec "$NS_A" "$FERRY" route agent --server "$URL" "${SYN[@]}" --rho 0.5 --frames 100 \
  --fps 100 --deadline-ms 25 --concurrency 16 >"$tmp/a2.json" 2>"$tmp/a2.err" || fail "agent run 2"
check "$tmp/a2.json" "s['accounted'] and s['frames'] == 100"
check "$tmp/a2.json" "s['offloaded_ok'] == 0 and s['offloaded_fallback'] == 50"
check "$tmp/a2.json" "s['latency_ms']['max'] < 25 + 100"
check "$tmp/a2.json" "s['ap']['produced'] == s['ap']['weak_only']"
echo "route_netns: ok ($([ "$netem" = 1 ] && echo "tc netem" || echo "ferry route wan") link)"
