#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_train_profile.sh
# Where a training step's GPU time goes, ferry against the PyTorch baseline on the same shapes,
# both under Nsight Systems in one call: `ferry bench train --device cuda` (PROF_FLAGS) and
# tools/bench/train_torch_baseline.py (PROF_TORCH_FLAGS), then `nsys stats` per-kernel sums.
# Default shapes: Qwen2.5-7B's layers (--arch qwen2), 4 of its 28 layers, batch 16 x 1024, the
# host policy, 1 warm-up + 2 timed steps; torch with HF activation checkpointing (as the 7B
# baseline runs). Files in $OUT: build.log, {ferry,torch}.log (the runs' own output),
# {ferry,torch}_kernels.csv (nsys cuda_gpu_kern_sum), kernels_top.txt (both sides' top kernels
# by total time and the grouped totals from tools/bench/kernel_groups.py).
# The nsys reports themselves stay in /tmp (large). Exit status non-zero when nothing ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_train_profile}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu}
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then
  echo "no nsys on this machine"
  exit 1
fi
{
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
    -DFERRY_BUILD_ROUTE=OFF
  cmake --build "$B" -j16 --target ferry
} >"$OUT/build.log" 2>&1 || {
  echo "BUILD FAILED"
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
  exit 1
}
PY=python3
$PY -c "import transformers" 2>/dev/null || PY=/opt/torch/.venv/bin/python3
PROF_FLAGS=${PROF_FLAGS:---geometry qwen2.5-7b --arch qwen2 --layers 4 --batch-size 16 --seq-len 1024 --master bf16-kahan --optimizer-states 8bit --grad-dtype bf16 --device-budget-mib 40960 --policies host --steps 2 --warmup 1}
PROF_TORCH_FLAGS=${PROF_TORCH_FLAGS:---geometry qwen2.5-7b --arch qwen2 --layers 4 --batch 16 --seq 1024 --steps 2 --warmup 1 --checkpointing}
# shellcheck disable=SC2086
timeout 240 "$NSYS" profile -t cuda -o /tmp/prof_ferry -f true \
  "$B/apps/ferry/ferry" bench train --device cuda $PROF_FLAGS >"$OUT/ferry.log" 2>&1 ||
  echo "ferry profile run failed (ferry.log)"
# shellcheck disable=SC2086
timeout 240 "$NSYS" profile -t cuda -o /tmp/prof_torch -f true \
  $PY tools/bench/train_torch_baseline.py $PROF_TORCH_FLAGS >"$OUT/torch.log" 2>&1 ||
  echo "torch profile run failed (torch.log)"
for side in ferry torch; do
  [ -f /tmp/prof_$side.nsys-rep ] || continue
  "$NSYS" stats -q -r cuda_gpu_kern_sum -f csv -o /tmp/k_$side /tmp/prof_$side.nsys-rep \
    >/dev/null 2>&1
  cp /tmp/k_${side}_cuda_gpu_kern_sum.csv "$OUT/${side}_kernels.csv" 2>/dev/null ||
    echo "no kernel summary for $side"
done
$PY tools/bench/kernel_groups.py "$OUT/ferry_kernels.csv" "$OUT/torch_kernels.csv" |
  tee "$OUT/kernels_top.txt"
grep -E "tok/s|TFLOPS" "$OUT/ferry.log" | tail -3
grep -E "tokens_per_s|step_ms_median" "$OUT/torch.log" | tail -3
