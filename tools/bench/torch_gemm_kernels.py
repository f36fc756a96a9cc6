#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which cuBLAS and which kernel does torch.matmul run for the GEMM shapes of
bench/kernels/cuda_kernels_bench.cpp (BM_Gemm)? Prints torch's CUDA version, the cuBLAS / cuBLASLt
libraries its process loaded (a PyTorch wheel brings its own, which may differ from the CUDA
toolkit's that ferry links), and per shape the GPU kernels one torch.matmul launched (torch
profiler). Run with CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=... to also get cuBLASLt's own trace of
the algorithm it chose.

  python3 tools/bench/torch_gemm_kernels.py [--out FILE.json]
"""
import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = [(4096, 2560, 2048), (4096, 2048, 2048), (4096, 22016, 2048), (4096, 2048, 11008),
          (4096, 4608, 3584), (4096, 3584, 3584), (4096, 37888, 3584), (4096, 3584, 18944)]


def loaded_blas_libs():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "cublas" in path:
                libs.add(path)
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    bf = torch.bfloat16
    res = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0),
           "preferred_blas": str(torch.backends.cuda.preferred_blas_library()),
           "bf16_reduced_precision_reduction":
               torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
           "shapes": []}
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=bf)
        w = torch.randn(n, k, device="cuda", dtype=bf)
        torch.matmul(x, w.t())
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.matmul(x, w.t())
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        res["shapes"].append({"m": m, "n": n, "k": k, "kernels": kernels})
    res["libraries"] = loaded_blas_libs()
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
