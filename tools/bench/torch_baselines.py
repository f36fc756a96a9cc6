#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baselines for bench/kernels/cuda_kernels_bench.cpp, on the same shapes, timed the same
way (CUDA events around each repetition, 256 MiB L2 flush before it, mean over repetitions).
Writes JSON {name: {"ms": mean_ms}} with the Google Benchmark names, so compare.py can pair them.

  python3 tools/bench/torch_baselines.py --out torch.json [--only gemm,attention,memory,...]
  python3 tools/bench/torch_baselines.py --list [--only ...]   # the row names; needs no torch, no GPU

Groups: gemm, attention, memory (rms_norm, swiglu, add, adamw, copy), and session 38's rope
(HF's apply_rotary_pos_emb, forward and its autograd backward), embedding (F.embedding forward;
backward as index_add_ into an existing table, with the autograd backward's time beside it as
"autograd_ms") and add_norm (the residual add then F.rms_norm, f32). Those rows take a dtype
argument like cuda_kernels_bench.cpp's: 0 bf16, 1 f32.
"""
import argparse
import json

torch = None  # imported in main(), so --list and --help run without torch
F = None

GROUPS = ("gemm", "attention", "memory", "rope", "embedding", "add_norm")
GEMM_SHAPES = [(4096, 2560, 2048), (4096, 2048, 2048), (4096, 22016, 2048), (4096, 2048, 11008),
               (4096, 4608, 3584), (4096, 3584, 3584), (4096, 37888, 3584), (4096, 3584, 18944)]
# (S, B, H, G, D, mode), mode as BM_AttnFwdBwd's.
ATTN_CASES = [(1024, 8, 16, 2, 128, 0), (2048, 4, 16, 2, 128, 0), (4096, 2, 16, 2, 128, 0),
              (4096, 2, 28, 4, 128, 0), (2048, 4, 16, 2, 128, 1), (2048, 4, 16, 2, 128, 2),
              (1024, 8, 16, 2, 128, 3), (2048, 4, 16, 2, 128, 3), (4096, 2, 16, 2, 128, 3),
              (4096, 2, 28, 4, 128, 3)]
RMS_NORM_SHAPES = [(8192, 2048), (8192, 3584)]
SWIGLU_SHAPES = [(8192, 11008), (8192, 18944)]
ADD_N = 8192 * 3584
ADAMW_N = 100000000
COPY_BYTES = 1 << 30
# Session 38's rows (cuda_kernels_bench.cpp BM_Rope, BM_Embedding, BM_EmbeddingBwd, BM_AddRmsNorm):
# Qwen2.5-3B (C 2048, 16/2 heads) and 7B (C 3584, 28/4 heads), 8192 tokens = 2 sequences of 4096,
# head dim 128, rope_theta 1e6, vocabulary 151936.
SEQ_LEN = 4096
ROPE_THETA = 1e6
ROPE_SHAPES = [(8192, 16, 2, 128), (8192, 28, 4, 128)]  # (T, H, G, D)
EMB_SHAPES = [(8192, 151936, 2048), (8192, 151936, 3584)]  # (T, V, C)
ADD_NORM_SHAPES = [(8192, 2048), (8192, 3584)]  # (T, C), f32 only (the backend's fused kernel)
DTS = (0, 1)  # 0 bf16, 1 f32

FLUSH = None
# BM_Gemm runs exactly this many timed repetitions too (cuda_kernels_bench.cpp kGemmReps): the
# GPU's clock under its power limit depends on how long a GEMM has been running back to back.
GEMM_REPS = 50


def timed(fn, reps=20, warmup=3, setup=None):
    """Mean ms of fn over reps, each after an L2 flush. setup (optional) runs before each
    repetition's flush, outside the timed region: the forward whose backward fn times."""
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(reps):
        if setup is not None:
            setup()
        FLUSH.zero_()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        total += e0.elapsed_time(e1)
    return total / reps


