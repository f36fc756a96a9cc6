#!/bin/bash
# `--cpu-expert-kernel fast|exact` (PagerConfig::cpu_expert_kernel) of `ferry bench serve`,
# `ferry serve` and `ferry generate`: on the CPU engine cpu-experts runs the exact kernel by default (same logits bits
# as resident) and the fast one when asked (same greedy ids here; bits may differ), the JSON says
# which ran, and any other value is a usage error (exit 2).
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

run() {  # run NAME ARGS...: bench serve on the tiny geometry, resident then cpu-experts
  local name=$1; shift
  "$FERRY" bench serve --geometry tiny --modes resident,cpu-experts --prompt-tokens 16 \
    --decode-tokens 8 --json "$tmp/$name.json" "$@" >"$tmp/$name.txt" 2>"$tmp/$name.err" \
    || fail "bench serve $*: $(cat "$tmp/$name.err")"
}
run default
run exact --cpu-expert-kernel exact
run fast --cpu-expert-kernel fast
grep -q "cpu-experts ran the fast CPU expert kernel" "$tmp/fast.txt" ||
  fail "no kernel line in the table: $(cat "$tmp/fast.txt")"
python3 - "$tmp" <<'PY' || fail "reports"
import json, sys
d = sys.argv[1]
for name, kernel, same_bits in [("default", "exact", True), ("exact", "exact", True),
                                ("fast", "fast", None)]:
    modes = {m["mode"]: m for m in json.load(open(f"{d}/{name}.json"))["modes"]}
    cpu = modes["cpu-experts"]
    assert modes["resident"]["cpu_expert_kernel"] is None, name
    assert cpu["cpu_expert_kernel"] == kernel, (name, cpu["cpu_expert_kernel"])
    assert cpu["same_tokens_as_reference"], name
    if same_bits:
        assert cpu["same_logits_bits_as_reference"], name
PY

# ferry generate takes it too (the built-in MoE on the CPU engine): exact = resident's ids.
for k in resident exact fast; do
  mode=cpu-experts; flag=(--cpu-expert-kernel "$k")
  [ "$k" = resident ] && { mode=resident; flag=(); }
  "$FERRY" generate --prompt "What is 2+3?" --max-new-tokens 6 --greedy --mode "$mode" \
    "${flag[@]}" --json >"$tmp/gen_$k.json" 2>"$tmp/gen_$k.err" ||
    fail "generate --mode $mode ${flag[*]}: $(cat "$tmp/gen_$k.err")"
done
python3 - "$tmp" <<'PY' || fail "generate ids"
import json, sys
d = sys.argv[1]
ids = {k: json.load(open(f"{d}/gen_{k}.json"))["ids"] for k in ("resident", "exact", "fast")}
assert ids["exact"] == ids["resident"], ids
assert ids["fast"] == ids["resident"], ids  # greedy ids; the fast kernel's bits may differ
PY

for cmd in "bench serve --geometry tiny" "serve --plan-only" "generate --prompt x"; do
  "$FERRY" $cmd --cpu-expert-kernel simd >"$tmp/bad.txt" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "$cmd --cpu-expert-kernel simd: exit $rc, want 2: $(cat "$tmp/bad.txt")"
  grep -q "cpu-expert-kernel" "$tmp/bad.txt" || fail "$cmd: error does not name the flag"
done
echo "ok"
