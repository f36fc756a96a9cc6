#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Pairs ferry's Google Benchmark JSON with torch_baselines.py's JSON (same names, same call) and
prints/writes ratios: speed ratio = torch_ms / ferry_ms (> 1: ferry faster). Memory-bound ops also
get ferry's GB/s as a fraction of the measured device copy bandwidth (BM_Copy).

  python3 tools/bench/compare.py ferry.json torch.json --out summary.json
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ferry")
    ap.add_argument("torch")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fj = json.load(open(a.ferry))
    tj = json.load(open(a.torch))
    ours = {b["name"]: b for b in fj["benchmarks"] if b.get("run_type", "iteration") == "iteration"}
    copies = {int(n.split("/")[1]): b["GB/s"] for n, b in ours.items() if n.startswith("BM_Copy/")}
    copy_gbs = copies.get(max(copies)) if copies else None  # the largest copy: the ceiling
    rows = []
    for name, b in ours.items():
        row = {"name": name, "ferry_ms": b.get("ms")}
        if "TFLOP/s" in b:
            row["ferry_tflops"] = b["TFLOP/s"]
        if "GB/s" in b:
            row["ferry_gbs"] = b["GB/s"]
            if copy_gbs and not name.startswith("BM_Copy"):
                row["fraction_of_copy_bw"] = b["GB/s"] / copy_gbs
                # Also against the copy whose traffic (read + write) is closest to this op's.
                traffic = b["GB/s"] * 1e9 * b["ms"] / 1e3
                near = min(copies, key=lambda c: abs(2 * c - traffic))
                row["same_size_copy_bytes"] = near
                row["fraction_of_same_size_copy"] = b["GB/s"] / copies[near]
        t = tj.get(name)
        if t and b.get("ms"):
            row["torch_ms"] = t["ms"]
            row["speed_vs_torch"] = t["ms"] / b["ms"]
        if "error_message" in b:
            row["error"] = b["error_message"]
        rows.append(row)
    out = {"device": tj.get("_meta", {}), "copy_gbs": copy_gbs, "rows": rows}
    json.dump(out, open(a.out, "w"), indent=1)
    print(f"device copy bandwidth (BM_Copy, read+write): {copy_gbs} GB/s; torch {tj.get('_meta')}")
    for r in rows:
        extra = ""
        if "ferry_tflops" in r:
            extra += f" {r['ferry_tflops']:.1f} TFLOP/s"
        if "fraction_of_copy_bw" in r:
            extra += f" {r['ferry_gbs']:.0f} GB/s = {100 * r['fraction_of_copy_bw']:.0f}% of copy"
            extra += f" ({100 * r['fraction_of_same_size_copy']:.0f}% of a {r['same_size_copy_bytes'] >> 20} MiB copy)"
        sp = f" torch {r['torch_ms']:.3f} ms, ratio torch/ferry {r['speed_vs_torch']:.2f}" if "speed_vs_torch" in r else ""
        print(f"{r['name']}: ferry {r['ferry_ms']:.3f} ms{extra}{sp}")


if __name__ == "__main__":
    main()