def row_names(groups):
    """The Google Benchmark names (without "/iterations:N", which compare.py drops) of the rows
    each group times, in order."""
    names = []
    if "gemm" in groups:
        names += [f"BM_Gemm/{m}/{n}/{k}/manual_time" for m, n, k in GEMM_SHAPES]
    if "attention" in groups:
        names += [f"BM_AttnFwdBwd/{s}/{b}/{h}/{g}/{d}/{mode}/manual_time"
                  for s, b, h, g, d, mode in ATTN_CASES]
    if "memory" in groups:
        names += [f"BM_RmsNorm/{t}/{c}/manual_time" for t, c in RMS_NORM_SHAPES]
        names += [f"BM_SwiGlu/{t}/{f}/manual_time" for t, f in SWIGLU_SHAPES]
        names += [f"BM_Add/{ADD_N}/manual_time", f"BM_AdamW/{ADAMW_N}/manual_time",
                  f"BM_Copy/{COPY_BYTES}/manual_time"]
    if "rope" in groups:
        names += [f"BM_Rope/{t}/{h}/{g}/{d}/{bwd}/{dt}/manual_time"
                  for t, h, g, d in ROPE_SHAPES for dt in DTS for bwd in (0, 1)]
    if "embedding" in groups:
        names += [f"BM_Embedding{sfx}/{t}/{v}/{c}/{dt}/manual_time"
                  for t, v, c in EMB_SHAPES for dt in DTS for sfx in ("", "Bwd")]
    if "add_norm" in groups:
        names += [f"BM_AddRmsNorm/{t}/{c}/manual_time" for t, c in ADD_NORM_SHAPES]
    return names


def token_ids(t, v, dev):
    """cuda_kernels_bench.cpp's token_ids(): (i * 2654435761 mod 2^32) mod V, as int64 (HF's
    input_ids dtype; ferry reads the same values as i32)."""
    i = torch.arange(t, dtype=torch.int64, device=dev)
    return (i * 2654435761) % (1 << 32) % v


