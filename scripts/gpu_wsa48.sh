#!/usr/bin/env bash
# Run THERE (the GPU machine) as ONE device call, from the repo root, carrying
# build/debroot.tar.xz: issue #9's benchmark on the full 48-layer Qwen3-30B-A3B geometry at
# 24 GiB (docs/serve_wsa.md "48-layer run"), within DEADLINE_S seconds (default 450) of its start,
# always leaving the results written:
#   1. builds serve_split_engine_bench (Release, CUDA, sm_90a, benches on) in $B; a build that
#      has not finished by BUILD_BY_S (default 200) leaves no time for the weights and a policy:
#      the script stops there;
#   2. runs it with bf16 K/V and bf16 dense weights (a resizable engine reserves address space for
#      E slots per layer plus the whole pool for K/V, ~74 GiB, but commits only its live split,
#      ~20.3 GiB: mem::VirtualRegion, docs/serve_wsa.md), the workload WSA48_WORKLOAD, the policies
#      WSA48_POLICIES in order (fixed-50 first: the configurator needs its profile), pruned
#      (--prune-slower on) and ended by --deadline-unix 10 s before the deadline, so the JSON,
#      rewritten after every policy, holds every finished policy; WSA48_EXTRA adds flags;
#   3. samples GPU memory (nvidia-smi, every 2 s) and host memory (free, every 5 s) throughout:
#      the bench's device_peak_bytes is the budget's charge (live sizes), device_held_peak_bytes
#      what the pools committed; the sampled peak checks both.
# Output under $R (default $OUT/r): gpu.txt, cmake.log, build.log, wsa48.json, wsa48.txt,
# wsa48_profile.json (the fixed-50 run's profile, for a later call's --configurator-profile),
# gpu_mem.csv, host_mem.txt, summary.txt. The caller packs $R (cd $OUT && tar czf all.tgz r).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/device_env.sh
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-450}
BUILD_BY_S=${BUILD_BY_S:-200}
B=${FERRY_GPU_BUILD:-build/gpu}
R=${R:-$OUT/r}
WSA48_WORKLOAD=${WSA48_WORKLOAD:-"--sessions 6 --turns 2 --user-max 64 --output-max 64"}
WSA48_POLICIES=${WSA48_POLICIES:-fixed-50,configurator,live,expert-heavy,cap-45,kv-heavy}
WSA48_CAPS=${WSA48_CAPS:-"--max-policy-s 100 --policy-s fixed-50=130"}
WSA48_EXTRA=${WSA48_EXTRA:-}
mkdir -p "$R"
D=$((T0 + DEADLINE_S))
# Seconds to a point in time, at least 1 (`timeout 0` would mean no limit at all).
until_s() { local l=$(($1 - $(date +%s))); echo $((l > 1 ? l : 1)); }
left() { until_s "$D"; }
stamp() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$R/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv >"$R/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 2000 \
  >"$R/gpu_mem.csv" 2>&1 &
gpu_mon=$!
(while sleep 5; do
  echo "$(($(date +%s) - T0)) s $(free -m | awk '/^Mem:/ {print "used_mib", $3, "avail_mib", $7}')"
done) >"$R/host_mem.txt" 2>&1 &
host_mon=$!
cleanup() { kill "$gpu_mon" "$host_mon" 2>/dev/null; }
trap cleanup EXIT

built=0
if timeout 120 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON \
  -DFERRY_BUILD_ROUTE=OFF >"$R/cmake.log" 2>&1 &&
  timeout "$(until_s $((T0 + BUILD_BY_S)))" cmake --build "$B" -j16 \
    --target serve_split_engine_bench >"$R/build.log" 2>&1; then
  built=1
  stamp "built serve_split_engine_bench"
else
  stamp "BUILD FAILED or past ${BUILD_BY_S} s"
  grep -E "error|FAILED" "$R/build.log" "$R/cmake.log" 2>/dev/null | head -20 | tee -a "$R/summary.txt"
fi

if [ "$built" = 1 ]; then
  stamp "wsa48: $WSA48_WORKLOAD, policies $WSA48_POLICIES, $(left) s left"
  # shellcheck disable=SC2086
  timeout "$(left)" "$B/bench/serve_split_engine_bench" --device cuda --layers 48 --budget-gib 24 \
    --kv-dtype bf16 --dense-dtype bf16 $WSA48_WORKLOAD --policies "$WSA48_POLICIES" \
    --prune-slower on $WSA48_CAPS --save-profile "$R/wsa48_profile.json" \
    --deadline-unix $((D - 10)) --json "$R/wsa48.json" $WSA48_EXTRA >"$R/wsa48.txt" 2>&1
  stamp "wsa48 bench exit $?"
  # The setup, one line per policy, the ratios and the live decisions (not the progress lines).
  grep -v -e "^\[" -e "^  \[" "$R/wsa48.txt" | tail -40 | tee -a "$R/summary.txt"
fi
cleanup
# The memory check: the highest GPU memory sampled (MiB of the total) and the lowest host
# MemAvailable.
sort -t, -k2 -n "$R/gpu_mem.csv" 2>/dev/null | tail -1 | sed 's/^/highest GPU memory sampled (MiB used, total): /' |
  tee -a "$R/summary.txt"
sort -k6 -n "$R/host_mem.txt" 2>/dev/null | head -1 | sed 's/^/lowest host MemAvailable sampled: /' |
  tee -a "$R/summary.txt"
stamp "done"
