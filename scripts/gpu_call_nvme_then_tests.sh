#!/usr/bin/env bash
# Run THERE (the GPU machine) as one device call, from the repo root, for a session short of
# device time: within DEADLINE_S seconds (default 470) of its start, always leaving time to pack
# the results:
#   1. builds `ferry` (Release, CUDA, sm_90a) in build/gpu;
#   2. the #7 NVMe out-of-sample check (scripts/gpu_plan_nvme.sh with FIRST_BENCH=0, GPU_GB=19);
#   3. with the time left (>= 150 s), builds gpu_test and runs GPU_TEST_FILTER (default: the
#      device slot resolution tests, LFU included, and the attention tests).
# Output under $OUT/r (gpu.txt, build.log, nvme/, nvme_summary.txt, build_test.log,
# gpu_test.log), packed as $OUT/all.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
B=build/gpu
R=$OUT/r
mkdir -p "$R"
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-470}
left() { local l=$((DEADLINE_S - ($(date +%s) - T0))); echo $((l > 5 ? l : 5)); }
nvidia-smi --query-gpu=name,memory.total --format=csv >"$R/gpu.txt" 2>&1
if timeout 200 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=OFF \
  -DFERRY_BUILD_ROUTE=OFF >"$R/cmake.log" 2>&1 &&
  timeout "$(left)" cmake --build "$B" -j16 --target ferry >"$R/build.log" 2>&1; then
  FIRST_BENCH=0 GPU_GB=19 BENCH_TIMEOUT=150 OUT=$R/nvme timeout "$(($(left) - 10))" \
    bash scripts/gpu_plan_nvme.sh 2>&1 | tee "$R/nvme_summary.txt" | tail -30
else
  echo "BUILD FAILED"
  tail -20 "$R/build.log"
fi
if [ "$(left)" -ge 150 ]; then
  timeout "$(($(left) - 40))" cmake --build "$B" -j16 --target gpu_test >"$R/build_test.log" 2>&1 &&
    timeout "$(left)" "$B/tests/gpu_test" \
      --gtest_filter="${GPU_TEST_FILTER:-ServeDeviceResolve*:MoeFixtures/ServeDeviceResolveCuda*:KernelsAttention.*}" \
      >"$R/gpu_test.log" 2>&1
  echo "gpu_test exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|lfu" "$R/gpu_test.log" | tail -20
else
  echo "no time left for gpu_test ($(left) s)"
fi
cd "$OUT" && tar czf all.tgz r
