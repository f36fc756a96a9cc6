#!/usr/bin/env python3
"""Groups per-kernel GPU time (Nsight Compute `--metrics gpu__time_duration.sum --csv`, or Nsight
Systems `nsys stats -r cuda_gpu_kern_sum -f csv`) of two runs
(ferry and the PyTorch baseline, scripts/gpu_train_profile.sh) into kernel families and prints
each side's top kernels and the family totals side by side.

    kernel_groups.py FERRY_CSV TORCH_CSV [--top N]

The families are matched on kernel names by the regular expressions below (first match wins);
names are whatever the libraries call their kernels (cuBLAS's nvjet/sm90_xmma, torch's
flash/elementwise kernels, ferry's own), so a kernel that matches none lands in "other" and is
listed in the top table for a human to place.
"""
import argparse
import csv
import re
import sys

FAMILIES = [
    # attention first: cuDNN's SDPA kernels are named cudnn_..._sdpa_sm90_flash_...
    ("attention", r"flash|fmha|attn|attention|sdpa|softmax_warp"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitk|sm90_"),
    ("cross_entropy", r"cross|entropy|nll|log_?softmax|lm_head|logsumexp|ce_rows"),
    ("norm", r"rms|norm"),
    ("rope", r"rope|rotary"),
    ("activation", r"silu|swiglu|gelu|act_"),
    ("optimizer", r"adam|optim|clip|sq_norm|sqnorm|grad_norm|multi_tensor"),
    ("embedding", r"embed|index_select|gather|scatter|index_put"),
    ("reduce", r"reduce|sum_kernel|bias_grad|col_sum"),
    ("copy_convert", r"copy|convert|cast|bf16|f32_to|to_f32|fill|memset|vectorized_elementwise|unrolled_elementwise|elementwise"),
]


def load(path):
    """[(kernel name, total ms, launches)] from an nsys cuda_gpu_kern_sum CSV or an ncu CSV of
    gpu__time_duration.sum (one row per launch, aggregated here by name)."""
    try:
        with open(path, newline="") as f:
            # ncu's log may carry "==PROF==" lines; nsys's data rows start with a number.
            lines = [l for l in f if l[:1] == '"' or l[:1].isdigit()]
    except OSError as e:
        print(f"{path}: {e}", file=sys.stderr)
        return []
    reader = csv.DictReader(lines)
    agg = {}
    for r in reader:
        if "Metric Name" in r:  # ncu: one row per launch and metric
            if r["Metric Name"] != "gpu__time_duration.sum":
                continue
            name = r.get("Kernel Name") or ""
            ms, calls = float(r["Metric Value"].replace(",", "")) / 1e6, 1
        else:  # nsys: one row per kernel name
            name = r.get("Name") or ""
            ms, calls = float(r.get("Total Time (ns)") or 0) / 1e6, int(float(r.get("Instances") or 0))
        tot = agg.setdefault(name, [0.0, 0])
        tot[0] += ms
        tot[1] += calls
    return [(name, ms, calls) for name, (ms, calls) in agg.items()]


def family(name):
    low = name.lower()
    for fam, rx in FAMILIES:
        if re.search(rx, low):
            return fam
    return "other"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ferry")
    p.add_argument("torch")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    sides = {"ferry": load(a.ferry), "torch": load(a.torch)}
    totals = {}
    for side, rows in sides.items():
        fam = {}
        for name, ms, _ in rows:
            fam[family(name)] = fam.get(family(name), 0.0) + ms
        totals[side] = fam
        all_ms = sum(ms for _, ms, _ in rows)
        print(f"== {side}: {len(rows)} kernels, {all_ms:.1f} ms of kernel time in the profile")
        for name, ms, calls in sorted(rows, key=lambda r: -r[1])[: a.top]:
            print(f"  {ms:10.2f} ms {calls:7d}x  [{family(name)}] {name[:110]}")
    print("== families (ms of kernel time over each run; give both runs the same steps)")
    names = [f for f, _ in FAMILIES] + ["other"]  # first match wins (FAMILIES' order)
    print(f"  {'family':14s} {'ferry':>10s} {'torch':>10s} {'ferry-torch':>12s}")
    for f in names:
        fe, to = totals["ferry"].get(f, 0.0), totals["torch"].get(f, 0.0)
        if fe or to:
            print(f"  {f:14s} {fe:10.1f} {to:10.1f} {fe - to:12.1f}")
    fe, to = sum(totals["ferry"].values()), sum(totals["torch"].values())
    print(f"  {'all':14s} {fe:10.1f} {to:10.1f} {fe - to:12.1f}")


if __name__ == "__main__":
    main()
