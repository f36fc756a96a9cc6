#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, with .debs carried:
#   bash scripts/gpu_serve_check.sh                  (OUT defaults to /tmp/ferry_gpu_serve)
#   STAGES="build bench" bash scripts/gpu_serve_check.sh; STAGES="build test" ...  (a warm
#   machine keeps the build, so a second call only re-runs what changed)
# The CUDA serve engine's check (docs/serve.md "CUDA path"):
#   build  Release `ferry` and `gpu_test` (sm_90)
#   bench  `ferry bench serve --device cuda` per geometry and expert dtype, paged miss copies
#          serial (--serial-miss-copies, the order before the overlap) and overlapped (default),
#          same seed, trace and sizing: bench_<geometry>_<dtype>_<order>.json + bench.txt
#   test   gpu_test's serve tests (TEST_FILTER, default *Serve*): gpu_serve_test.log
#   resolve  the A/B of device-side slot resolution (docs/serve.md): `ferry bench serve --device
#          cuda --geometry RES_GEOM (default qwen3-30b-a3b-2l) --expert-dtype bf16 --modes
#          resident,paged`, with it (default) and with --no-device-resolve:
#          bench_resolve_{device,host}.json + bench_resolve.txt; compare paged decode tok/s,
#          syncs/tok (device: 1 per token, host: 1 + MoE layers) and the graphs line.
#   wsa    MV-WSA on the GPU (issue #9, docs/serve_wsa.md): gpu_test's ServeWsaCuda* (KV resize
#          on the device, resizes while serving keep tokens and logits bits): gpu_wsa_test.log;
#          then serve_split_engine_bench --device cuda (agentic workload, concurrency 4, Qwen3-
#          30B-A3B layer widths on WSA_LAYERS of 48 layers, 24 GiB scaled by layers / 48: fixed
#          splits, configurator, live controller): wsa_bench.json + wsa_bench.txt. WSA_ARGS adds
#          flags (e.g. "--sessions 4 --turns 3 --caps 40"); WSA_TIMEOUT (s) bounds the bench,
#          WSA_DEADLINE (epoch s) ends it by then (the bench writes its JSON after each policy,
#          and is passed --deadline-unix WSA_DEADLINE - 10 so it stops its last policy itself and
#          writes it, incomplete, before the timeout). WSA_TESTS=0 skips the ServeWsaCuda tests
#          and builds only the bench (the 48-layer calls, docs/serve_wsa.md "48-layer run").
#          STAGES="build wsa" builds only gpu_test and the bench.
#   bench48  the full 48-layer Qwen3-30B-A3B geometry at the issue's budget (#5):
#          `ferry bench serve --device cuda --geometry qwen3-30b-a3b --expert-dtype bf16
#          --budget-gib 24` — bf16 experts drawn straight into the pinned host store on every
#          core (~60 GiB of host memory: 58 GB experts + 6 GB f32 dense weights), slots per layer
#          from the budget, resident (no budget, ~65 GB of GPU memory) as the reference:
#          bench48.json + bench48.txt (table and logs) + bench48_mem.txt (free -m every 5 s).
#          B48_MODES (default resident,paged,static), B48_PROMPT (128), B48_DECODE (32),
#          B48_TIMEOUT (s, default 420), B48_EXTRA (more flags). STAGES="build bench48" builds
#          only ferry.
#   bench48paced  the same geometry and budget with the copy stream paced to B48P_GBPS (default
#          24: PCIe Gen4, the RTX 3090 comparison) by timed waits on the GPU (--link-gbps):
#          bench48_paced.json + bench48_paced.txt. B48P_MODES (default resident,paged: static
#          at 24 GB/s needs ~2.4 s per decode token), B48P_DECODE (default B48_DECODE),
#          B48P_TIMEOUT (default 420).
#   bench48nograph  the A/B of decode-step CUDA graphs: --no-cuda-graphs, B48N_MODES (default
#          resident,static: the modes whose decode steps are graphs; paged never is):
#          bench48_nograph.json + bench48_nograph.txt; compare decode tok/s with bench48.json.
#          B48N_TIMEOUT (default 420). Each bench48* stage builds the weights again (~110 s).
# GEOMS (default qwen3-30b-a3b-2l), DTYPES (default "f32 bf16"), MODES (default resident,paged)
# and EXTRA (more bench flags) adjust the bench. Files in $OUT; exit status non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ferry_gpu_serve}
mkdir -p "$OUT"
source scripts/device_env.sh
B=${FERRY_GPU_BUILD:-build/gpu-serve}
STAGES=${STAGES:-"build bench test"}
GEOMS=${GEOMS:-qwen3-30b-a3b-2l}
DTYPES=${DTYPES:-"f32 bf16"}
MODES=${MODES:-resident,paged}
EXTRA=${EXTRA:-}
WSA_LAYERS=${WSA_LAYERS:-2}
WSA_ARGS=${WSA_ARGS:-}
WSA_TIMEOUT=${WSA_TIMEOUT:-200}
WSA_TESTS=${WSA_TESTS:-1}
B48_MODES=${B48_MODES:-resident,paged,static}
B48_PROMPT=${B48_PROMPT:-128}
B48_DECODE=${B48_DECODE:-32}
B48_TIMEOUT=${B48_TIMEOUT:-420}
B48_EXTRA=${B48_EXTRA:-}
B48P_GBPS=${B48P_GBPS:-24}
B48P_MODES=${B48P_MODES:-resident,paged}
B48P_DECODE=${B48P_DECODE:-$B48_DECODE}
B48P_TIMEOUT=${B48P_TIMEOUT:-420}
B48N_MODES=${B48N_MODES:-resident,static}
B48N_TIMEOUT=${B48N_TIMEOUT:-420}
TEST_FILTER=${TEST_FILTER:-*Serve*}
RES_GEOM=${RES_GEOM:-qwen3-30b-a3b-2l}
status=0
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has build; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    targets="ferry gpu_test"
    bench=OFF
    if has wsa; then
      bench=ON
      targets="gpu_test serve_split_engine_bench"
      [ "$WSA_TESTS" = 0 ] && ! has test && targets="serve_split_engine_bench"
      has bench && targets="ferry $targets"
    fi
    # bench / bench48* alone need only the ferry binary.
    has test || has wsa || targets="ferry"
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=$bench \
      -DFERRY_BUILD_ROUTE=OFF
    # Every target before any timing: a compile beside the bench would disturb it.
    # shellcheck disable=SC2086
    cmake --build "$B" -j16 --target $targets
  } >>"$OUT/build.log" 2>&1 || {
    stamp "BUILD FAILED"
    grep -E "error|FAILED" "$OUT/build.log" | head -30
    exit 1
  }
  stamp "built $targets"
