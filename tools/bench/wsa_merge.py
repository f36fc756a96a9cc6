#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Merges serve_split_engine_bench JSON files of one measurement run in several processes (the
48-layer MV-WSA run in two device calls, docs/serve_wsa.md) into one table.

Checks that the files describe the same split problem (geometry, workload, pool budget, KV floor,
link) and, where the files carry tokens_hash, that every complete policy generated the same
tokens. Recomputes across all files: best named fixed split (fixed 50/50, expert-heavy, kv-heavy),
best fixed split (every complete non-live policy: named, caps, configurator = the oracle of the
sweep), and per policy x_named = best named / total and x_best = best fixed / total (> 1: faster).
A policy name seen twice keeps both rows, the later one marked with its file.

  python3 tools/bench/wsa_merge.py call1/wsa_bench.json call2/wsa_bench.json \
      [--out merged.json] [--md merged.md]
"""
import argparse
import json
import sys

NAMED = ("fixed 50/50", "expert-heavy", "kv-heavy")


def problem_key(d):
    geo = {k: v for k, v in d.get("geometry", {}).items()
           if k not in ("model_build_s", "host_peak_rss_bytes_after_build", "dense_dtype",
                        "host_bytes_estimate")}
    budget = d.get("budget", {})
    return {
        "geometry": geo,
        "workload": d.get("workload", {}),
        "pool_budget_bytes": budget.get("pool_budget_bytes"),
        "kv_floor_blocks": budget.get("kv_floor_blocks"),
        "link_gbps": d.get("run", {}).get("link_gbps"),  # absent in files before 2026-12-01 s13
        # forced-ahead (device-resolved decode steps) or the per-layer hook: step costs differ
        "routing": d.get("run", {}).get("routing", "per-layer"),  # absent before session 13
    }


def split_text(p):
    return p.get("final_split", {}).get("text", "")


def row(p):
    tok = p.get("prefill_tokens", 0), p.get("prefix_hit_tokens", 0)
    if p["complete"]:
        state = "ok"
    elif p.get("pruned_slower"):  # --prune-slower: provably slower than a complete split
        state = "pruned: > %.1f s (step %d)" % (p.get("prune_at_s", 0), p.get("steps", 0))
    else:
        state = "stopped at step %d (%d turns): %s" % (
            p.get("steps", 0), p.get("turns_finished", 0), p.get("error", "")[:60])
    moves = ""
    if p.get("live"):
        moves = " (%d moves in %d decisions)" % (p.get("live_moves", 0), p.get("live_decisions", 0))
    dec = p.get("decode_tokens_per_s")  # absent in files before 2026-12-01 s13
    return "| %s | %s | %s | %.2f | %.2f | %.1f | %s | %.3f | %s | %s / %s | %s | %s | %s%s |" % (
        p["policy"], p["_file"], state, p["total_s"], p.get("mean_ttft_s", 0),
        p.get("generated_tokens_per_s", 0), "%.1f" % dec if dec else "-",
        p.get("expert_hit_rate", 0), format(p.get("expert_misses", 0), ","),
        format(tok[0], ","), format(tok[1], ","),
        "%.3f" % p["x_named"] if p["x_named"] else "-",
        "%.3f" % p["x_best"] if p["x_best"] else "-", split_text(p), moves)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", help="merged JSON")
    ap.add_argument("--md", help="the table as markdown (also printed)")
    ap.add_argument("--force", action="store_true", help="merge files of different problems")
    a = ap.parse_args()

    docs = []
    for i, f in enumerate(a.files):
        with open(f) as fh:
            docs.append((f, json.load(fh)))
    key0 = problem_key(docs[0][1])
    for f, d in docs[1:]:
        k = problem_key(d)
        diff = [x for x in key0 if k[x] != key0[x] and not (
            x == "link_gbps" and (k[x] is None or key0[x] is None))]
        if diff:
            msg = "%s differs from %s in %s" % (f, docs[0][0], ", ".join(diff))
            if not a.force:
                sys.exit("wsa_merge: " + msg + " (--force merges anyway)")
            print("warning: " + msg, file=sys.stderr)

    policies, seen = [], set()
    for i, (f, d) in enumerate(docs):
        for p in d.get("policies", []):
            p = dict(p)
            p["_file"] = "call %d" % (i + 1)
            p["_path"] = f
            if p["policy"] in seen:
                p["policy"] = "%s (%s)" % (p["policy"], p["_file"])
            seen.add(p["policy"])
            policies.append(p)

    def base(p):  # the name without a " (call N)" suffix
        return p["policy"].split(" (call ")[0]

    done = [p for p in policies if p["complete"] and p["total_s"] > 0]
    named = min((p["total_s"] for p in done if base(p) in NAMED), default=0.0)
    best = min((p["total_s"] for p in done if not p.get("live")), default=0.0)
    best_name = next((p["policy"] for p in done if not p.get("live") and p["total_s"] == best), "")
    for p in policies:
        ok = p["complete"] and p["total_s"] > 0
        p["x_named"] = named / p["total_s"] if ok and named else 0.0
        p["x_best"] = best / p["total_s"] if ok and best else 0.0

    hashes = {p["policy"]: p["tokens_hash"] for p in done if p.get("tokens_hash")}
    tokens_equal = len(set(hashes.values())) <= 1
    d0 = docs[0][1]
    geo, wl, bud = d0.get("geometry", {}), d0.get("workload", {}), d0.get("budget", {})
    lines = [
        "%d of %d layers, %s experts %s, pool %.3f GiB, floor %s blocks; %d sessions x %d turns, "
        "prefix %s, user <= %s, answers <= %s, concurrency %s, seed %s" % (
            geo.get("layers", 0), geo.get("of_target_layers", 48), geo.get("expert_dtype", "?"),
            format(geo.get("expert_bytes", 0), ","), bud.get("pool_budget_bytes", 0) / 2**30,
            bud.get("kv_floor_blocks"), wl.get("sessions", 0), wl.get("turns", 0),
            wl.get("prefix_tokens"), wl.get("user_max"), wl.get("output_max"),
            wl.get("concurrency"), wl.get("seed")),
        "files: " + ", ".join("call %d = %s (model built in %.0f s%s)" % (
            i + 1, f, d.get("geometry", {}).get("model_build_s", 0),
            "; skipped: " + ", ".join(d["skipped"]) if d.get("skipped") else "")
            for i, (f, d) in enumerate(docs)),
        "",
        "| policy | call | state | total s | mean TTFT s | gen tok/s | decode tok/s | hit | misses "
        "| prefill / cached tokens | x named | x best fixed | final split |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [row(p) for p in policies]
    lines.append("")
    lines.append("best named fixed split: %.2f s; best fixed split (oracle of the sweep): %.2f s (%s)"
                 % (named, best, best_name))
    for p in done:
        if base(p) == "live":
            lines.append("live: %.3fx the best named fixed split (target >= 1.2), %.3fx the best "
                         "fixed split" % (p["x_named"], p["x_best"]))
        if base(p) == "configurator":
            lines.append("configurator: %.3fx the best fixed split (target: within 5 %%, >= 0.952)"
                         % p["x_best"])
    if hashes:
        lines.append("tokens: %s across %d complete policies with tokens_hash" % (
            "equal" if tokens_equal else "DIFFER (" + ", ".join(
                "%s %s" % (k, v) for k, v in hashes.items()) + ")", len(hashes)))
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text + "\n")
    if a.out:
        merged = {k: v for k, v in d0.items() if k not in ("policies", "best_fixed_s",
                                                          "best_named_fixed_s", "skipped")}
        merged["merged_from"] = [f for f, _ in docs]
        merged["skipped"] = [s for _, d in docs for s in d.get("skipped", [])]
        merged["best_named_fixed_s"] = named
        merged["best_fixed_s"] = best
        merged["tokens_equal"] = tokens_equal
        merged["policies"] = [{k: v for k, v in p.items() if k != "_path"} for p in policies]
        with open(a.out, "w") as fh:
            json.dump(merged, fh, indent=2)
            fh.write("\n")
    return 0 if tokens_equal else 1


if __name__ == "__main__":
    sys.exit(main())
