#!/bin/bash
# `ferry bench serve` on the tiny geometry (E = 16, 2 layers; 8 slots per layer = the bytes of
# static's one-layer staging, so both run under the same device budget): every mode runs, all give the same greedy ids and
# logits bits (engine property), the JSON has every field, paged at a cap below E moves fewer H2D
# bytes per token than static, pacing makes copies no faster than the link, bad flags fail
# clearly. No timing thresholds.
# ctest-cost: 24 (seconds in the CI build: ctest starts the longest tests first)
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$FERRY" bench serve --geometry tiny --expert-slots 8 --prompt-tokens 24 --decode-tokens 12 \
  --json "$tmp/r.json" >"$tmp/table.txt" 2>"$tmp/err.txt" \
  || fail "bench serve: $(cat "$tmp/err.txt")"
grep -q "paged/static" "$tmp/table.txt" || fail "no ratios in the table: $(cat "$tmp/table.txt")"
grep -q "^device budget .* + 8 expert slots per layer x 2 MoE layers" "$tmp/table.txt" ||
  fail "no sizing line in the table: $(cat "$tmp/table.txt")"
python3 - "$tmp/r.json" <<'PY' || fail "report: $(cat "$tmp/r.json")"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ["prompt_tokens", "decode_tokens", "policy", "link", "sizing", "modes", "ratios",
          "definitions", "model", "geometry", "trace", "seed", "machine"]:
    assert k in j, k
assert j["prompt_tokens"] == 24 and j["decode_tokens"] == 12
h = j["host"]  # the host memory estimate and the measured peak
assert h["estimate_bytes"] > 0 and h["peak_rss_bytes"] > 0 and h["experts_packed_at_build"] is False, h
assert j["sizing"]["slots_per_layer"] == 8
modes = {m["mode"]: m for m in j["modes"]}
assert list(modes) == ["resident", "static", "cpu-experts", "paged"], list(modes)
ref = modes["resident"]["tokens"]
assert len(ref) == 13, ref
for name, m in modes.items():
    assert m["ran"], name
    for k in ["reference", "under_budget", "prefill", "decode", "tokens", "same_tokens_as_reference",
              "same_logits_bits_as_reference", "device_budget_bytes", "device_peak_bytes",
              "expert_device_bytes", "slots_per_layer"]:
        assert k in m, (name, k)
    assert m["tokens"] == ref, (name, m["tokens"], ref)
    assert m["same_tokens_as_reference"] and m["same_logits_bits_as_reference"], name
    for ph in ["prefill", "decode"]:
        p = m[ph]
        for k in ["tokens", "seconds", "tokens_per_s", "h2d_bytes", "h2d_bytes_per_token",
                  "copy_syncs", "copy_syncs_per_token", "paced_wait_s", "hit_rate", "link_busy_s",
                  "roofline_pct", "roofline_tokens_per_s"]:
            assert k in p, (name, ph, k)
        assert p["tokens"] == (24 if ph == "prefill" else 12), (name, ph, p["tokens"])
        assert p["tokens_per_s"] > 0, (name, ph)
    if name != "resident":
        assert m["device_budget_bytes"] > 0 and m["device_peak_bytes"] <= m["device_budget_bytes"], name
assert modes["resident"]["reference"] and modes["resident"]["device_budget_bytes"] == 0
for name in ["resident", "cpu-experts"]:
    assert modes[name]["decode"]["h2d_bytes"] == 0, name
    assert modes[name]["decode"]["roofline_pct"] is None, name
st, pg = modes["static"], modes["paged"]
E, K, L = 16, 4, 2
eb = j["sizing"]["expert_bytes"]
# static streams every layer's E experts every forward; paged copies misses only
assert st["decode"]["h2d_bytes_per_token"] == E * eb * L, st["decode"]
assert st["decode"]["copy_syncs_per_token"] == L
assert pg["decode"]["h2d_bytes_per_token"] < st["decode"]["h2d_bytes_per_token"], (pg, st)
# a one-step prefill: static copies each layer once for all 24 tokens (paged may copy more there:
# its token groups re-fetch evicted experts, which is why only decode is compared)
assert st["prefill"]["h2d_bytes"] == E * eb * L, st["prefill"]
h = pg["decode"]["hit_rate"]
assert 0 < h < 1, h
assert pg["slots_per_layer"] == 8 and pg["expert_device_bytes"] == 8 * L * eb
for k in ["paged_over_static_decode", "paged_over_static_prefill",
          "paged_over_cpu_experts_decode", "paged_over_cpu_experts_prefill"]:
    assert isinstance(j["ratios"][k], float) and j["ratios"][k] > 0, k
