#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_train_profile.sh
# Where a training step's GPU time goes, ferry against the PyTorch baseline on the same shapes,
# both under Nsight Compute (one metric: each kernel's duration) in one call: `ferry bench train
# --device cuda` (PROF_FLAGS) and tools/bench/train_torch_baseline.py (PROF_TORCH_FLAGS).
# Default shapes: Qwen2.5-7B's layers (--arch qwen2), 4 of its 28 layers, batch 16 x 1024, the
# host policy, one step each (no warm-up); torch with HF activation checkpointing (as the 7B
# baseline runs). Files in $OUT: build.log, {ferry,torch}.log (the runs' own output, their
# speeds are not meaningful under ncu), {ferry,torch}_ncu.csv, kernels_top.txt (both sides' top
# kernels by total time and the family totals from tools/bench/kernel_groups.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_train_profile}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
{
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
    -DFERRY_BUILD_ROUTE=OFF
  cmake --build "$B" -j16 --target ferry
} >"$OUT/build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
  exit 1
}
PY=python3
$PY -c "import transformers" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
PROF_FLAGS=${PROF_FLAGS:---geometry qwen2.5-7b --arch qwen2 --layers 4 --batch-size 16 --seq-len 1024 --master bf16-kahan --optimizer-states 8bit --grad-dtype bf16 --device-budget-mib 40960 --policies host --steps 1 --warmup 0}
PROF_TORCH_FLAGS=${PROF_TORCH_FLAGS:---geometry qwen2.5-7b --arch qwen2 --layers 4 --batch 16 --seq 1024 --steps 1 --warmup 0 --checkpointing}
# ncu with one metric (each kernel's duration, kernels serialized: a kernel family's GPU time,
# not the step's wall time or its overlap). FERRY_DETERMINISTIC=1: cuBLASLt's heuristic choice,
# so the first step does not time 16 candidates per GEMM shape; one step on each side.
prof() {
  local side=$1
  shift
  timeout 300 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    --print-units base --log-file "$OUT/${side}_ncu.csv" "$@" >"$OUT/$side.log" 2>&1 ||
    echo "$side profile run failed ($side.log)"
}
# shellcheck disable=SC2086
FERRY_DETERMINISTIC=1 prof ferry "$B/apps/ferry/ferry" bench train --device cuda $PROF_FLAGS
# shellcheck disable=SC2086
prof torch $PY tools/bench/train_torch_baseline.py $PROF_TORCH_FLAGS
$PY tools/bench/kernel_groups.py "$OUT/ferry_ncu.csv" "$OUT/torch_ncu.csv" |
  tee "$OUT/kernels_top.txt"
grep -E "tok/s|TFLOPS" "$OUT/ferry.log" | tail -3
grep -E "tokens_per_s|step_ms_median" "$OUT/torch.log" | tail -3