fi

if has bench; then
  for g in $GEOMS; do
    for dt in $DTYPES; do
      for order in serial overlap; do
        flag=""
        [ "$order" = serial ] && flag="--serial-miss-copies"
        stamp "bench $g $dt $order" | tee -a "$OUT/bench.txt"
        # shellcheck disable=SC2086
        timeout 150 "$B/apps/ferry/ferry" bench serve --device cuda --geometry "$g" \
          --modes "$MODES" --expert-dtype "$dt" $flag $EXTRA \
          --json "$OUT/bench_${g}_${dt}_${order}.json" >>"$OUT/bench.txt" 2>&1 || {
          echo "bench $g $dt $order failed: exit $?" | tee -a "$OUT/bench.txt"
          status=1
        }
      done
    done
  done
  grep -E "^\[|paged|resident|static|failed" "$OUT/bench.txt" | head -40
fi

if has resolve; then
  for variant in device host; do
    flag=""
    [ "$variant" = host ] && flag="--no-device-resolve"
    stamp "bench resolve $RES_GEOM bf16 $variant" | tee -a "$OUT/bench_resolve.txt"
    # shellcheck disable=SC2086
    timeout 150 "$B/apps/ferry/ferry" bench serve --device cuda --geometry "$RES_GEOM" \
      --modes resident,paged --expert-dtype bf16 $flag $EXTRA \
      --json "$OUT/bench_resolve_${variant}.json" >>"$OUT/bench_resolve.txt" 2>&1 || {
      echo "bench resolve $variant failed: exit $?" | tee -a "$OUT/bench_resolve.txt"
      status=1
    }
  done
  grep -E "^\[|paged|resident|failed" "$OUT/bench_resolve.txt" | head -20
fi