PY

# Pacing: at 0.5 GB/s every static decode step's copies take at least bytes / rate.
"$FERRY" bench serve --geometry tiny --modes static,paged --expert-slots 8 --prompt-tokens 8 \
  --decode-tokens 6 --link-gbps 0.5 --json "$tmp/p.json" >/dev/null 2>"$tmp/err.txt" \
  || fail "paced bench: $(cat "$tmp/err.txt")"
python3 - "$tmp/p.json" <<'PY' || fail "paced report: $(cat "$tmp/p.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["link"]["paced"] and j["link"]["roofline_gbps"] == 0.5
st = j["modes"][0]
assert st["mode"] == "static" and st["reference"]
d = st["decode"]
assert d["seconds"] >= d["h2d_bytes"] / 0.5e9, d
assert d["link_busy_s"] == d["h2d_bytes"] / 0.5e9 and d["roofline_pct"] <= 100.0 + 1e-9, d
assert d["paced_wait_s"] > 0, d
assert j["modes"][1]["same_tokens_as_reference"]
PY

# Miss placement: bypass admission moves fewer bytes than copying every miss, the cost model with
# a fast CPU moves none; both keep the reference's ids and logits bits.
for flags in "" "--bypass-window 1" "--miss-cost-model --cpu-gflops 1e6"; do
  # shellcheck disable=SC2086
  "$FERRY" bench serve --geometry tiny --modes resident,paged --expert-slots 8 --prompt-tokens 16 \
    --decode-tokens 12 --json "$tmp/m.json" $flags >/dev/null 2>"$tmp/err.txt" \
    || fail "placement bench '$flags': $(cat "$tmp/err.txt")"
  python3 - "$tmp/m.json" "$flags" >>"$tmp/m.txt" <<'PY' || fail "placement report '$flags'"
import json, sys
j = json.load(open(sys.argv[1]))
pg = j["modes"][1]
assert pg["mode"] == "paged" and pg["same_tokens_as_reference"] and pg["same_logits_bits_as_reference"]
print(sys.argv[2] or "copy", pg["prefill"]["h2d_bytes"] + pg["decode"]["h2d_bytes"],
      pg["prefill"]["host_computed_misses"] + pg["decode"]["host_computed_misses"])
PY
done
python3 - "$tmp/m.txt" <<'PY' || fail "placement: $(cat "$tmp/m.txt")"
import sys
rows = [l.rsplit(" ", 2) for l in open(sys.argv[1]).read().splitlines()]
(copy_b, copy_h), (byp_b, byp_h), (cm_b, cm_h) = [(int(b), int(h)) for _, b, h in rows]
assert copy_h == 0 and byp_h > 0 and cm_h > 0, rows
assert byp_b < copy_b and cm_b == 0, rows
PY

# --cpu-gflops auto: the paged engine measures its host kernel's rate at start; the JSON and the
# table carry it, and the cost model used exactly that rate.
"$FERRY" bench serve --geometry tiny --modes resident,paged --expert-slots 8 --prompt-tokens 16 \
  --decode-tokens 6 --miss-cost-model --cpu-gflops auto --json "$tmp/a.json" >"$tmp/a.txt" \
  2>"$tmp/err.txt" || fail "--cpu-gflops auto: $(cat "$tmp/err.txt")"
python3 - "$tmp/a.json" <<'PY' || fail "--cpu-gflops auto report: $(cat "$tmp/a.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["miss_placement"]["cpu_gflops"] == "auto", j["miss_placement"]
pg = j["modes"][1]
mp = pg["miss_placement"]
r = mp["cpu_rate_measured"]
assert mp["on"] and r["gflops"] > 0 and r["expert_gbps"] > 0 and r["experts"] >= 1, mp
assert mp["cpu_gflops_used"] == r["gflops"], mp
d = pg["decode"]
assert abs(d["host_computed_misses_per_token"] * d["tokens"] - d["host_computed_misses"]) < 1e-9, d
PY
grep -q "measured (--cpu-gflops auto" "$tmp/a.txt" || fail "--cpu-gflops auto: not in the table"
grep -q "host/tok" "$tmp/a.txt" || fail "no host/tok column: $(cat "$tmp/a.txt")"

