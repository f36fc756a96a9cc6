#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for bench/kernels/layer_bench.cpp: one transformers Qwen2DecoderLayer (SDPA
attention, causal, no mask), forward then backward (gradients for the input and every weight), on
the same geometries and B x S rows, timed the same way: CUDA events around forward and backward of
each repetition, a 256 MiB L2 flush before it, mean over the repetitions after a warm-up.

Main figure: the layer in bf16 (weights, activations and gradients bf16: the usual resident
fine-tuning setup, as tools/bench/train_torch_baseline.py). With --autocast also the layer with
f32 weights under torch.autocast(bf16), closer to ferry's arithmetic (f32 weights and
activations, bf16 GEMM operands), reported as autocast_ms in the same row.

Not timed: the rotary cos/sin (HF computes them once per model forward, shared by all layers),
zeroing gradients (set_to_none before each repetition, as optimizer.zero_grad does).

Writes JSON {"BM_Layer/<geo>/<B>/<S>/manual_time": {"ms", "fwd_ms", "bwd_ms", "tflops",
"peak_gib", ["autocast_ms", ...]}, "_meta": {...}}, names as layer_bench's so that
tools/bench/compare.py pairs them (ratio = torch_ms / ferry_ms).

  python3 tools/bench/torch_layer_baseline.py --out torch_layer.json
  python3 tools/bench/torch_layer_baseline.py --shapes 3b:8x1024 --reps 10 --autocast --out t.json
