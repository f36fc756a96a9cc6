#!/bin/bash
# `ferry serve --split auto` where the device lacks CUDA virtual memory management, forced with
# FERRY_VMM=off (docs/mem_virtual_region.md): each resizable pool is one allocation of its whole
# reservation, so the server logs the fallback per pool, reports the held bytes as whole pools
# and warns that they are over its budget, and then serves as with granules — the same greedy
# completions as a server with VMM, the live controller deciding — and stops cleanly. Without
# FERRY_VMM the memory line says "(committed)" and nothing is warned.
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
source "$ROOT/tests/cli/lib/serve_port.sh"
source "$ROOT/tests/cli/lib/serve_split.sh"

unset FERRY_VMM
serve_split "$tmp" vmm
export FERRY_VMM=off
serve_split "$tmp" novmm
unset FERRY_VMM

for pool in "expert slot pool" "kv block pool"; do
  grep -q "virtual region what=\"$pool\" backing=whole-up-front .*reason=\"FERRY_VMM=off\"" "$tmp/novmm.err" ||
    fail "novmm: no fallback line for the $pool: $(cat "$tmp/novmm.err")"
done
grep -q "device memory: budget charge .*held .* (whole pools: no VMM), pools reserved" "$tmp/novmm.err" ||
  fail "novmm: memory line: $(grep 'device memory' "$tmp/novmm.err")"
grep -q "is over the 12.0 MiB budget: without CUDA virtual memory management" "$tmp/novmm.err" ||
  fail "novmm: no over-budget warning: $(grep 'device memory' "$tmp/novmm.err")"
# Held = reserved when the pools are whole (the pools are all of the device tier's bytes here).
held=$(sed -n 's/.*held \([0-9.]* [KMG]iB\) (whole pools: no VMM), pools reserved \([0-9.]* [KMG]iB\).*/\1/p' "$tmp/novmm.err")
reserved=$(sed -n 's/.*(whole pools: no VMM), pools reserved \([0-9.]* [KMG]iB\).*/\1/p' "$tmp/novmm.err")
[ -n "$held" ] && [ "$held" = "$reserved" ] || fail "novmm: held '$held' is not the reserved '$reserved'"

grep -q "held .* (committed), pools reserved" "$tmp/vmm.err" || fail "vmm: memory line: $(grep 'device memory' "$tmp/vmm.err")"
grep -q "backing=whole-up-front\|is over the .* budget" "$tmp/vmm.err" && fail "vmm: a fallback line with VMM"

# The same greedy completions either way (the backing changes memory, not arithmetic).
for i in 1 2; do
  a=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$tmp/vmm.c$i.json")
  b=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$tmp/novmm.c$i.json")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "completion $i differs: '$a' vs '$b'"
done
grep -h "device memory" "$tmp/novmm.err"; echo "ok"
