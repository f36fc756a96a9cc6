#!/usr/bin/env bash
# Solved plan vs fixed policies (checkpoint every 4, all boundaries on the GPU, all in host
# memory) for Qwen2.5-3B and 7B geometry at GPU caps of 24, 40 and 80 GB, seq 1024: predicted step
# time, TFLOPS (6*N*B*S / step) and the largest feasible batch of each, as JSON.
# These are PREDICTIONS of ferry's plan cost model (analytic H200 rates, docs/plan.md), not
# measurements (scripts/gpu_plan_caps.sh measures). GPU memory is the cost model's bf16 estimate
# (--executor-device none), as when the committed tables were made; `ferry plan`'s default now
# sizes it as the stream executor allocates it, which fits far smaller batches today.
#
#   bench/plan/plan_compare.sh build/release/apps/ferry/ferry [OUT_DIR]
#
# Host memory: 125 GB (the H200 machine) with 10 bytes/param of host state (bf16 weights +
# fp32 master + 8-bit AdamW states + bf16 grads): 16 bytes/param would not fit 7B in 125 GB.
set -euo pipefail
FERRY="$1"; OUT="${2:-.}"
mkdir -p "$OUT"
# Second set: LazyTrain's 12 GB/s link assumption (--link-gbps 12), where offloading is not free.
for link in h200 12; do
  extra=(); suffix=""
  if [ "$link" != h200 ]; then extra=(--link-gbps "$link"); suffix="_link$link"; fi
  for g in qwen2.5-3b qwen2.5-7b; do
    "$FERRY" plan --geometry "$g" --compare --gpu-caps 24,40,80 --batch-size auto --seq-len 1024 \
      --host-mem-gb 125 --host-state-bytes-per-param 10 --time-limit-s "${TIME_LIMIT_S:-20}" \
      --max-batch 512 --executor-device none "${extra[@]}" --json "$OUT/plan_compare_$g$suffix.json" > /dev/null
    echo "wrote $OUT/plan_compare_$g$suffix.json"
  done
done
