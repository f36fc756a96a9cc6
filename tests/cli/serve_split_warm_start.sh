#!/bin/bash
# `ferry serve --split auto --trace FILE` (docs/serve_wsa.md "ferry serve flags"): the live split
# starts from the offline configurator's split of a recorded routing trace, planned for the
# server's own pools, instead of 50/50: the log names the plan's split, and it is the split
# `--plan-only` prints for that trace at the same budget, expert and K/V sizes; the server then
# serves (completions, the live controller decides) and stops cleanly. Without --trace it starts
# at 50/50 (no such log line). --trace without --plan-only or --split auto only warns.
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
source "$ROOT/tests/cli/lib/serve_port.sh"
source "$ROOT/tests/cli/lib/serve_split.sh"

"$FERRY" generate --prompt "What is 2+3? Tell me about the sea and the ferry." --max-new-tokens 32 \
  --greedy --record-trace "$tmp/trace.txt" >"$tmp/gen.txt" 2>&1 || fail "generate: $(cat "$tmp/gen.txt")"


serve_split "$tmp" warm --trace "$tmp/trace.txt"
grep -q -- "--split auto starts from the plan of $tmp/trace.txt: slots/layer" "$tmp/warm.err" ||
  fail "warm: no start line: $(cat "$tmp/warm.err")"
# The same split --plan-only prints for this trace at the server's pools (12 MiB, f32 experts and
# K/V, 16-token blocks, 4 running, 256-token context).
"$FERRY" serve --plan-only --trace "$tmp/trace.txt" --budget-gib "$(awk 'BEGIN { printf "%.8f", 12 / 1024 }')" \
  --wsa-max-context 256 >"$tmp/plan.txt" 2>"$tmp/plan.err" || fail "plan: $(cat "$tmp/plan.err")"
kv=$(sed -n 's/^mv-wsa .* kv_blocks=\([0-9]*\) .*/\1/p' "$tmp/plan.txt")
[ -n "$kv" ] || fail "plan: no mv-wsa row: $(cat "$tmp/plan.txt")"
grep -q "starts from the plan of .*, kv $kv blocks" "$tmp/warm.err" ||
  fail "warm start is not the plan's split (kv $kv): $(grep 'starts from' "$tmp/warm.err") / $(cat "$tmp/plan.txt")"

serve_split "$tmp" cold
grep -q "starts from the plan" "$tmp/cold.err" && fail "cold: a start line without --trace"

# --trace alone: a warning, the server runs as before.
"$FERRY" serve --port 0 --trace "$tmp/trace.txt" >"$tmp/alone.out" 2>"$tmp/alone.err" &
spid=$!
[ -n "$(serve_port "$tmp/alone.out")" ] || fail "alone: did not start: $(cat "$tmp/alone.err")"
kill -TERM "$spid"; wait "$spid"; spid=""
grep -q -- "--trace has no effect without --plan-only or --split auto" "$tmp/alone.err" ||
  fail "alone: no warning: $(cat "$tmp/alone.err")"
grep -h "starts from\|^wsa:" "$tmp"/warm.err; echo "ok"
