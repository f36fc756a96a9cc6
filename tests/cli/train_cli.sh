#!/usr/bin/env bash
# CLI checks of `ferry train`: the embedded default writes a Hugging Face folder; that folder
# fine-tunes on JSONL data (malformed lines reported as file:line and skipped, or refused with
# --strict); the result loads in `ferry perplexity`; usage errors exit 2, runtime errors 1.
# ctest-cost: 18 (seconds in the CI build: ctest starts the longest tests first)
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
tiny=(--demo-layers 1 --demo-hidden 32 --batch-size 2 --eval-every 0)

"$FERRY" train "${tiny[@]}" --max-steps 2 --output-dir "$TMP/base" > "$TMP/log" 2> "$TMP/err"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f "$TMP/base/$f" ] || { echo "missing $f"; exit 1; }
done
grep -q "^step     2/2 | loss" "$TMP/log" || { echo "no step line"; cat "$TMP/log"; exit 1; }

cat > "$TMP/data.jsonl" <<'JSONL'
{"prompt": "Say hi.", "response": "hi"}
{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
{"prompt": "no response field"}
{"prompt": "Say bye.", "response": "bye"}
JSONL
"$FERRY" train --model "$TMP/base" --data "$TMP/data.jsonl" --output-dir "$TMP/ft" \
  --max-steps 3 --batch-size 2 --metrics-out "$TMP/m.jsonl" --padding > "$TMP/log" 2> "$TMP/err"
grep -q "data.jsonl:3: missing \"response\"" "$TMP/err" || { echo "no file:line"; cat "$TMP/err"; exit 1; }
python3 - "$TMP/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r["type"] == "step"]
assert [r["step"] for r in steps] == [1, 2, 3], rows
for r in steps:
    assert r["padded_tokens"] == 2 * 128 and r["computed_tokens"] == 256, r
    assert 0 < r["useful_tokens"] < 256 and r["loss"] > 0 and r["grad_norm"] > 0, r
PY
printf 'hi there\n' > "$TMP/t.txt"
"$FERRY" perplexity --model "$TMP/ft" --text-file "$TMP/t.txt" > "$TMP/ppl" ||
  { echo "perplexity failed on the trained model"; exit 1; }

set +e
"$FERRY" train --model "$TMP/base" --data "$TMP/data.jsonl" --output-dir "$TMP/s" --strict \
  --max-steps 1 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "data.jsonl:3" "$TMP/err" || { echo "strict: rc=$rc"; cat "$TMP/err"; exit 1; }
"$FERRY" train --model "$TMP/base" --output-dir "$TMP/x" > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 2 ] || { echo "--model without --data: rc=$rc"; cat "$TMP/err"; exit 1; }
"$FERRY" train --output-dir "$TMP/x" --lr -1 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 2 ] || { echo "negative lr: rc=$rc"; exit 1; }
mkdir -p "$TMP/empty"
"$FERRY" train "${tiny[@]}" --max-steps 1 --output-dir "$TMP/y" --resume "$TMP/empty" > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "no checkpoint in" "$TMP/err" || { echo "resume empty: rc=$rc"; cat "$TMP/err"; exit 1; }
echo "train cli: ok"
