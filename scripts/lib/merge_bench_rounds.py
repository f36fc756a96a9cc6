#!/usr/bin/env python3
# Merges R `ferry bench train --json` reports of the same command run R times, the policy order
# rotated between runs (scripts/gpu_plan_caps.sh ROUNDS=R), into one report: per policy the mean
# step over the rounds, tokens/s and TFLOPS recomputed from it, and each round's step kept in
# "rounds_step_ms" (the spread is what one call's comparison cannot see). Why: policies run one
# after another, so a drift of the host (page cache, memory bandwidth, clocks) during a call lands
# on whichever policy runs then; rotated rounds spread it over all of them.
#   merge_bench_rounds.py OUT.json ROUND1.json ROUND2.json ...
import json
import statistics
import sys


def merge(reports):
    if not reports:
        raise ValueError("no reports to merge")
    base = json.loads(json.dumps(reports[0]))  # deep copy: the first round's fields
    by_round = [{p["policy"]: p for p in r.get("policies", [])} for r in reports]
    merged = []
    for p0 in reports[0].get("policies", []):
        name = p0["policy"]
        runs = [r.get(name) for r in by_round]
        bad = [r for r in runs if r is None or "error" in r]
        if bad:  # any round that failed or lacked the policy: report the first problem
            merged.append(bad[0] if bad[0] is not None else
                          {"policy": name, "error": "missing from a round"})
            continue
        batches = {r["batch_size"] for r in runs}
        if len(batches) != 1:
            merged.append({"policy": name,
                           "error": f"rounds ran different batches {sorted(batches)}"})
            continue
        steps = [r["step_ms_mean"] for r in runs]
        mean = sum(steps) / len(steps)
        p = json.loads(json.dumps(runs[0]))
        # Work per step is the same in every round (same policy, batch and model): rates scale
        # with the inverse of the step.
        scale = runs[0]["step_ms_mean"] / mean
        for key in ("tokens_per_s", "model_tflops", "hardware_tflops", "mfu"):
            if key in p and isinstance(p[key], (int, float)):
                p[key] = p[key] * scale
        p["step_ms_mean"] = mean
        p["step_ms_median"] = statistics.median(r["step_ms_median"] for r in runs)
        for key in ("exposed_ms_per_step", "optimizer_ms_per_step"):
            if all(isinstance(r.get(key), (int, float)) for r in runs):
                p[key] = sum(r[key] for r in runs) / len(runs)
        p["rounds_step_ms"] = steps
        merged.append(p)
    base["policies"] = merged
    base["rounds"] = len(reports)
    return base


def main(argv):
    if len(argv) < 3:
        print("usage: merge_bench_rounds.py OUT.json ROUND1.json [ROUND2.json ...]", file=sys.stderr)
        return 2
    reports = [json.load(open(p)) for p in argv[2:]]
    out = merge(reports)
    with open(argv[1], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