def rotate_half(x):
    """transformers' rotate_half (models/qwen2/modeling_qwen2.py)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb: q [B, H, S, D], k [B, G, S, D], cos / sin [B, S, D]."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def rope_cos_sin(b, s, d, dtype, dev):
    """cos / sin [B, S, D] as Qwen2RotaryEmbedding computes them once per forward (f32 angles,
    cast to the activations' dtype); positions 0..S-1 in each of the B sequences. Not timed: HF
    shares them across layers."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.int64, device=dev).float() / d))
    pos = torch.arange(s, device=dev).float().expand(b, s)
    freqs = pos[..., None] * inv_freq  # [B, S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_case(t, h, g, d, dtype, dev, seq=SEQ_LEN):
    """(forward, backward_setup, backward) for one BM_Rope shape. q / k are laid out as HF's
    attention makes them: q_proj(x).view(B, S, H, D).transpose(1, 2) (a strided view).
    forward: apply_rotary_pos_emb(q, k, cos, sin); backward: autograd's gradient of it w.r.t. q
    and k (torch.autograd.grad: no accumulation into .grad), the forward run by backward_setup."""
    b = t // seq
    cos, sin = rope_cos_sin(b, seq, d, dtype, dev)
    qb = torch.randn(b, seq, h, d, device=dev, dtype=dtype, requires_grad=True)
    kb = torch.randn(b, seq, g, d, device=dev, dtype=dtype, requires_grad=True)
    gq = torch.randn(b, h, seq, d, device=dev, dtype=dtype)
    gk = torch.randn(b, g, seq, d, device=dev, dtype=dtype)
    state = {}

    def forward():
        with torch.no_grad():
            return apply_rotary_pos_emb(qb.transpose(1, 2), kb.transpose(1, 2), cos, sin)

    def backward_setup():
        state["out"] = apply_rotary_pos_emb(qb.transpose(1, 2), kb.transpose(1, 2), cos, sin)

    def backward():
        return torch.autograd.grad(state.pop("out"), (qb, kb), (gq, gk))

    return forward, backward_setup, backward


def embedding_case(t, v, c, dtype, dev):
    """(forward, backward, autograd_setup, autograd_backward) for one BM_Embedding[Bwd] shape.
    backward: d_table.index_add_(0, ids, d_out), accumulating into an existing table like ferry's
    embedding_backward; autograd_backward: autograd's gradient of F.embedding (a dense zeroed
    [V, C] gradient, then the scatter), the lookup run by autograd_setup."""
    ids = token_ids(t, v, dev)
    table = torch.randn(v, c, device=dev, dtype=dtype)
    d_table = torch.zeros(v, c, device=dev, dtype=dtype)
    d_out = torch.randn(t, c, device=dev, dtype=dtype)
    leaf = table.detach().requires_grad_()
    state = {}

    def forward():
        with torch.no_grad():
            return F.embedding(ids, table)

    def backward():
        return d_table.index_add_(0, ids, d_out)

    def autograd_setup():
        state["out"] = F.embedding(ids, leaf)

    def autograd_backward():
        return torch.autograd.grad(state.pop("out"), leaf, d_out)

    return forward, backward, autograd_setup, autograd_backward


def add_norm_case(t, c, dev, eps=1e-6):
    """BM_AddRmsNorm's pair: x_out = x + y, then F.rms_norm(x_out) * weight, f32 (two launches
    or more in torch; one fused kernel in ferry)."""
    x = torch.randn(t, c, device=dev)
    y = torch.randn(t, c, device=dev)
    w = torch.randn(c, device=dev)
    x_out = torch.empty_like(x)

    def step():
        torch.add(x, y, out=x_out)
        return F.rms_norm(x_out, (c,), w, eps)

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="JSON file to write (required unless --list)")
    ap.add_argument("--gemm-reps", type=int, default=GEMM_REPS,
                    help="timed repetitions per GEMM (default: as many as BM_Gemm's)")
    ap.add_argument("--only", default=",".join(GROUPS),
                    help=f"comma-separated groups to time (default: all of {','.join(GROUPS)})")
    ap.add_argument("--list", action="store_true",
                    help="print the row names of the selected groups and exit (no torch, no GPU)")
    args = ap.parse_args()
    groups = set(args.only.split(","))
    unknown = groups - set(GROUPS)
    if unknown:
        ap.error(f"--only: unknown group(s) {sorted(unknown)}")
    if args.list:
        print("\n".join(row_names(groups)))
        return
    if not args.out:
        ap.error("--out is required (or --list)")
    global torch, F
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    bf = torch.bfloat16
    res = {}

    for m, n, k in GEMM_SHAPES if "gemm" in groups else []:
        x = torch.randn(m, k, device=dev, dtype=bf)
        w = torch.randn(n, k, device=dev, dtype=bf)
        res[f"BM_Gemm/{m}/{n}/{k}/manual_time"] = {
            "ms": timed(lambda: torch.matmul(x, w.t()), reps=args.gemm_reps)}

    from torch.nn.attention import SDPBackend, sdpa_kernel
    # mode: 0 forward + backward, 1 forward only, 2 forward + backward (ferry without its workspace),
    # 3 forward + backward (ferry with atomic dQ; torch's flash backward accumulates dQ by atomics too)
    for s, b, h, g, d, mode in ATTN_CASES if "attention" in groups else []:
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
        for t, c in RMS_NORM_SHAPES:
            x = torch.randn(t, c, device=dev, dtype=bf)
            w = torch.randn(c, device=dev, dtype=bf)
            res[f"BM_RmsNorm/{t}/{c}/manual_time"] = {"ms": timed(lambda: F.rms_norm(x, (c,), w, 1e-6))}
        for t, f in SWIGLU_SHAPES:
            g_ = torch.randn(t, f, device=dev, dtype=bf)
            u = torch.randn(t, f, device=dev, dtype=bf)
            res[f"BM_SwiGlu/{t}/{f}/manual_time"] = {"ms": timed(lambda: F.silu(g_) * u)}
        n = ADD_N
        a = torch.randn(n, device=dev, dtype=bf)
        b_ = torch.randn(n, device=dev, dtype=bf)
        res[f"BM_Add/{n}/manual_time"] = {"ms": timed(lambda: torch.add(a, b_))}
        n = ADAMW_N
        p = torch.zeros(n, device=dev, dtype=torch.float32, requires_grad=True)
        p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        res[f"BM_AdamW/{n}/manual_time"] = {"ms": timed(opt.step)}
        del p, opt
        nb = COPY_BYTES
        src = torch.empty(nb, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        res[f"BM_Copy/{nb}/manual_time"] = {"ms": timed(lambda: dst.copy_(src))}
        del src, dst

    dts = {0: bf, 1: torch.float32}
    for t, h, g, d in ROPE_SHAPES if "rope" in groups else []:
        for dt in DTS:
            fwd, bwd_setup, bwd = rope_case(t, h, g, d, dts[dt], dev)
            res[f"BM_Rope/{t}/{h}/{g}/{d}/0/{dt}/manual_time"] = {"ms": timed(fwd)}
            res[f"BM_Rope/{t}/{h}/{g}/{d}/1/{dt}/manual_time"] = {"ms": timed(bwd, setup=bwd_setup)}
            del fwd, bwd_setup, bwd
    for t, v, c in EMB_SHAPES if "embedding" in groups else []:
        for dt in DTS:
            fwd, bwd, ag_setup, ag_bwd = embedding_case(t, v, c, dts[dt], dev)
            res[f"BM_Embedding/{t}/{v}/{c}/{dt}/manual_time"] = {"ms": timed(fwd)}
            res[f"BM_EmbeddingBwd/{t}/{v}/{c}/{dt}/manual_time"] = {
                "ms": timed(bwd), "autograd_ms": timed(ag_bwd, setup=ag_setup)}
            del fwd, bwd, ag_setup, ag_bwd
    for t, c in ADD_NORM_SHAPES if "add_norm" in groups else []:
        res[f"BM_AddRmsNorm/{t}/{c}/manual_time"] = {"ms": timed(add_norm_case(t, c, dev))}

    res["_meta"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
