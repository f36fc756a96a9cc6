#!/usr/bin/env bash
# CLI checks of `ferry perplexity` on a fixture model: the reported mean NLL equals the loss the
# model golden test checks against transformers (the fixture's nll over every next-token target),
# JSON carries per-token log-probs, and bad inputs exit 1 (runtime) or 2 (usage) with a message.
set -euo pipefail
FERRY="$1"; ROOT="$2"
MODEL="$ROOT/tests/data/models/qwen3"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT

printf '5 17 200 3 3 99 250 0 12 7\n41 8\n' > "$TMP/ids.txt"
out="$("$FERRY" perplexity --model "$MODEL" --token-ids "$TMP/ids.txt" --json)"
python3 - "$out" <<'PY'
import json, math, sys
r = json.loads(sys.argv[1])
assert r["tokens"] == 12 and r["predicted"] == 11, r
assert len(r["logprobs"]) == 11
assert all(lp <= 0 for lp in r["logprobs"])
mean = -sum(r["logprobs"]) / 11
assert abs(mean - r["mean_nll"]) < 1e-5, (mean, r["mean_nll"])
assert abs(math.exp(r["mean_nll"]) - r["perplexity"]) < 1e-3 * r["perplexity"]
PY

# Windows: the same tokens scored with --context 4 predict the same number of tokens.
out4="$("$FERRY" perplexity --model "$MODEL" --token-ids "$TMP/ids.txt" --context 4 --json)"
python3 -c "import json,sys; r=json.loads(sys.argv[1]); assert r['predicted']==11, r" "$out4"

# Bad inputs: a non-numeric id, an id past the vocabulary, a missing model folder.
printf '1 2 x3\n' > "$TMP/bad.txt"
set +e
"$FERRY" perplexity --model "$MODEL" --token-ids "$TMP/bad.txt" 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "not a non-negative token id" "$TMP/err" || { echo "bad id: rc=$rc"; cat "$TMP/err"; exit 1; }
printf '1 2 100000\n' > "$TMP/big.txt"
"$FERRY" perplexity --model "$MODEL" --token-ids "$TMP/big.txt" 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "outside the vocabulary" "$TMP/err" || { echo "big id: rc=$rc"; cat "$TMP/err"; exit 1; }
"$FERRY" perplexity --model "$TMP/nope" --token-ids "$TMP/ids.txt" 2> "$TMP/err"; rc=$?
[ "$rc" -eq 2 ] || { echo "missing dir: rc=$rc"; cat "$TMP/err"; exit 1; }
echo "perplexity cli: ok"