"""
import argparse
import json

import torch

# Qwen2.5-3B / 7B layer geometry (head dim = hidden / heads = 128); same table as layer_bench.
GEOMETRIES = {
    "3b": dict(hidden=2048, heads=16, kv_heads=2, intermediate=11008),
    "7b": dict(hidden=3584, heads=28, kv_heads=4, intermediate=18944),
    "tiny": dict(hidden=128, heads=4, kv_heads=2, intermediate=384),
}
DEFAULT_SHAPES = "3b:4x1024,3b:8x1024,3b:4x2048,3b:2x4096,7b:4x1024,7b:8x1024"
ROPE_THETA = 1e6
FLUSH_BYTES = 256 << 20


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        geo, bs = item.split(":")
        b, s = bs.split("x")
        if geo not in GEOMETRIES:
            raise SystemExit(f"torch layer baseline: unknown geometry {geo!r} in --shapes")
        shapes.append((geo, int(b), int(s)))
    return shapes


def qwen2_config(geo, seq):
    from transformers import Qwen2Config

    g = GEOMETRIES[geo]
    common = dict(vocab_size=128, hidden_size=g["hidden"], intermediate_size=g["intermediate"],
                  num_hidden_layers=1, num_attention_heads=g["heads"],
                  num_key_value_heads=g["kv_heads"], max_position_embeddings=max(seq, 32768),
                  rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                  hidden_act="silu", attn_implementation="sdpa")
    try:  # transformers 5.x: rope parameters as a dict
        cfg = Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    except TypeError:  # 4.x spelling
        cfg = Qwen2Config(**common, rope_theta=ROPE_THETA)
    try:  # the constructor argument above is the documented way; this makes sure of it
        cfg._attn_implementation = "sdpa"
    except AttributeError:
        pass
    return cfg


def check_rope(rotary, head_dim):
    """The rotary table is theta = 1e6's (a config spelling the installed transformers ignores
    would silently give its default 1e4)."""
    want = ROPE_THETA ** (-2.0 / head_dim)
    got = float(rotary.inv_freq[1])
    if abs(got - want) > 1e-3 * want:
        raise SystemExit(f"torch layer baseline: rope inv_freq[1] = {got}, want {want} (theta 1e6)")


def layer_flops(geo, b, s):
    """Model FLOPs of forward + backward, counted as layer_bench.cpp counts them."""
    g = GEOMETRIES[geo]
    c, f = g["hidden"], g["intermediate"]
    d = c // g["heads"]
    hd, gd = g["heads"] * d, g["kv_heads"] * d
    macs_per_token = c * (hd + 2 * gd) + hd * c + 3 * c * f
    linear = 3.0 * 2.0 * b * s * macs_per_token
    attn_fwd = 2.0 * 2.0 * b * g["heads"] * (s * s / 2.0) * d
    return linear + 3.5 * attn_fwd


class Timer:
    def __init__(self):
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def run(self, prep, fwd, bwd):
        """(forward ms, backward ms) of one repetition; prep() and an L2 flush before it."""
        e0, e1, e2 = self.events
        prep()
        self.flush.zero_()
        e0.record()
        out = fwd()
        e1.record()
        bwd(out)
        e2.record()
        e2.synchronize()
        return e0.elapsed_time(e1), e1.elapsed_time(e2)


def time_layer(geo, b, s, reps, warmup, autocast, timer):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    cfg = qwen2_config(geo, s)
    dev = "cuda"
    torch.manual_seed(0)
    wdtype = torch.float32 if autocast else torch.bfloat16
    layer = Qwen2DecoderLayer(cfg, layer_idx=0).to(device=dev, dtype=wdtype)
    layer.train()
    rotary = Qwen2RotaryEmbedding(config=cfg).to(dev)
    check_rope(rotary, cfg.hidden_size // cfg.num_attention_heads)
    x = torch.randn(b, s, cfg.hidden_size, device=dev, dtype=wdtype, requires_grad=True)
    pos = torch.arange(s, device=dev).unsqueeze(0).expand(b, s)
    with torch.no_grad():
        cos, sin = rotary(x, pos)  # in x's dtype, as Qwen2Model hands them to its layers
    dout = torch.randn(b, s, cfg.hidden_size, device=dev, dtype=wdtype) * 1e-2
    params = list(layer.parameters())

    def prep():  # optimizer.zero_grad(set_to_none=True): no GPU work
        for p in params:
            p.grad = None
        x.grad = None

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = layer(hidden_states=x, attention_mask=None, position_ids=pos,
                        position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    def bwd(out):
        out.backward(dout)

    for _ in range(warmup):
        prep()
        bwd(fwd())
    torch.cuda.synchronize()
    if warmup > 0:  # gradients reached the input and the layer's first weight (a check only)
        assert x.grad is not None and torch.isfinite(x.grad.float()).all(), "input gradient missing"
        assert layer.input_layernorm.weight.grad is not None, "input_layernorm gradient missing"
    torch.cuda.reset_peak_memory_stats()
    fwd_ms = bwd_ms = 0.0
    for _ in range(reps):
        f, w = timer.run(prep, fwd, bwd)
        fwd_ms += f
        bwd_ms += w
    peak = torch.cuda.max_memory_allocated()
    ms = (fwd_ms + bwd_ms) / reps
    return {"ms": ms, "fwd_ms": fwd_ms / reps, "bwd_ms": bwd_ms / reps,
            "tflops": layer_flops(geo, b, s) / (ms * 1e-3) / 1e12, "peak_gib": peak / 2**30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="geometry:BxS,... (3b, 7b, tiny)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--autocast", action="store_true",
                    help="also time f32 weights under torch.autocast(bf16) (autocast_ms)")
    a = ap.parse_args()
    import transformers

    timer = Timer()
    res = {}
    for geo, b, s in parse_shapes(a.shapes):
        name = f"BM_Layer/{geo}/{b}/{s}/manual_time"
        row = time_layer(geo, b, s, a.reps, a.warmup, False, timer)
        torch.cuda.empty_cache()  # the previous layer's blocks: no effect on the next timing
        if a.autocast:
            ac = time_layer(geo, b, s, a.reps, a.warmup, True, timer)
            torch.cuda.empty_cache()
            row.update({"autocast_" + k: v for k, v in ac.items()})
        res[name] = row
        extra = f", autocast {row['autocast_ms']:.3f} ms" if a.autocast else ""
        print(f"{name}: torch {row['ms']:.3f} ms (fwd {row['fwd_ms']:.3f}, bwd {row['bwd_ms']:.3f}), "
              f"{row['tflops']:.1f} TFLOP/s, peak {row['peak_gib']:.2f} GiB{extra}", flush=True)
    res["_meta"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "device": torch.cuda.get_device_name(0), "reps": a.reps, "warmup": a.warmup,
                    "what": "Qwen2DecoderLayer fwd+bwd, sdpa, bf16 (autocast_*: f32 weights + autocast)"}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
