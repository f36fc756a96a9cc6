#!/bin/bash
# `ferry serve --kv-admission reserve|preempt` over loopback with curl, on a KV pool of 12 blocks
# of 4 tokens (48 positions): two greedy completions of 30 tokens in one request (submitted
# together) need 9 blocks each at the end. reserve admits the second only when the first's whole reservation is back (no
# preemption); preempt admits both, and a decode short of a block preempts the younger, which is
# recomputed later. Both give each prompt the same 30 tokens; /metrics counts the preemptions and
# recomputed tokens; a request larger than the whole pool is a 400 in both; a bad value of the
# flag and --split auto with reserve are refused.
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; for f in "$tmp"/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

run_server() {  # run_server ADMISSION: two concurrent requests, then /metrics, then stop
  local adm=$1
  "$FERRY" serve --port 0 --max-running 2 --kv-block-tokens 4 --kv-budget-mib 0.1 \
    --no-prefix-cache --kv-admission "$adm" >"$tmp/serve_$adm.out" 2>"$tmp/serve_$adm.err" &
  spid=$!
  for _ in $(seq 300); do grep -q "^listening port=" "$tmp/serve_$adm.out" && break; sleep 0.1; done
  local port
  port=$(sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$tmp/serve_$adm.out")
  [ -n "$port" ] || fail "$adm: server did not start"
  local url=http://127.0.0.1:$port
  curl -sf "$url/metrics" | grep -q '^ferry_serve_kv_blocks_total 12$' || fail "$adm: pool is not 12 blocks"
  # One request with both prompts: the server submits them together, so they overlap in the
  # engine whatever the machine's load (two separate requests may not).
  curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": ["first", "second"], "max_tokens": 30, "temperature": 0, "ignore_eos": true}' \
    >"$tmp/$adm.json" || fail "$adm: completion"
  python3 - "$tmp/$adm.json" <<'PY' || fail "$adm: $(cat "$tmp/$adm.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["choices"]) == 2, j
assert j["usage"]["completion_tokens"] == 60, j
assert all(c["finish_reason"] == "length" for c in j["choices"]), j
PY
  code=$(curl -s -o "$tmp/${adm}_big.json" -w '%{http_code}' "$url/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt": "too long", "max_tokens": 60}')
  [ "$code" = 400 ] || fail "$adm: a request larger than the pool gave $code"
  grep -q '"error"' "$tmp/${adm}_big.json" || fail "$adm: error body"
  curl -sf "$url/metrics" >"$tmp/metrics_$adm.txt" || fail "$adm: /metrics"
  kill -TERM "$spid"
  wait "$spid"; local rc=$?; spid=""
  [ "$rc" = 0 ] || fail "$adm: server exit code $rc"
}

run_server reserve
run_server preempt

metric() { sed -n "s/^$1 \([0-9.e+]*\)$/\1/p" "$2"; }
[ "$(metric ferry_serve_preemptions_total "$tmp/metrics_reserve.txt")" = 0 ] ||
  fail "reserve preempted"
pre=$(metric ferry_serve_preemptions_total "$tmp/metrics_preempt.txt")
rec=$(metric ferry_serve_recompute_tokens_total "$tmp/metrics_preempt.txt")
[ -n "$pre" ] && [ "$pre" -ge 1 ] || fail "preempt: no preemption counted ($pre)"
[ -n "$rec" ] && [ "$rec" -ge 1 ] || fail "preempt: no recomputed tokens counted ($rec)"
python3 - "$tmp/reserve.json" "$tmp/preempt.json" <<'PY' || fail "texts differ"
import json, sys
a, b = ([c["text"] for c in sorted(json.load(open(f))["choices"], key=lambda c: c["index"])]
        for f in sys.argv[1:3])
assert a == b, (a, b)
PY

"$FERRY" serve --port 0 --kv-admission sometimes >"$tmp/bad.out" 2>&1 && fail "a bad value ran"
grep -q "kv-admission" "$tmp/bad.out" || fail "bad value message: $(cat "$tmp/bad.out")"
"$FERRY" serve --port 0 --split auto --device-budget-mib 16 --kv-admission reserve \
  >"$tmp/auto.out" 2>&1 && fail "--split auto with reserve ran"
grep -q "needs --kv-admission preempt" "$tmp/auto.out" || fail "auto message: $(cat "$tmp/auto.out")"
echo "serve_kv_preempt: ok ($pre preemptions, $rec tokens recomputed)"
