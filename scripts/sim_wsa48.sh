#!/usr/bin/env bash
# The MV-WSA simulator's 48-layer table (docs/serve_wsa.md, "Workload, by the simulator with bf16
# K/V"): Qwen3-30B-A3B geometry, 24 GiB, bf16 K/V, the H200-fitted step model (22.8 ms a step,
# 1.47 ms a token, 53 GB/s), prefix cache on, concurrency 4, every policy with the oracle; one
# run per workload "SESSIONSxTURNS_TURNTOKENS" of WORKLOADS. Modelled seconds: runs on any CPU.
#   B=build/rel OUT=dir bash scripts/sim_wsa48.sh
# Writes OUT/serve_split_sim48_kv2_<workload>.{json,txt} and prints each run's table.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build/rel}
OUT=${OUT:-/tmp/sim_wsa48}
WORKLOADS=${WORKLOADS:-"4x2_128 4x3_128 5x2_64 5x2_128 6x2_64 6x2_128 7x2_64 8x2_64 8x2_128 6x3_128"}
mkdir -p "$OUT"
cmake --build "$B" --target serve_split_bench >/dev/null
for w in $WORKLOADS; do
  s=${w%%x*}
  rest=${w#*x}
  t=${rest%%_*}
  u=${rest#*_}
  "$B/bench/serve_split_bench" --budget-gib 24 --layers 48 --kv-bytes 2 --link-gbps 53 \
    --step-base-ms 22.8 --token-ms 1.47 --prefix-cache on --sessions "$s" --turns "$t" \
    --user-max "$u" --output-max "$u" --json "$OUT/serve_split_sim48_kv2_$w.json" \
    >"$OUT/serve_split_sim48_kv2_$w.txt" 2>&1
  echo "== $w"
  grep -E "^(policy|fixed|expert|kv-|mv-wsa|oracle)" "$OUT/serve_split_sim48_kv2_$w.txt" | head -12
done
