#!/usr/bin/env bash
# A `ferry train` process killed (SIGKILL) mid-run and then resumed from its newest checkpoint
# ends with exactly the same weights (byte-identical model.safetensors) and the same per-step
# losses as an uninterrupted run with the same flags.
# ctest-cost: 45 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
common=(--demo-layers 1 --demo-hidden 64 --batch-size 4 --seq-len 128 --max-steps 60
        --save-every 5 --eval-every 0 --seed 7 --lr 3e-3 --warmup-steps 5)

"$FERRY" train "${common[@]}" --output-dir "$TMP/a" > "$TMP/a.log" 2> "$TMP/a.err"

"$FERRY" train "${common[@]}" --output-dir "$TMP/b" > "$TMP/b1.log" 2> "$TMP/b1.err" &
pid=$!
for _ in $(seq 1 6000); do
  [ -d "$TMP/b/checkpoint-10" ] && break
  sleep 0.01
done
kill -9 "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
if [ -f "$TMP/b/model.safetensors" ]; then
  echo "train_resume: the child finished before it was killed; the test did not test anything"
  exit 1
fi
ls "$TMP/b" | grep -q '^checkpoint-' || { echo "no checkpoint written before the kill"; exit 1; }

"$FERRY" train "${common[@]}" --output-dir "$TMP/b" --resume "$TMP/b" > "$TMP/b2.log" 2> "$TMP/b2.err"
cmp "$TMP/a/model.safetensors" "$TMP/b/model.safetensors" ||
  { echo "train_resume: weights differ after kill + resume"; exit 1; }
# Every step the resumed run printed has the uninterrupted run's loss.
python3 - "$TMP/a.log" "$TMP/b2.log" <<'PY'
import re, sys
def losses(p):
    out = {}
    for line in open(p):
        m = re.match(r"step\s+(\d+)/\d+ \| loss (\S+)", line)
        if m: out[int(m.group(1))] = m.group(2)
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert b, "resumed run printed no steps"
assert min(b) > 1, "resume restarted from step 1"
for s, l in b.items():
    assert a[s] == l, (s, a[s], l)
print(f"train_resume: resumed at step {min(b)}, {len(b)} steps identical")
PY
echo "train resume cli: ok"
