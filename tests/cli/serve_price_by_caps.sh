#!/bin/bash
# `ferry serve`'s cap-dependent block price (docs/serve_wsa.md "ferry serve flags"):
# --plan-only --configurator-price-by-caps on|off: on (the default, as in the benches) and off
# both print the MV-WSA split for a routing trace of the built-in MoE, and say which configurator
# ran; a routing trace has no prefix curve, so both give the same split (wsa::offline_split falls
# back to allocate()). A value other than on/off, for it or for --live-price-by-caps, is a usage
# error (exit 2) naming the flag; --live-price-by-caps with --plan-only only warns.
# --split auto --live-price-by-caps on|off: a few completions sharing a long prompt (full prefill
# chunks, decode steps, prefix hits), then SIGTERM: with on the live controller's decisions were
# priced by caps (the final "wsa:" line's priced_by_caps > 0), with off (the default) none.
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
source "$ROOT/tests/cli/lib/serve_port.sh"

"$FERRY" generate --prompt "What is 2+3? Tell me about the sea." --max-new-tokens 24 --greedy \
  --record-trace "$tmp/trace.txt" >"$tmp/gen.txt" 2>&1 || fail "generate: $(cat "$tmp/gen.txt")"

plan() {  # plan NAME ARGS...: --plan-only on the trace, stdout to NAME.txt
  local name=$1; shift
  "$FERRY" serve --plan-only --trace "$tmp/trace.txt" --budget-gib 0.01 "$@" \
    >"$tmp/$name.txt" 2>"$tmp/$name.err" || fail "serve --plan-only $*: $(cat "$tmp/$name.err")"
  grep -q "^plan: budget 0.010 GiB" "$tmp/$name.txt" || fail "$name: no plan line: $(cat "$tmp/$name.txt")"
  grep -Eq "^mv-wsa +step [0-9.]+ ms \(modelled\)  kv_blocks=[0-9]+ .* slots=[0-9]+(,[0-9]+){3}$" \
    "$tmp/$name.txt" || fail "$name: no mv-wsa split: $(cat "$tmp/$name.txt")"
}
plan default
plan on --configurator-price-by-caps on
plan off --configurator-price-by-caps off
grep -q "^configurator: price by caps on (no prefix curve" "$tmp/default.txt" ||
  fail "default is not priced by caps: $(cat "$tmp/default.txt")"
grep -q "^configurator: price by caps on (no prefix curve" "$tmp/on.txt" || fail "on: $(cat "$tmp/on.txt")"
grep -q "^configurator: price by caps off (one block price)" "$tmp/off.txt" ||
  fail "off: $(cat "$tmp/off.txt")"
# The same split and rows either way (everything but the configurator line).
for name in on off; do grep -v "^configurator:" "$tmp/$name.txt" >"$tmp/$name.rows"; done
cmp -s "$tmp/default.txt" "$tmp/on.txt" || fail "default and on differ"
cmp -s "$tmp/on.rows" "$tmp/off.rows" || fail "on and off differ on a routing trace: $(diff "$tmp/on.rows" "$tmp/off.rows")"

# The environment variable, as every serve flag has one.
FERRY_CONFIGURATOR_PRICE_BY_CAPS=off plan env
cmp -s "$tmp/env.txt" "$tmp/off.txt" || fail "FERRY_CONFIGURATOR_PRICE_BY_CAPS=off is not off"

# Bad values: usage error, exit 2, the flag named.
for flag in --configurator-price-by-caps --live-price-by-caps; do
  "$FERRY" serve --plan-only --trace "$tmp/trace.txt" --budget-gib 0.01 $flag maybe \
    >"$tmp/bad.txt" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "$flag maybe: exit $rc, want 2: $(cat "$tmp/bad.txt")"
  grep -q -- "$flag" "$tmp/bad.txt" || fail "$flag maybe: error does not name the flag: $(cat "$tmp/bad.txt")"
  grep -q "maybe" "$tmp/bad.txt" || fail "$flag maybe: error does not name the value"
done

# --live-price-by-caps with --plan-only plans as before and warns that it has no effect.
plan live --live-price-by-caps on
cmp -s "$tmp/live.txt" "$tmp/default.txt" || fail "--live-price-by-caps changed the plan"
grep -q "live-price-by-caps has no effect with --plan-only" "$tmp/live.err" ||
  fail "no warning: $(cat "$tmp/live.err")"

# --split auto: the live controller, priced by caps or not.
live() {  # live NAME ARGS...: serve --split auto, three completions, SIGTERM; stderr in NAME.err
  local name=$1; shift
  "$FERRY" serve --port 0 --split auto --device-budget-mib 12 --wsa-max-context 256 "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  spid=$!
  local port
  port=$(serve_port "$tmp/$name.out")
  [ -n "$port" ] || fail "$name: server did not start: $(cat "$tmp/$name.err")"
  # --split auto runs the pager whatever --mode said; the line names the mode that runs.
  grep -q "^listening port=$port .* mode=paged kv_blocks=[0-9]* kv_dtype=f32$" "$tmp/$name.out" ||
    fail "$name: listening line: $(cat "$tmp/$name.out")"
  local prompt="The ferry crosses the bay twice a day; its deck holds forty cars and a hundred people."
  for i in 1 2 3; do
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"$prompt Turn $i.\", \"max_tokens\": 24, \"ignore_eos\": true}" \
      >"$tmp/$name.c$i.json" || fail "$name: completion $i: $(cat "$tmp/$name.err")"
  done
  kill -TERM "$spid"
  wait "$spid" || fail "$name: serve exited $?: $(cat "$tmp/$name.err")"
  spid=""
  grep -Eq "^wsa: decisions=[1-9][0-9]* priced_by_caps=[0-9]+ " "$tmp/$name.err" ||
    fail "$name: no decision: $(cat "$tmp/$name.err")"
}
live live_off
live live_on --live-price-by-caps on
grep -q "^wsa: .* priced_by_caps=0 " "$tmp/live_off.err" || fail "off: $(grep wsa: "$tmp/live_off.err")"
grep -Eq "^wsa: .* priced_by_caps=[1-9]" "$tmp/live_on.err" ||
  fail "on: no decision priced by caps: $(grep wsa: "$tmp/live_on.err")"

# --help lists both flags.
"$FERRY" serve --help >"$tmp/help.txt" 2>&1
for flag in --configurator-price-by-caps --live-price-by-caps; do
  grep -q -- "$flag" "$tmp/help.txt" || fail "--help does not list $flag"
done
grep -h "^wsa:" "$tmp"/live_*.err; echo "ok"