if has bench48; then
  stamp "bench48 qwen3-30b-a3b bf16 24 GiB modes $B48_MODES" | tee -a "$OUT/bench48.txt"
  free -m >>"$OUT/bench48.txt"
  (while sleep 5; do echo "$(($(date +%s) - t0)) s $(free -m | awk '/^Mem:/ {print "used_mib", $3, "avail_mib", $7}')"; done) \
    >>"$OUT/bench48_mem.txt" 2>&1 &
  mem_pid=$!
  b48_t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$B48_TIMEOUT" "$B/apps/ferry/ferry" bench serve --device cuda --geometry qwen3-30b-a3b \
    --expert-dtype bf16 --budget-gib 24 --modes "$B48_MODES" --prompt-tokens "$B48_PROMPT" \
    --decode-tokens "$B48_DECODE" $B48_EXTRA --json "$OUT/bench48.json" >>"$OUT/bench48.txt" 2>&1 || {
    echo "bench48 failed: exit $?" | tee -a "$OUT/bench48.txt"
    status=1
  }
  kill "$mem_pid" 2>/dev/null
  stamp "bench48 done in $(($(date +%s) - b48_t0)) s" | tee -a "$OUT/bench48.txt"
  sort -k4 -n "$OUT/bench48_mem.txt" | tail -1 | sed 's/^/highest host use sampled: /'
  grep -vE "^\[[0-9]{2}:" "$OUT/bench48.txt" | tail -20
  grep -E "weights built|host_bytes|error|skipped" "$OUT/bench48.txt" | head -10
fi

# bench48_variant NAME TIMEOUT MODES DECODE FLAGS...: one more 48-layer run (its own process).
bench48_variant() {
  local name=$1 tmo=$2 modes=$3 decode=$4
  shift 4
  stamp "bench48 $name: modes $modes flags $*" | tee -a "$OUT/bench48_$name.txt"
  local v_t0
  v_t0=$(date +%s)
  timeout "$tmo" "$B/apps/ferry/ferry" bench serve --device cuda --geometry qwen3-30b-a3b \
    --expert-dtype bf16 --budget-gib 24 --modes "$modes" --prompt-tokens "$B48_PROMPT" \
    --decode-tokens "$decode" "$@" --json "$OUT/bench48_$name.json" \
    >>"$OUT/bench48_$name.txt" 2>&1 || {
    echo "bench48 $name failed: exit $?" | tee -a "$OUT/bench48_$name.txt"
    status=1
  }
  stamp "bench48 $name done in $(($(date +%s) - v_t0)) s" | tee -a "$OUT/bench48_$name.txt"
  grep -vE "^\[[0-9]{2}:" "$OUT/bench48_$name.txt" | tail -16
}
if has bench48paced; then
  # shellcheck disable=SC2086
  bench48_variant paced "$B48P_TIMEOUT" "$B48P_MODES" "$B48P_DECODE" --link-gbps "$B48P_GBPS" \
    $B48_EXTRA
fi
if has bench48nograph; then
  # shellcheck disable=SC2086
  bench48_variant nograph "$B48N_TIMEOUT" "$B48N_MODES" "$B48_DECODE" --no-cuda-graphs $B48_EXTRA
fi

if has test; then
  timeout 400 "$B/tests/gpu_test" --gtest_filter="$TEST_FILTER" >"$OUT/gpu_serve_test.log" 2>&1 ||
    status=1
  grep -E "^\[serve_gpu\]|PASSED|FAILED|tests ran|Failure|Expected|Which is" \
    "$OUT/gpu_serve_test.log" | head -120
fi
if has wsa; then
  if [ "$WSA_TESTS" != 0 ]; then
    timeout 120 "$B/tests/gpu_test" --gtest_filter='ServeWsaCuda*' >"$OUT/gpu_wsa_test.log" 2>&1 ||
      status=1
    grep -E "^\[serve_gpu\]|PASSED|FAILED|SKIPPED|tests ran|Failure|Expected|Which is" \
      "$OUT/gpu_wsa_test.log" | head -40
    stamp "wsa tests done"
  fi
  # WSA_DEADLINE (epoch s): end the bench by then, whatever the build and tests took; the bench
  # itself stops its policies 10 s earlier, so the last one is written (incomplete) first.
  wsa_deadline=()
  if [ -n "${WSA_DEADLINE:-}" ]; then
    left=$((WSA_DEADLINE - $(date +%s)))
    [ "$left" -lt "$WSA_TIMEOUT" ] && WSA_TIMEOUT=$left
    wsa_deadline=(--deadline-unix $((WSA_DEADLINE - 10)))
  fi
  free -m >"$OUT/wsa_mem.txt"
  # shellcheck disable=SC2086
  timeout "$WSA_TIMEOUT" "$B/bench/serve_split_engine_bench" --device cuda --layers "$WSA_LAYERS" \
    --budget-gib 24 --json "$OUT/wsa_bench.json" ${wsa_deadline[@]+"${wsa_deadline[@]}"} $WSA_ARGS \
    >"$OUT/wsa_bench.txt" 2>&1 || status=1
  # (the bench's "  [policy N s] step ..." progress lines stay in the file)
  grep -v -e "^\[" -e "^  \[" "$OUT/wsa_bench.txt" | tail -40
  stamp "wsa bench done"
fi
stamp "done, status $status"
exit $status
