#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots per-step loss curves from a CSV whose first column is the step and whose other columns
are runs (bench/optim/results/loss_curves_*.csv, written from `ferry train --metrics-out` files),
as a PNG. Needs matplotlib (present on the GPU machine; `scripts/setup.sh --tools` here).

  python3 tools/plots/plot_loss_curves.py bench/optim/results/loss_curves_demo_2x64.csv \
      --out docs/optimizer_loss_curves.png
"""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="ferry train, built-in task: fp32 vs 8-bit AdamW states")
    a = ap.parse_args()
    with open(a.csv) as f:
        rows = list(csv.reader(f))
    header, data = rows[0], rows[1:]
    steps = [int(r[0]) for r in data]
    fig, (full, diff) = plt.subplots(2, 1, figsize=(8, 7), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    base = [float(r[1]) for r in data]
    for col in range(1, len(header)):
        ys = [float(r[col]) for r in data]
        full.plot(steps, ys, label=header[col], linewidth=1.0)
        if col > 1:
            diff.plot(steps, [y - b for y, b in zip(ys, base)], label=f"{header[col]} - {header[1]}",
                      linewidth=0.8)
    full.set_ylabel("training loss (nats/token)")
    full.set_title(a.title)
    full.legend()
    full.grid(alpha=0.3)
    diff.axhline(0.0, color="black", linewidth=0.5)
    diff.set_xlabel("step")
    diff.set_ylabel(f"loss minus {header[1]}")
    diff.legend(fontsize=8)
    diff.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
