#!/usr/bin/env bash
# `ferry perplexity --device cuda` (the serving engine on the GPU) against `--device cpu`, on the
# dense and MoE fixtures: per-token log-probs within 1e-4 (f32 weights on both; different kernels
# and summation order), one window and several; on the GPU paged (2 slots, every step misses),
# LFU and static give resident's bits. Prints "SKIPPED: why" where ferry has no CUDA or no device.
set -euo pipefail
FERRY="$1"; ROOT="$2"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
printf '5 17 200 3 3 99 250 0 12 7\n41 8\n' > "$TMP/ids.txt"

probe_err="$TMP/probe.err"
if ! "$FERRY" perplexity --model "$ROOT/tests/data/models/qwen3" --token-ids "$TMP/ids.txt" \
     --device cuda --json > /dev/null 2> "$probe_err"; then
  if grep -q "unavailable: " "$probe_err"; then
    echo "SKIPPED: $(grep -o 'unavailable: .*' "$probe_err" | head -1)"
    exit 0
  fi
  cat "$probe_err" >&2; exit 1
fi

compare() {  # compare A.json B.json LABEL TOL (TOL 0: the same bits)
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
label, tol = sys.argv[3], float(sys.argv[4])
assert a["predicted"] == b["predicted"] == 11, (label, a["predicted"], b["predicted"])
worst = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
if tol == 0:
    assert a["logprobs"] == b["logprobs"], (label, "not the same bits", worst)
else:
    assert worst < tol, (label, worst)
print(f"{label}: max |d logprob| {worst:.3g}")
PY
}

for m in qwen3 llama qwen3_moe mixtral olmoe; do
  model="$ROOT/tests/data/models/$m"
  for ctx in 1024 4; do
    "$FERRY" perplexity --model "$model" --token-ids "$TMP/ids.txt" --context $ctx --json \
      2>/dev/null > "$TMP/cpu.json"
    "$FERRY" perplexity --model "$model" --token-ids "$TMP/ids.txt" --context $ctx --json \
      --device cuda 2>/dev/null > "$TMP/cuda.json"
    compare "$TMP/cpu.json" "$TMP/cuda.json" "$m context $ctx cuda vs cpu" 1e-4
    if [[ $m == qwen3_moe || $m == mixtral || $m == olmoe ]]; then
      for flags in "--mode paged --expert-slots 2" "--mode paged --expert-slots 2 --policy lfu" \
                   "--mode static"; do
        # shellcheck disable=SC2086
        "$FERRY" perplexity --model "$model" --token-ids "$TMP/ids.txt" --context $ctx --json \
          --device cuda $flags 2>/dev/null > "$TMP/mode.json"
        compare "$TMP/cuda.json" "$TMP/mode.json" "$m context $ctx cuda $flags == resident" 0
      done
    fi
  done
done
echo "perplexity_cuda: ok"
