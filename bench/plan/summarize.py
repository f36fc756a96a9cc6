#!/usr/bin/env python3
"""Prints a markdown table from bench/plan/plan_compare.sh's JSON files: per GPU cap and policy,
the largest feasible batch, predicted step and TFLOPS there, and the solved plan at that batch.
All figures are predictions of ferry's plan cost model, not measurements."""
import json
import sys


def fmt(s):
    return "-" if s is None else f"{s['tflops']:.1f}"


def main(paths):
    print("| model | link | GPU cap | policy | largest batch | TFLOPS there | solved plan at that batch (TFLOPS) | solver |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        j = json.load(open(path))
        link = "12 GB/s" if "link12" in path else "H200 (55 GB/s)"
        for cap in j["caps"]:
            for r in cap["policies"]:
                there = r["at_largest_batch"]
                same = r.get("solved_at_same_batch")
                solver = "" if there is None else f"{there['solver_status']} gap {100 * there['gap']:.3f}%"
                print(f"| {j['geometry'].split('-')[0]} L{j['geometry'].split('-L')[1].split('-')[0]} "
                      f"| {link} | {cap['gpu_cap_gb']:.0f} GB | {r['policy']} | {r['largest_batch']} "
                      f"| {fmt(there)} | {'(itself)' if r['policy'] == 'solved' else fmt(same)} | {solver} |")


if __name__ == "__main__":
    main(sys.argv[1:])
