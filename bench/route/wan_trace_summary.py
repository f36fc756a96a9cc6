#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Summarises the per-request timelines that `route_system_bench --wan-only --trace DIR` writes
(<router>_rho<ρ>_{agent,proxy,server}.csv, times in ms since the run's first frame).

Per run: offloads, fallbacks, how many agent workers (= keep-alive connections) were used and how
the fallbacks spread over them, new proxy connections, uplink Mbit/s through the proxy, uplink
chunk delay in the proxy (read -> written upstream), and for answered and missed requests the
delay from the agent's send to the server handler's start.
Usage: wan_trace_summary.py DIR [--json OUT]   (python3 standard library only)
"""
import csv
import glob
import json
import os
import sys


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    k = max(1, int(-(-p * len(v) // 1)))  # nearest rank
    return round(v[min(len(v), k) - 1], 1)


def summarise(d):
    out = {}
    for ag in sorted(glob.glob(os.path.join(d, "*_agent.csv"))):
        tag = os.path.basename(ag)[: -len("_agent.csv")]
        agent = list(csv.DictReader(open(ag)))
        server = {r["id"]: r for r in csv.DictReader(open(os.path.join(d, tag + "_server.csv")))}
        proxy = list(csv.DictReader(open(os.path.join(d, tag + "_proxy.csv"))))
        rows = [(i, a) for i, a in enumerate(agent) if a["offload"] == "1"]
        ok = [(i, a) for i, a in rows if a["outcome"] == "ok"]
        miss = [(i, a) for i, a in rows if a["outcome"] != "ok"]
        w_ok = {int(a["worker"]) for _, a in ok}
        w_miss = {int(a["worker"]) for _, a in miss if int(a["worker"]) >= 0}

        def recv_delay(sel):
            return [float(server[f"edge-0-{i}"]["recv_ms"]) - float(a["send_ms"])
                    for i, a in sel if f"edge-0-{i}" in server and float(a["send_ms"]) >= 0]

        up = [p for p in proxy if p["kind"] == "u" and int(p["bytes"]) > 0]
        span_s = (max(float(a["arrival_ms"]) for a in agent) + 50) / 1000
        chunk = [float(p["written_ms"]) - float(p["in_ms"]) for p in up]
        reasons = {}
        for _, a in miss:
            reasons[a["outcome"]] = reasons.get(a["outcome"], 0) + 1
        out[tag] = {
            "offloads": len(rows), "ok": len(ok), "fallbacks": len(miss),
            "fallback_reasons": reasons,
            "workers_used": len(w_ok | w_miss), "workers_with_fallback": len(w_miss),
            "workers_with_ok": len(w_ok), "workers_with_both": len(w_ok & w_miss),
            "new_proxy_connections": sum(1 for p in proxy if p["kind"] == "a"),
            "uplink_bytes_per_request": round(sum(int(p["bytes"]) for p in up) / max(1, len(rows))),
            "uplink_mbps_mean": round(sum(int(p["bytes"]) for p in up) * 8 / span_s / 1e6, 2),
            "proxy_uplink_chunk_ms": {"p50": pct(chunk, .5), "p99": pct(chunk, .99),
                                      "max": round(max(chunk), 1) if chunk else None},
            "ok_send_to_server_ms": {"p50": pct(recv_delay(ok), .5), "max": pct(recv_delay(ok), 1)},
            "missed_reaching_server": len(recv_delay(miss)),
            "missed_send_to_server_ms": {"p50": pct(recv_delay(miss), .5),
                                         "min": pct(recv_delay(miss), 0)},
        }
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    s = summarise(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--json":
        json.dump(s, open(sys.argv[3], "w"), indent=1)
    for tag, r in s.items():
        print(f"{tag}: {r['fallbacks']}/{r['offloads']} missed; workers used {r['workers_used']}, "
              f"with a miss {r['workers_with_fallback']}, with both {r['workers_with_both']}; "
              f"uplink {r['uplink_mbps_mean']} Mbit/s; missed send->server p50 "
              f"{r['missed_send_to_server_ms']['p50']} ms")


if __name__ == "__main__":
    main()
