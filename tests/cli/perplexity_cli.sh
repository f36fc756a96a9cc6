#!/usr/bin/env bash
# CLI checks of `ferry perplexity` on a fixture model: the reported mean NLL equals the loss the
# model golden test checks against transformers (the fixture's nll over every next-token target),
# JSON carries per-token log-probs, and bad inputs exit 1 (runtime) or 2 (usage) with a message.
# The serving engine (--engine serve, the default) agrees with the training forward (--engine
# compute) on dense and MoE fixtures, and its paged mode gives resident mode's bits.
set -euo pipefail
FERRY="$1"; ROOT="$2"
MODEL="$ROOT/tests/data/models/qwen3"
MOE="$ROOT/tests/data/models/qwen3_moe"
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

# The two engines agree per token (both f32 on the CPU; different kernels and summation order),
# on a dense and a MoE fixture, with one window and with several.
for m in qwen3 qwen3_moe mixtral; do
  for ctx in 1024 4; do
    a="$("$FERRY" perplexity --model "$ROOT/tests/data/models/$m" --token-ids "$TMP/ids.txt" --context $ctx --json 2>/dev/null)"
    b="$("$FERRY" perplexity --model "$ROOT/tests/data/models/$m" --token-ids "$TMP/ids.txt" --context $ctx --engine compute --json)"
    python3 - "$a" "$b" "$m $ctx" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["engine"] == "serve" and b["engine"] == "compute", (a["engine"], b["engine"])
assert a["predicted"] == b["predicted"] == 11, sys.argv[3]
worst = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
assert worst < 1e-4, (sys.argv[3], worst)
assert abs(a["mean_nll"] - b["mean_nll"]) < 1e-5, sys.argv[3]
PY
  done
done

# Overlapping windows (--stride 1 --context 4): every token after the first still scored once,
# token t (t >= 4) given exactly tokens t-4 .. t-1: equal to scoring those 5 tokens alone; the two
# engines agree; a stride over the context is a usage error.
for e in serve compute; do
  s1="$("$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --context 4 --stride 1 --engine $e --json 2>/dev/null)"
  echo "$s1" > "$TMP/stride_$e.json"
  python3 - "$s1" "$TMP/win.txt" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["predicted"] == 11, r["predicted"]
ids = [5, 17, 200, 3, 3, 99, 250, 0, 12, 7, 41, 8]
open(sys.argv[2], "w").write(" ".join(map(str, ids[3:8])) + "\n")  # tokens 3..7: predicts 7 last
PY
  one="$("$FERRY" perplexity --model "$MOE" --token-ids "$TMP/win.txt" --context 4 --engine $e --json 2>/dev/null)"
  python3 - "$s1" "$one" "$e" <<'PY'
import json, sys
r, one = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert abs(r["logprobs"][6] - one["logprobs"][-1]) < 1e-5, (sys.argv[3], r["logprobs"][6], one["logprobs"][-1])
PY
done
python3 - "$TMP/stride_serve.json" "$TMP/stride_compute.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4
PY
set +e
"$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --context 4 --stride 5 2> "$TMP/err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "stride" "$TMP/err" || { echo "stride > context: rc=$rc"; cat "$TMP/err"; exit 1; }

# The pager: paged with 2 slots per layer (top-2 of 8 experts: every step misses) and LFU, static,
# and cpu-experts score the same bits as resident (cpu-experts: within a tolerance, its experts run
# on other CPU kernels); --max-running 1 (one window per step: other GEMM shapes) within one too.
ref="$("$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --context 4 --json 2>/dev/null)"
for flags in "--mode paged --expert-slots 2" "--mode paged --expert-slots 3 --policy lfu" \
             "--mode static"; do
  # shellcheck disable=SC2086
  got="$("$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --context 4 --json $flags 2>/dev/null)"
  python3 - "$ref" "$got" "$flags" <<'PY'
import json, sys
r, g = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert g["logprobs"] == r["logprobs"], (sys.argv[3], g["logprobs"], r["logprobs"])
PY
done
for flags in "--mode cpu-experts" "--max-running 1 --mode paged --expert-slots 2"; do
  # shellcheck disable=SC2086
  got="$("$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --context 4 --json $flags 2>/dev/null)"
  python3 - "$ref" "$got" "$flags" <<'PY'
import json, sys
r, g = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert max(abs(x - y) for x, y in zip(r["logprobs"], g["logprobs"])) < 1e-4, sys.argv[3]
PY
done

# No --model: the built-in MoE and its byte-level tokenizer, on a text file; the context is capped
# at the model's positions (it says so) and every token after the first is still predicted once.
head -c 3000 "$ROOT/README.md" > "$TMP/text.txt"
out="$("$FERRY" perplexity --text-file "$TMP/text.txt" --context 100000 --json 2> "$TMP/log")"
grep -q "capped at" "$TMP/log" || { echo "no cap message"; cat "$TMP/log"; exit 1; }
python3 - "$out" <<'PY'
import json, math, sys
r = json.loads(sys.argv[1])
assert r["model"] == "builtin-qwen3-moe" and r["predicted"] == r["tokens"] - 1 > 100, r["predicted"]
assert r["windows"] > 1 and math.isfinite(r["mean_nll"]), r
PY
# Many windows go in groups of 4 x --max-running: ~47 windows of 64 tokens in groups of 4 and of
# 16 score every token once, the same within the batching's rounding.
a="$("$FERRY" perplexity --text-file "$TMP/text.txt" --context 64 --max-running 1 --json 2>/dev/null)"
b="$("$FERRY" perplexity --text-file "$TMP/text.txt" --context 64 --json 2>/dev/null)"
python3 - "$a" "$b" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["windows"] == b["windows"] > 40 and a["predicted"] == b["predicted"] == a["tokens"] - 1, a
assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4
PY

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
# --backend belongs to --engine compute; compute needs a folder; too few slots is the engine's error.
"$FERRY" perplexity --model "$MODEL" --token-ids "$TMP/ids.txt" --backend reference 2> "$TMP/err"; rc=$?
[ "$rc" -eq 2 ] && grep -q "engine compute" "$TMP/err" || { echo "backend: rc=$rc"; cat "$TMP/err"; exit 1; }
"$FERRY" perplexity --token-ids "$TMP/ids.txt" --engine compute 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "needs --model" "$TMP/err" || { echo "compute no model: rc=$rc"; cat "$TMP/err"; exit 1; }
"$FERRY" perplexity --model "$MOE" --token-ids "$TMP/ids.txt" --mode paged --expert-slots 1 2> "$TMP/err"; rc=$?
[ "$rc" -eq 1 ] || { echo "1 slot under top-2: rc=$rc"; cat "$TMP/err"; exit 1; }
echo "perplexity cli: ok"