# Bad flags: usage errors exit 2, runtime conditions exit 1, each with a message.
expect() {  # expect CODE PATTERN ARGS...
  local code=$1 pat=$2; shift 2
  "$FERRY" bench serve "$@" >"$tmp/o.txt" 2>"$tmp/e.txt"
  local rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, want $code: $(cat "$tmp/e.txt")"
  grep -qi -- "$pat" "$tmp/e.txt" || fail "'$*': no '$pat' in: $(cat "$tmp/e.txt")"
}
expect 2 "modes" --geometry tiny --modes resident,bogus
expect 2 "excludes" --geometry tiny --budget-gib 1 --expert-slots 4
expect 2 "link-gbps" --geometry tiny --link-gbps -3
expect 2 "cpu-gflops" --geometry tiny --cpu-gflops fast
expect 2 "cpu-gflops" --geometry tiny --cpu-gflops 0
expect 2 "trace" --geometry tiny --trace "$tmp/no-such-file"
expect 1 "unknown geometry 'nope'" --geometry nope
expect 1 "fewer than top-k" --geometry tiny --expert-slots 2
expect 1 "does not hold" --geometry tiny --budget-gib 0.00001
expect 1 "exceeds the model's 512 positions" --geometry tiny --prompt-tokens 600
expect 2 "device" --geometry tiny --device tpu
expect 2 "expert-dtype" --geometry tiny --expert-dtype f16
expect 1 "bf16 experts need --device cuda" --geometry tiny --expert-dtype bf16
expect 1 "no-cuda-graphs needs --device cuda" --geometry tiny --no-cuda-graphs
expect 2 "dense-dtype" --geometry tiny --dense-dtype f16
expect 2 "kv-dtype" --geometry tiny --kv-dtype fp8
# The 48-layer geometry: refused before any weights are built (bf16 on the CPU engine; f32
# experts where the host lacks ~114 GiB, with the bf16 alternative named).
expect 1 "bf16 experts need --device cuda" --geometry qwen3-30b-a3b --expert-dtype bf16
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "${avail_kib:-0}" -gt 0 ] && [ "$avail_kib" -lt $((100 * 1024 * 1024)) ]; then
  expect 1 "use --device cuda --expert-dtype bf16" --geometry qwen3-30b-a3b
fi

# --dense-dtype bf16 (the CPU engine too): every mode gives the bf16 reference's bits, the JSON
# says so, and at the same --budget-gib the dense weights charged halve (tiny: 240,640 B of f32
# dense weights, 121,088 B in bf16) and the bytes saved become expert slots (2 layers x 24 KiB
# f32 experts: 4 slots per layer in f32, 6 in bf16, beside 8 KiB of KV).
for dt in f32 bf16; do
  "$FERRY" bench serve --geometry tiny --prompt-tokens 8 --decode-tokens 4 --dense-dtype $dt \
    --budget-gib 0.00044 --modes resident,cpu-experts,paged --json "$tmp/d_$dt.json" \
    >/dev/null 2>"$tmp/err.txt" ||
    fail "bench serve --dense-dtype $dt: $(cat "$tmp/err.txt")"
done
python3 - "$tmp/d_f32.json" "$tmp/d_bf16.json" <<'PY' || fail "dense dtype: $(cat "$tmp/d_bf16.json")"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["dense_dtype"] == "f32" and b["dense_dtype"] == "bf16", (a["dense_dtype"], b["dense_dtype"])
assert b["sizing"]["dense_bytes_charged"] < a["sizing"]["dense_bytes_charged"], b["sizing"]
assert a["sizing"]["dense_bytes_charged"] == 240640, a["sizing"]
assert b["sizing"]["dense_bytes_charged"] == 121088, b["sizing"]
assert (a["sizing"]["slots_per_layer"], b["sizing"]["slots_per_layer"]) == (4, 6), (a["sizing"], b["sizing"])
for m in b["modes"]:
    assert m["ran"] and m["same_tokens_as_reference"] and m["same_logits_bits_as_reference"], m["mode"]
PY

# --kv-dtype bf16: the request's KV pool is half the f32 one's bytes (the same blocks) and the
# bytes saved go to expert slots: at 492,428 B (240,640 B of f32 dense weights, 8 KiB of f32 KV
# or 4 KiB of bf16, 48 KiB per slot across the 2 layers) 4.96 slots per layer in f32, 5.04 in
# bf16; every mode gives the bf16 reference's bits.
for dt in f32 bf16; do
  "$FERRY" bench serve --geometry tiny --prompt-tokens 8 --decode-tokens 4 --kv-dtype $dt \
    --budget-gib 0.0004586 --modes resident,cpu-experts,paged --json "$tmp/k_$dt.json" \
    >/dev/null 2>"$tmp/err.txt" ||
    fail "bench serve --kv-dtype $dt: $(cat "$tmp/err.txt")"
