#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with build/debroot.tar.xz carried:
#   OUT=$OUT/r STAGES="build test bench mem" bash scripts/gpu_small_m_check.sh
#   OUT=$OUT/r STAGES="paced" bash scripts/gpu_small_m_check.sh      (a warm machine: no rebuild)
# The small-m GEMM's pipelined loop (docs/cuda.md "Small-m GEMM: loads in flight"), programmatic
# dependent launch (docs/cuda.md "Programmatic dependent launch") and issue #3's
# memory-bound rows, in build/gpu (Release, sm_90a, tests and benches):
#   build  ferry, gpu_test, cuda_kernels_bench (BUILD_TARGETS overrides the list)
#   test   gpu_test under FERRY_SMALL_M_PIPELINE=1: the two loops' bits (KernelsSmallMLoop.*), the
#          pipelined loop as the default against f64 and the f32 kernel (KernelsDense.*SmallM*,
#          ServeDenseBf16*, ServeDecodeFusion*), and the no-VMM memory tests
#          (MemVirtualRegionGpu.*, ServeWsaMemoryCuda.*): gpu_test.log
#   pdltest  gpu_test under FERRY_PDL=1 and FERRY_SMALL_M_PIPELINE=1 (programmatic dependent
#          launch, kernels/cuda/pdl.cuh): KernelsPdl.* and the serve bit tests (decode fusions,
#          device resolution, graphs, bf16 dense, every expert mode; PDL_FILTER overrides the
#          list): gpu_test_pdl.log
#   all    the whole gpu_test with the defaults (both on since session 40): gpu_test_all.log
#   bench  cuda_kernels_bench's BM_SmallMGemm / BM_SmallMQkv rows, one-step and pipelined loops,
#          with same-size copies: small_m.json + small_m.txt
#   mem    the RoPE / embedding / fused residual norm rows against torch and copies (session 38):
#          ferry_mem.json, torch_mem.json, mem_summary.{json,txt}; then the embedding rows again
#          with the element forward and the compact backward (session 42's A/B):
#          ferry_mem_alt.json, mem_alt_summary.{json,txt}
#   paced  issue #5's paced roofline A/B: `ferry bench serve` 48-layer Qwen3-30B-A3B, bf16 experts
#          and dense, 24 GiB, copies paced to 24 GB/s, paged only, one process per variant of
#          PACED_VARIANTS (default "onestep pipelined pdl"): onestep FERRY_SMALL_M_PIPELINE=0,
#          pipelined =1, pdl =1 with FERRY_PDL=1: paced_<variant>.{json,txt}.
#          PACED_DECODE (default 32) decode tokens; PACED_RUNS (default 1) rounds of the
#          variants, files paced_<variant>_run<r>.{json,txt} when more than one.
#   (stages run in this order: build forced ppl sampler test pdltest all bench mem memcheck paced)
#   forced   MoeFixtures/ServeForcedRoutingCuda.* (host syncs with device resolution): forced.txt
#   ppl      tests/cli/perplexity_cuda.sh (`ferry perplexity --device cuda` vs cpu): ppl_cuda.txt
#   sampler  sampler_bench on this host's threads (pooled rows of a decode step): sampler.{json,txt}
#   memcheck compute-sanitizer memcheck over gpu_test (scripts/gpu_memcheck.sh: all but the tests
#          that make an allocation fail on purpose) and without the long attention test
#          (MEMCHECK_TIMEOUT, default 300 s): memcheck.log
# DEADLINE_S (default 560): stages not started by then are skipped, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_small_m}
mkdir -p "$OUT"
source scripts/device_env.sh
B=build/gpu
STAGES=${STAGES:-"build test bench"}
DEADLINE_S=${DEADLINE_S:-560}
PACED_DECODE=${PACED_DECODE:-32}
BUILD_TARGETS=${BUILD_TARGETS:-"ferry gpu_test cuda_kernels_bench"}
PACED_VARIANTS=${PACED_VARIANTS:-"onestep pipelined pdl"}
PACED_RUNS=${PACED_RUNS:-1}
PDL_FILTER=${PDL_FILTER:-'KernelsPdl.*:KernelsSmallMLoop.*:ServeDecodeFusion*:*DeviceResolve*:*ServeGraphsCuda*:ServeDenseBf16*:*ServeModesCuda*'}
t0=$(date +%s)
status=0
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
in_time() {
  if [ $(($(date +%s) - t0)) -ge "$DEADLINE_S" ]; then
    stamp "skipped $1: past DEADLINE_S=$DEADLINE_S"
    return 1
  fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$OUT/gpu.txt"
cat "$OUT/gpu.txt"

if has build; then
  {
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON \
      -DFERRY_BUILD_ROUTE=OFF
    # shellcheck disable=SC2086
    cmake --build "$B" -j16 --target $BUILD_TARGETS
  } >>"$OUT/build.log" 2>&1 || {
    stamp "BUILD FAILED"
    grep -E "error|FAILED" "$OUT/build.log" | head -30
    exit 1
  }
  stamp "built"
fi

if has forced && in_time forced; then
  timeout 60 "$B/tests/gpu_test" --gtest_filter='MoeFixtures/ServeForcedRoutingCuda.*' >"$OUT/forced.txt" 2>&1 || status=1
  grep -E "resolved|^\[  (PASSED|FAILED)" "$OUT/forced.txt"
  stamp "forced routing test done"
fi

if has ppl && in_time ppl; then
  timeout 120 bash tests/cli/perplexity_cuda.sh "$B/apps/ferry/ferry" "$PWD" >"$OUT/ppl_cuda.txt" 2>&1 || status=1
  tail -3 "$OUT/ppl_cuda.txt"
  stamp "perplexity cuda done"
fi

if has sampler && in_time sampler; then
  timeout 120 "$B/bench/sampler_bench" --json "$OUT/sampler.json" >"$OUT/sampler.txt" 2>&1 || status=1
  tail -12 "$OUT/sampler.txt"
  stamp "sampler bench done"
fi

if has test && in_time test; then
  FERRY_SMALL_M_PIPELINE=1 timeout 150 "$B/tests/gpu_test" --gtest_filter='KernelsSmallMLoop.*:KernelsDense.*SmallM*:ServeDenseBf16*:ServeDecodeFusion*:MemVirtualRegionGpu.*:ServeWsaMemoryCuda.*' \
    >"$OUT/gpu_test.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|SKIPPED|tests ran|Failure" "$OUT/gpu_test.log" | head -30
  stamp "tests done"
fi

if has pdltest && in_time pdltest; then
  FERRY_SMALL_M_PIPELINE=1 FERRY_PDL=1 timeout 150 "$B/tests/gpu_test" --gtest_filter="$PDL_FILTER" \
    >"$OUT/gpu_test_pdl.log" 2>&1 || status=1
  grep -E "kernels_pdl|PASSED|FAILED|SKIPPED|tests ran|Failure" "$OUT/gpu_test_pdl.log" | head -30
  stamp "pdl tests done"
fi

if has all && in_time all; then
  # The whole GPU suite with the defaults (both changes on since session 40).
  timeout "${ALL_TIMEOUT:-300}" "$B/tests/gpu_test" >"$OUT/gpu_test_all.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|programmatic" "$OUT/gpu_test_all.log" | head -20
  stamp "whole gpu_test done"
fi

if has bench && in_time bench; then
  timeout 120 "$B/bench/cuda_kernels_bench" --benchmark_filter='SmallM|Copy/(8388608|10485760|310378496|1073741824)/' \
    --benchmark_out="$OUT/small_m.json" --benchmark_out_format=json >"$OUT/small_m.txt" 2>&1 ||
    status=1
  grep -E "BM_" "$OUT/small_m.txt" | sed -E 's/ +/ /g' | head -40
  stamp "small-m bench done"
fi

if has mem && in_time mem; then
  timeout 150 "$B/bench/cuda_kernels_bench" --benchmark_filter='Rope|Embedding|AddRmsNorm|Copy' \
    --benchmark_out="$OUT/ferry_mem.json" --benchmark_out_format=json >"$OUT/ferry_mem.txt" 2>&1 ||
    status=1
  PY=python3
  $PY -c 'import torch' 2>/dev/null || PY=/opt/torch/.venv/bin/python3
  timeout 150 $PY tools/bench/torch_baselines.py --only rope,embedding,add_norm \
    --out "$OUT/torch_mem.json" >"$OUT/torch_mem.txt" 2>&1 || status=1
  $PY tools/bench/compare.py "$OUT/ferry_mem.json" "$OUT/torch_mem.json" \
    --out "$OUT/mem_summary.json" >"$OUT/mem_summary.txt" 2>&1 || status=1
  tail -40 "$OUT/mem_summary.txt"
  # The embedding A/B (session 42): the other kernels of the same rows, same torch times.
  FERRY_EMBEDDING_FWD=element FERRY_EMBEDDING_BWD=compact timeout 100 "$B/bench/cuda_kernels_bench" \
    --benchmark_filter='Embedding|Copy' --benchmark_out="$OUT/ferry_mem_alt.json" \
    --benchmark_out_format=json >"$OUT/ferry_mem_alt.txt" 2>&1 || status=1
  $PY tools/bench/compare.py "$OUT/ferry_mem_alt.json" "$OUT/torch_mem.json" \
    --out "$OUT/mem_alt_summary.json" >"$OUT/mem_alt_summary.txt" 2>&1 || status=1
  echo "embedding rows with FERRY_EMBEDDING_FWD=element FERRY_EMBEDDING_BWD=compact:"
  grep -E "BM_Embedding" "$OUT/mem_alt_summary.txt" | head -8
  stamp "mem rows done"
fi

if has memcheck && in_time memcheck; then
  MEMCHECK_TIMEOUT=${MEMCHECK_TIMEOUT:-300} bash scripts/gpu_memcheck.sh "$B/tests/gpu_test" \
    "$OUT/memcheck.log" KernelsAttention.LongSequencesSampledRows
  stamp "memcheck done"
fi

if has paced; then
  for run in $(seq 1 "$PACED_RUNS"); do
    for variant in $PACED_VARIANTS; do
      in_time "paced $variant" || continue
      pipe=1 pdl=0
      [ "$variant" = onestep ] && pipe=0
      [ "$variant" = pdl ] && pdl=1
      name=paced_$variant
      [ "$PACED_RUNS" -gt 1 ] && name=${name}_run$run
      stamp "paced $variant run $run (FERRY_SMALL_M_PIPELINE=$pipe FERRY_PDL=$pdl)" | tee -a "$OUT/$name.txt"
      FERRY_SMALL_M_PIPELINE=$pipe FERRY_PDL=$pdl timeout 300 "$B/apps/ferry/ferry" bench serve --device cuda \
        --geometry qwen3-30b-a3b --expert-dtype bf16 --dense-dtype bf16 --budget-gib 24 \
        --modes paged --prompt-tokens 128 --decode-tokens "$PACED_DECODE" --link-gbps 24 \
        --json "$OUT/$name.json" >>"$OUT/$name.txt" 2>&1 || {
        echo "paced $variant failed: exit $?" | tee -a "$OUT/$name.txt"
        status=1
      }
      grep -vE "^\[[0-9]{2}:" "$OUT/$name.txt" | tail -8
    done
  done
  stamp "paced done"
fi
exit $status
