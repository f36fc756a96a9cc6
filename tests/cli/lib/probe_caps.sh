# Sourced by CLI tests (tests/cli/lib is not itself a test): probe_caps PLAN_JSON G H prints
# "gpu_gb host_gb": the GPU and host budgets (GB) that leave room for G and H of the largest
# boundary beside the fixed parts of the plan's problem (a roomy probe plan's JSON), plus 1e-7 GB
# so that rounding never decides whether the last boundary fits.
probe_caps() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["problem"]
A = max(p["boundary_gb"])
g, h = int(sys.argv[2]), int(sys.argv[3])
print(f'{p["gpu_fixed_gb"] + g * A + 1e-7:.9f} {p["host_fixed_gb"] + h * A + 1e-7:.9f}')
PY
}
