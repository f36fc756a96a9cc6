#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baselines for bench/kernels/cuda_kernels_bench.cpp, on the same shapes, timed the same
way (CUDA events around each repetition, 256 MiB L2 flush before it, mean over repetitions).
Writes JSON {name: {"ms": mean_ms}} with the Google Benchmark names, so compare.py can pair them.

  python3 tools/bench/torch_baselines.py --out torch.json [--only gemm,attention,memory]
"""
import argparse
import json

import torch
import torch.nn.functional as F

FLUSH = None
# BM_Gemm runs exactly this many timed repetitions too (cuda_kernels_bench.cpp kGemmReps): the
# GPU's clock under its power limit depends on how long a GEMM has been running back to back.
GEMM_REPS = 50


def timed(fn, reps=20, warmup=3):
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(reps):
        FLUSH.zero_()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        total += e0.elapsed_time(e1)
    return total / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gemm-reps", type=int, default=GEMM_REPS,
                    help="timed repetitions per GEMM (default: as many as BM_Gemm's)")
    ap.add_argument("--only", default="gemm,attention,memory",
                    help="comma-separated groups to time (default: all)")
    args = ap.parse_args()
    groups = set(args.only.split(","))
    unknown = groups - {"gemm", "attention", "memory"}
    if unknown:
        ap.error(f"--only: unknown group(s) {sorted(unknown)}")
    dev = "cuda"
    bf = torch.bfloat16
    res = {}

    gemm_shapes = [(4096, 2560, 2048), (4096, 2048, 2048), (4096, 22016, 2048), (4096, 2048, 11008),
                   (4096, 4608, 3584), (4096, 3584, 3584), (4096, 37888, 3584), (4096, 3584, 18944)]
    for m, n, k in gemm_shapes if "gemm" in groups else []:
        x = torch.randn(m, k, device=dev, dtype=bf)
        w = torch.randn(n, k, device=dev, dtype=bf)
        res[f"BM_Gemm/{m}/{n}/{k}/manual_time"] = {
            "ms": timed(lambda: torch.matmul(x, w.t()), reps=args.gemm_reps)}

    from torch.nn.attention import SDPBackend, sdpa_kernel
    # mode: 0 forward + backward, 1 forward only, 2 forward + backward (ferry without its workspace),
    # 3 forward + backward (ferry with atomic dQ; torch's flash backward accumulates dQ by atomics too)
    for s, b, h, g, d, mode in [] if "attention" not in groups else [(1024, 8, 16, 2, 128, 0), (2048, 4, 16, 2, 128, 0), (4096, 2, 16, 2, 128, 0),
                                (4096, 2, 28, 4, 128, 0), (2048, 4, 16, 2, 128, 1), (2048, 4, 16, 2, 128, 2),
                                (1024, 8, 16, 2, 128, 3), (2048, 4, 16, 2, 128, 3), (4096, 2, 16, 2, 128, 3),
                                (4096, 2, 28, 4, 128, 3)]:
        fwd_only = mode == 1
        q = torch.randn(b, h, s, d, device=dev, dtype=bf, requires_grad=True)
        # K/V expanded to H heads outside the timed region: the flash backend of SDPA then runs
        # plain MHA (this reads G/H less K/V than it would natively: an advantage to PyTorch).
        kk = torch.randn(b, g, s, d, device=dev, dtype=bf).repeat_interleave(h // g, dim=1).requires_grad_()
        vv = torch.randn(b, g, s, d, device=dev, dtype=bf).repeat_interleave(h // g, dim=1).requires_grad_()
        dout = torch.randn(b, h, s, d, device=dev, dtype=bf)

        def step():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
                if not fwd_only:
                    o.backward(dout)

        if fwd_only:
            with torch.no_grad():
                ms = timed(step)
        else:
            ms = timed(step)
        res[f"BM_AttnFwdBwd/{s}/{b}/{h}/{g}/{d}/{mode}/manual_time"] = {"ms": ms}

    if "memory" in groups:
        for t, c in [(8192, 2048), (8192, 3584)]:
            x = torch.randn(t, c, device=dev, dtype=bf)
            w = torch.randn(c, device=dev, dtype=bf)
            res[f"BM_RmsNorm/{t}/{c}/manual_time"] = {"ms": timed(lambda: F.rms_norm(x, (c,), w, 1e-6))}
        for t, f in [(8192, 11008), (8192, 18944)]:
            g_ = torch.randn(t, f, device=dev, dtype=bf)
            u = torch.randn(t, f, device=dev, dtype=bf)
            res[f"BM_SwiGlu/{t}/{f}/manual_time"] = {"ms": timed(lambda: F.silu(g_) * u)}
        n = 8192 * 3584
        a = torch.randn(n, device=dev, dtype=bf)
        b_ = torch.randn(n, device=dev, dtype=bf)
        res[f"BM_Add/{n}/manual_time"] = {"ms": timed(lambda: torch.add(a, b_))}
        n = 100000000
        p = torch.zeros(n, device=dev, dtype=torch.float32, requires_grad=True)
        p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        res[f"BM_AdamW/{n}/manual_time"] = {"ms": timed(opt.step)}
        nb = 1 << 30
        src = torch.empty(nb, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        res[f"BM_Copy/{nb}/manual_time"] = {"ms": timed(lambda: dst.copy_(src))}

    res["_meta"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
