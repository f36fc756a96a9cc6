#!/usr/bin/env bash
# scripts/lib/check_pdl_wait_first.py over the CUDA sources: every kernel launched with
# programmatic dependent launch (on by default on sm_90+) begins with pdl_wait(). Then the check
# must fail on copies of the sources where one kernel touches memory first: one launched by name
# (expert_ffn_up_kernel) and one launched through a lambda's `kernel` parameter
# (rms_norm_row_kernel). No GPU needed.
set -euo pipefail
ROOT="$2"
CHECK="$ROOT/scripts/lib/check_pdl_wait_first.py"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
out=$(python3 "$CHECK" "$ROOT"/src/kernels/cuda/*.cu "$ROOT"/src/kernels/cuda/*.cuh) ||
  { echo "$out"; echo "kernels_pdl_wait_first: the tree fails the check"; exit 1; }
echo "$out"
n=$(sed -nE 's/.*: ([0-9]+) kernels launched.*/\1/p' <<<"$out")
[ "${n:-0}" -ge 30 ] || { echo "kernels_pdl_wait_first: only ${n:-0} kernels found"; exit 1; }

# Put another statement before the named kernel's pdl_wait().
mutate() {  # file kernel-name
  cp "$ROOT"/src/kernels/cuda/*.cu "$ROOT"/src/kernels/cuda/*.cuh "$TMP/"
  python3 - "$TMP/$1" "$2" <<'PY'
import re, sys
path, name = sys.argv[1], sys.argv[2]
text = open(path).read()
m = re.search(r"__global__[^{;]*\b" + name + r"\s*\([^{;]*\{\s*pdl_wait\(\);", text, flags=re.S)
assert m, f"{name} not found beginning with pdl_wait() in {path}"
head = text[:m.end()].rsplit("pdl_wait();", 1)[0]
text = head + "__syncthreads();\n  pdl_wait();" + text[m.end():]
open(path, "w").write(text)
PY
  if out=$(python3 "$CHECK" "$TMP"/*.cu "$TMP"/*.cuh); then
    echo "$out"; echo "kernels_pdl_wait_first: a moved pdl_wait() in $2 was not caught"; exit 1
  fi
  grep -q "$2 is launched with launch_pdl" <<<"$out" ||
    { echo "$out"; echo "kernels_pdl_wait_first: the failure does not name $2"; exit 1; }
  rm -f "$TMP"/*.cu "$TMP"/*.cuh
}
mutate expert_ffn.cu expert_ffn_up_kernel
mutate rms_norm.cu rms_norm_row_kernel
echo "kernels_pdl_wait_first: ok"
