#!/usr/bin/env bash
# CLI checks of `ferry generate` on the Qwen3-MoE fixture: greedy ids are the same in resident and
# paged mode, paged with the device-path switch off (--no-device-resolve: the host pager's
# per-layer round trip; on the CPU engine the default runs the resolver's CPU twin) gives the same
# ids and the same pager counters, --no-cuda-graphs is accepted, --kv-dtype bf16 holds twice the
# KV blocks in the same --kv-budget-mib (resident and paged give the same ids with it), and bad
# inputs exit non-zero with a message (too few slots for top-k; --device cuda without a GPU; an
# unknown --kv-dtype).
set -euo pipefail
FERRY="$1"; ROOT="$2"
MODEL="$ROOT/tests/data/models/qwen3_moe"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
printf '5 17 200 3 3 99 250 0 12 7\n' > "$TMP/ids.txt"
gen() { "$FERRY" generate --model "$MODEL" --token-ids "$TMP/ids.txt" --max-new-tokens 16 --json "$@"; }

gen > "$TMP/resident.json"
gen --mode paged --expert-slots 3 > "$TMP/paged.json"
gen --mode paged --expert-slots 3 --no-device-resolve > "$TMP/paged_host.json"
gen --mode paged --expert-slots 3 --no-cuda-graphs > "$TMP/paged_nograph.json"
gen --kv-dtype bf16 > "$TMP/bf16kv.json"
gen --kv-dtype bf16 --mode paged --expert-slots 3 > "$TMP/bf16kv_paged.json"
python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/{k}.json"))
     for k in ("resident", "paged", "paged_host", "paged_nograph", "bf16kv", "bf16kv_paged")}
f, b = r["resident"], r["bf16kv"]
assert f["kv_dtype"] == "f32" and b["kv_dtype"] == "bf16", (f["kv_dtype"], b["kv_dtype"])
assert 2 * b["kv_block_bytes"] == f["kv_block_bytes"], (b["kv_block_bytes"], f["kv_block_bytes"])
assert b["kv_blocks"] >= 2 * f["kv_blocks"], (b["kv_blocks"], f["kv_blocks"])
assert r["bf16kv_paged"]["ids"] == b["ids"], (r["bf16kv_paged"]["ids"], b["ids"])
ids = r["resident"]["ids"]
assert len(ids) == 16, ids
for k in ("paged", "paged_host", "paged_nograph"):
    assert r[k]["ids"] == ids, (k, r[k]["ids"], ids)
p, h = r["paged"]["pager"], r["paged_host"]["pager"]
assert p["misses"] > 0 and p["evictions"] > 0, p  # the cap is tight enough to page
for key in ("hits", "misses", "evictions", "bytes_copied", "copy_batches", "slots"):
    assert p[key] == h[key], (key, p[key], h[key])
PY

# Bad inputs: fewer slots than the model's top-k (2) is refused with a message, exit 1.
set +e
gen --mode paged --expert-slots 1 2> "$TMP/err" > /dev/null; rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "expected a refusal for 1 slot < top-k"; exit 1; }
grep -q "top-k" "$TMP/err" || { echo "no top-k message:"; cat "$TMP/err"; exit 1; }
set +e
gen --kv-dtype fp8 2> "$TMP/err" > /dev/null; rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "expected a refusal for --kv-dtype fp8"; exit 1; }
grep -q "kv-dtype" "$TMP/err" || { echo "no --kv-dtype message:"; cat "$TMP/err"; exit 1; }
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi > /dev/null 2>&1; then
  set +e
  gen --device cuda 2> "$TMP/err" > /dev/null; rc=$?
  set -e
  [ "$rc" -ne 0 ] || { echo "--device cuda without a GPU should fail"; exit 1; }
  [ -s "$TMP/err" ] || { echo "--device cuda failed without a message"; exit 1; }
fi
# --chat (built-in model: ChatML): the prompt is the rendered turn — 39 byte-level tokens for
# <|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
# (each special token one id) — and --logprobs 2 gives every generated token two alternatives.
"$FERRY" generate --prompt hi --chat --system "be brief" --max-new-tokens 3 --logprobs 2 --json \
  > "$TMP/chat.json"
python3 - "$TMP/chat.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["prefill_tokens"] == 39, j["prefill_tokens"]
assert len(j["logprobs"]) == len(j["ids"]) and all(len(e["top"]) == 2 for e in j["logprobs"]), j
PY
set +e
"$FERRY" generate --prompt hi --system "x" > /dev/null 2> "$TMP/err"; rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "--system without --chat should be refused"; exit 1; }
echo "generate_cli: ok"
