#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each briefly (FERRY_FUZZ_SECONDS, default 20).
# Skipped (and says so) when clang is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang++ >/dev/null 2>&1; then
  echo "== fuzzers: SKIPPED (clang++ not found)"
  exit 0
fi
SECS="${FERRY_FUZZ_SECONDS:-20}"
echo "== fuzzers (${SECS}s each)"
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DFERRY_CUDA=OFF -DFERRY_BUILD_FUZZERS=ON -DFERRY_BUILD_BENCH=OFF \
  -DFERRY_BUILD_TESTS=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
targets=$(ls tests/fuzz/*_fuzz.cpp 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.cpp$//' || true)
[ -z "$targets" ] && { echo "no fuzz targets"; exit 0; }
cmake --build build/fuzz -j "$(nproc)" --target $targets
for t in $targets; do
  corpus="tests/fuzz/corpus/${t%_fuzz}"
  mkdir -p "build/fuzz/corpus_$t"
  echo "-- $t"
  "build/fuzz/tests/fuzz/$t" -max_total_time="$SECS" -print_final_stats=1 "build/fuzz/corpus_$t" \
    $( [ -d "$corpus" ] && echo "$corpus" ) 2>&1 | tail -n 4
done