done
python3 - "$tmp/k_f32.json" "$tmp/k_bf16.json" <<'PY' || fail "kv dtype: $(cat "$tmp/k_bf16.json")"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["kv_dtype"] == "f32" and b["kv_dtype"] == "bf16", (a["kv_dtype"], b["kv_dtype"])
assert 2 * b["sizing"]["kv_bytes"] == a["sizing"]["kv_bytes"], (a["sizing"], b["sizing"])
assert a["sizing"]["kv_bytes"] == 8192, a["sizing"]
assert (a["sizing"]["slots_per_layer"], b["sizing"]["slots_per_layer"]) == (4, 5), (a["sizing"], b["sizing"])
for m in b["modes"]:
    assert m["ran"] and m["same_tokens_as_reference"] and m["same_logits_bits_as_reference"], m["mode"]
PY

# --serial-miss-copies: the JSON says so and the paged mode still gives the reference's bits
# (on the CPU engine the copies are synchronous either way).
"$FERRY" bench serve --geometry tiny --expert-slots 8 --prompt-tokens 8 --decode-tokens 4 \
  --modes resident,paged --serial-miss-copies --json "$tmp/s.json" >/dev/null 2>&1 ||
  fail "--serial-miss-copies run failed"
python3 - "$tmp/s.json" <<'PY' || fail "serial report: $(cat "$tmp/s.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["miss_placement"]["overlap_misses"] is False, j["miss_placement"]
assert j["expert_dtype"] == "f32", j.get("expert_dtype")
for m in j["modes"]:
    assert m["same_tokens_as_reference"] and m["same_logits_bits_as_reference"], m["mode"]
PY

# --device cuda: without CUDA or a GPU it fails (exit 1) naming the device, before building
# anything; on a GPU machine it runs the CUDA engine and says so in the JSON.
"$FERRY" bench serve --geometry tiny --expert-slots 8 --prompt-tokens 8 --decode-tokens 4 \
  --device cuda --json "$tmp/c.json" >"$tmp/o.txt" 2>"$tmp/e.txt"
rc=$?
if [ "$rc" = 0 ]; then
  python3 - "$tmp/c.json" <<'PY' || fail "cuda report: $(cat "$tmp/c.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["device"] == "cuda" and j["link"]["pinned_h2d_gbps"] > 0, j["link"]
for m in j["modes"]:
    assert m["ran"] and m["decode"]["host_syncs_per_token"] >= 1, m
    g = m["cuda_graphs"]
    assert g["disabled_reason"] == "", g
    if m["mode"] in ("resident", "static"):
        assert g["replays"] > 0 and m["decode"]["host_syncs_per_token"] == 1, m
PY
  # Paced copy stream (--link-gbps) and graphs off: same bits, paced rate <= the asked rate.
  "$FERRY" bench serve --geometry tiny --expert-slots 8 --prompt-tokens 8 --decode-tokens 4 \
    --device cuda --link-gbps 4 --no-cuda-graphs --json "$tmp/cp.json" >/dev/null 2>"$tmp/e.txt" ||
    fail "--device cuda --link-gbps 4 failed: $(cat "$tmp/e.txt")"
  python3 - "$tmp/cp.json" <<'PY' || fail "paced cuda report: $(cat "$tmp/cp.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["link"]["paced"] and 0 < j["link"]["paced_h2d_gbps"] <= 4.0, j["link"]
assert j["link"]["roofline_gbps"] == 4.0 and j["cuda_graphs"] is False, j["link"]
for m in j["modes"]:
    assert m["same_logits_bits_as_reference"], m["mode"]
    assert m["cuda_graphs"]["eligible_steps"] == 0, m
    if m["mode"] in ("static", "paged"):
        assert m["paced_copies"]["copies"] > 0, m
PY
else
  [ "$rc" = 1 ] || fail "--device cuda exited $rc, want 1 without a GPU: $(cat "$tmp/e.txt")"
  grep -q "bench serve --device cuda: " "$tmp/e.txt" || fail "--device cuda: unclear: $(cat "$tmp/e.txt")"
  grep -qiE "cuda|gpu" "$tmp/e.txt" || fail "--device cuda: no cause: $(cat "$tmp/e.txt")"
fi
echo "serve_bench: ok"
