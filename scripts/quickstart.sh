#!/usr/bin/env bash
# The README's first command: install packages, build (release), and run the main job on the
# embedded default — no downloads, CPU only.
#   scripts/quickstart.sh            # everything
#   FERRY_JOBS=4 scripts/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${FERRY_JOBS:-$(nproc)}"
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS" --target ferry
FERRY=build/release/apps/ferry/ferry
"$FERRY" version
echo "== main job: ferry train on the built-in model and arithmetic task (CPU)"
"$FERRY" train --output-dir out/quickstart-train --metrics-out out/quickstart-train/metrics.jsonl
