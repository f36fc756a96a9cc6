#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Rewrites an ONNX model so OpenCV 4.6 DNN (Debian bookworm) can import it.

OpenCV 4.6's ONNX importer accepts Clip only in its opset-6 form (one input, min/max attributes),
while torch.onnx exports opset >= 11 Clip(x, min, max) with the bounds as Constant nodes or
initializers. This script folds each constant-bound Clip into the attribute form, drops the
constants no longer used, and lowers the model's default-domain opset to 10 when every remaining
op exists unchanged at opset 10 (the MobileNetV2 estimator uses Add, Conv, Clip, Flatten, Gemm,
GlobalAveragePool). The numbers the graph computes do not change.

Usage: tools/route/onnx_opencv_compat.py IN.onnx OUT.onnx
Needs the onnx Python package (Debian: python3-onnx; run with /usr/bin/python3).
"""
import sys

import onnx
from onnx import helper, numpy_helper

OPSET10_SAFE = {"Add", "Clip", "Conv", "Flatten", "Gemm", "GlobalAveragePool", "Relu",
                "BatchNormalization", "MaxPool", "AveragePool", "Mul", "Concat", "Reshape"}


def scalar_of(name, consts):
    if name == "":
        return None
    if name not in consts:
        raise ValueError(f"Clip bound {name} is not a constant")
    arr = consts[name].reshape(-1)
    if arr.size != 1:
        raise ValueError(f"Clip bound {name} is not a scalar")
    return float(arr[0])


def convert(model):
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = numpy_helper.to_array(a.t)
    new_nodes = []
    for n in g.node:
        if n.op_type == "Clip" and len(n.input) > 1:
            lo = scalar_of(n.input[1], consts)
            hi = scalar_of(n.input[2], consts) if len(n.input) > 2 else None
            attrs = {}
            if lo is not None:
                attrs["min"] = lo
            if hi is not None:
                attrs["max"] = hi
            n = helper.make_node("Clip", [n.input[0]], list(n.output), name=n.name, **attrs)
        new_nodes.append(n)
    used = {i for n in new_nodes for i in n.input} | {o.name for o in g.output}
    kept = [n for n in new_nodes if not (n.op_type == "Constant" and n.output[0] not in used)]
    del g.node[:]
    g.node.extend(kept)
    keep_init = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_init)
    ops = {n.op_type for n in g.node}
    if ops <= OPSET10_SAFE:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = 10
    onnx.checker.check_model(model)
    return model, sorted(ops)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    model, ops = convert(onnx.load(sys.argv[1]))
    onnx.save(model, sys.argv[2])
    print(f"wrote {sys.argv[2]}: ops {ops}, opset {[i.version for i in model.opset_import]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
