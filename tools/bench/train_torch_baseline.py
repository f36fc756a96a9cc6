#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for `ferry bench train`: the same geometry as a Hugging Face Qwen3 model
(what `ferry bench train` builds by default: qk-norm, tied embeddings, vocab 259; `--arch qwen2`
on both sides: HF Qwen2, q/k/v biases and no qk-norm, the Qwen2.5 models' own architecture),
fully resident on the GPU,
bf16 weights, SDPA attention, fused torch AdamW — the usual single-GPU fine-tuning setup when the
model fits. Same batch (B sequences of S random tokens, next-token loss), same step count;
wall time per step with a CUDA sync at the end of each step. Writes JSON.

  python3 tools/bench/train_torch_baseline.py --layers 8 --hidden 2048 --heads 16 --kv-heads 2 \
      --head-dim 128 --intermediate 11008 --batch 4 --seq 1024 --steps 5 --out torch_train.json
"""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM


# The published configs' shapes (config.json of Qwen/Qwen2.5-3B and -7B), the same facts as
# ferry's own geometry table behind `ferry bench train --geometry`.
GEOMETRIES = {
    "qwen2.5-3b": dict(layers=36, hidden=2048, heads=16, kv_heads=2, head_dim=128,
                       intermediate=11008, vocab=151936, untied_embeddings=False),
    "qwen2.5-7b": dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                       intermediate=18944, vocab=152064, untied_embeddings=True),
}


def main():
    p = argparse.ArgumentParser()
    defaults = [("layers", 4), ("hidden", 128), ("heads", 4), ("kv-heads", 2), ("head-dim", 32),
                ("intermediate", 384), ("vocab", 259), ("batch", 4), ("seq", 256), ("steps", 5),
                ("warmup", 1), ("grad-accum", 1)]
    for name, _ in defaults:
        p.add_argument("--" + name, type=int, default=None)
    p.add_argument("--geometry", choices=sorted(GEOMETRIES),
                   help="a published model's shapes, vocabulary and tying, as ferry bench train's "
                        "--geometry (--layers may still cut the depth)")
    p.add_argument("--checkpointing", action="store_true",
                   help="gradient checkpointing every layer (HF's own)")
    p.add_argument("--untied-embeddings", action="store_true",
                   help="lm_head a matrix of its own (Qwen2.5-7B), as ferry bench train's flag")
    p.add_argument("--arch", choices=["qwen3", "qwen2"], default="qwen3",
                   help="as ferry bench train's --arch")
    p.add_argument("--init-on", choices=["cuda", "cpu"], default="cuda",
                   help="where the random weights are created (cpu: fp32 on the host, then copied)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.geometry:
        shape_flags = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
        if any(getattr(a, f) is not None for f in shape_flags) or a.untied_embeddings:
            p.error("--geometry excludes the shape flags (as in ferry bench train)")
        for key, value in GEOMETRIES[a.geometry].items():
            if key == "untied_embeddings":
                a.untied_embeddings = value
            elif getattr(a, key) is None:
                setattr(a, key, value)
    for name, default in defaults:
        key = name.replace("-", "_")
        if getattr(a, key) is None:
            setattr(a, key, default)
    common = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                  num_hidden_layers=a.layers, num_attention_heads=a.heads,
                  num_key_value_heads=a.kv_heads, max_position_embeddings=max(a.seq, 512),
                  tie_word_embeddings=not a.untied_embeddings, rms_norm_eps=1e-6,
                  attn_implementation="sdpa")
    if a.arch == "qwen2":
        # HF's Qwen2 takes its head dim as hidden / heads (true of every Qwen2.5 model).
        if a.head_dim * a.heads != a.hidden:
            p.error("--arch qwen2 needs --head-dim x --heads == --hidden")
        cfg, model_cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        cfg, model_cls = Qwen3Config(head_dim=a.head_dim, **common), Qwen3ForCausalLM
    torch.manual_seed(1)
    t_init = time.perf_counter()
    if a.init_on == "cuda":
        # Parameters created and randomly initialized on the GPU in bf16: a 7B model's CPU fp32
        # init and copy took most of two minutes of device time (session 15). Throughput does not
        # depend on the random values.
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cuda"):
                model = model_cls(cfg)
        except (RuntimeError, TypeError) as e:  # an older torch / transformers: the host path
            print(f"train_torch_baseline: init on cuda failed ({e}); initializing on the host",
                  file=sys.stderr)
            a.init_on = "cpu"
        finally:
            torch.set_default_dtype(torch.float32)
    if a.init_on == "cpu":
        model = model_cls(cfg).to(device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t_init
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    params = sum(p.numel() for p in model.parameters())
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    if a.grad_accum < 1:
        p.error("--grad-accum must be >= 1")
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        # One optimizer step per grad_accum micro-batches, as ferry bench train's --grad-accum
        # (HF's convention: each micro-batch's mean loss scaled by 1/grad_accum).
        for _ in range(a.grad_accum):
            out = model(input_ids=ids, labels=ids)
            (out.loss / a.grad_accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(float(out.loss))
        if step >= a.warmup:
            times.append(dt)
    tokens = a.batch * a.seq * a.grad_accum
    mean = sum(times) / len(times)
    rep = {"baseline": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "params": params, "batch": a.batch, "seq": a.seq, "steps": a.steps,
           "grad_accum": a.grad_accum, "init_on": a.init_on, "init_s": init_s,
           "checkpointing": a.checkpointing, "arch": cfg.model_type,
           "dtype": "bf16 weights, fused AdamW, SDPA",
           "step_ms_median": statistics.median(times) * 1e3, "step_ms_mean": mean * 1e3,
           "tokens_per_s": tokens / mean, "model_tflops": 6 * params * tokens / mean / 1e12,
           "peak_gpu_bytes": torch.cuda.max_memory_allocated(), "loss_first": losses[0],
           "loss_last": losses[-1]}
    print(json.dumps(rep, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=2)


if __name__ == "__main__":
    main()
