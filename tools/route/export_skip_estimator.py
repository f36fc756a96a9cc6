#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Exports the bgt-ada weak-skipping estimator to ONNX and writes parity fixtures.

Needs python3 with torch, torchvision, onnx (onnxruntime optional, used as a cross-check). Runs on
the GPU machine or any machine with those packages; the model itself runs on the CPU.

Architecture (shared/design/route.md; checkpoint keys 0.0.* .. 0.13.*, 4.weight, 4.bias):
  Sequential(0: torchvision MobileNetV2.features[:14]  (96 channels, stride 16),
             1: AdaptiveAvgPool2d(1), 2: Flatten(1), 3: Dropout (identity in eval),
             4: Linear(96 -> 1))
Input 1x3x128x128 float, RGB, x = (pixel/255 - mean) / std with the ImageNet mean/std
(the checkpoint stores no normalisation; torchvision's pretrained MobileNetV2, which the estimator
is fine-tuned from, uses these). Output: the raw linear output (a logit for the OffloadBin/focal
target; routing ranks scores through an ECDF so a monotone squashing would change nothing).

Also (--edgeml) evaluates the EdgeML baseline MLP from cond-edgeml-moric-wmse.pt on fixed rows so
the C++ port has a PyTorch reference: stacks.i = [Linear, BatchNorm1d, ReLU, Dropout] for i < 3,
stacks.3 = [Linear]; input standardised by the pickled StandardScaler (mean_, scale_).

Writes into --out: skip_mobilenet_v2_offloadbin.onnx, skip_parity.u8 (N x 128 x 128 x 3 uint8 RGB,
HWC), skip_parity.json (PyTorch outputs), edgeml_parity.json, export_log.txt.
"""
import argparse
import json
import os
import pickle
import sys
import traceback
import types

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SIZE = 128
N_IMAGES = 4


def synthetic_image(i):
    """Deterministic 128x128x3 uint8 RGB pixels (same formula documented in the C++ test)."""
    import numpy as np
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    img = np.zeros((SIZE, SIZE, 3), dtype=np.int64)
    for c in range(3):
        img[:, :, c] = (x * (3 + i) + y * (5 + 2 * c) + 40 * c + 17 * i + (x * y) // (7 + i)) % 256
    return img.astype(np.uint8)


class _Stub:
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        self.__dict__["_state"] = state


class _Unpickler(pickle.Unpickler):
    """torch.load helper: sklearn classes become inert stubs (sklearn is not installed)."""

    def find_class(self, module, name):
        if module.startswith("sklearn"):
            return type(name, (_Stub,), {})
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            if module.startswith("numpy._core"):  # pickled by numpy 2, loaded by numpy 1
                return super().find_class(module.replace("numpy._core", "numpy.core"), name)
            raise


def _pickle_module():
    m = types.ModuleType("stub_pickle")
    m.Unpickler = _Unpickler
    m.load = pickle.load
    m.__name__ = "stub_pickle"
    return m


def export_skip(args, log):
    import numpy as np
    import torch
    import torchvision

    ck = torch.load(args.skip_ckpt, map_location="cpu", weights_only=False)
    log(f"checkpoint keys: {sorted(k for k in ck.keys())}")
    log(f"image_size={ck.get('image_size')} y_mean={ck.get('y_mean')} y_std={ck.get('y_std')} "
        f"name={ck.get('name')}")
    sd = ck["model_state_dict"]
    feats = torchvision.models.mobilenet_v2(weights=None).features[:14]
    model = torch.nn.Sequential(feats, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(1),
                                torch.nn.Dropout(0.2), torch.nn.Linear(96, 1))
    missing = model.load_state_dict(sd, strict=True)
    log(f"load_state_dict: {missing}")
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params={n_params}")

    imgs = np.stack([synthetic_image(i) for i in range(N_IMAGES)])  # N,H,W,3
    x = torch.from_numpy(imgs).permute(0, 3, 1, 2).double() / 255.0
    x = (x - torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
        STD, dtype=torch.float64).view(1, 3, 1, 1)
    x = x.float()
    with torch.no_grad():
        out = model(x).reshape(-1).tolist()
        out64 = model.double()(x.double()).reshape(-1).tolist()
        model.float()
    log(f"pytorch outputs (fp32): {out}")
    log(f"pytorch outputs (fp64): {out64}")

    onnx_path = os.path.join(args.out, "skip_mobilenet_v2_offloadbin.onnx")
    dummy = torch.zeros(1, 3, SIZE, SIZE)
    kw = dict(input_names=["image"], output_names=["score"], opset_version=11,
              do_constant_folding=True)
    try:
        torch.onnx.export(model, dummy, onnx_path, dynamo=False, **kw)
    except TypeError:
        torch.onnx.export(model, dummy, onnx_path, **kw)
    log(f"onnx size={os.path.getsize(onnx_path)}")
    try:  # OpenCV 4.6 needs the opset-6 form of Clip (tools/route/onnx_opencv_compat.py)
        import onnx
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import onnx_opencv_compat
        m, ops = onnx_opencv_compat.convert(onnx.load(onnx_path))
        onnx.save(m, onnx_path)
        log(f"opencv-compatible rewrite: ops {ops}")
    except Exception as e:  # noqa: BLE001
        log(f"opencv-compatible rewrite FAILED ({e!r}); run tools/route/onnx_opencv_compat.py")
    try:
        import onnx
        m = onnx.load(onnx_path)
        onnx.checker.check_model(m)
        log(f"onnx ops: {sorted(set(n.op_type for n in m.graph.node))}")
    except Exception as e:  # noqa: BLE001
        log(f"onnx check failed: {e!r}")
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        ort_out = [float(sess.run(None, {"image": x[i:i + 1].numpy()})[0].reshape(-1)[0])
                   for i in range(N_IMAGES)]
        log(f"onnxruntime outputs: {ort_out} max|diff|="
            f"{max(abs(a - b) for a, b in zip(ort_out, out))}")
    except Exception as e:  # noqa: BLE001
        log(f"onnxruntime check failed: {e!r}")

    imgs.astype(np.uint8).tofile(os.path.join(args.out, "skip_parity.u8"))
    with open(os.path.join(args.out, "skip_parity.json"), "w") as f:
        json.dump({"n": N_IMAGES, "size": SIZE, "layout": "NHWC uint8 RGB", "mean": MEAN,
                   "std": STD, "torch_fp32": out, "torch_fp64": out64,
                   "image_size": ck.get("image_size"), "y_mean": ck.get("y_mean"),
                   "y_std": ck.get("y_std"), "torch": torch.__version__,
                   "torchvision": torchvision.__version__, "params": n_params}, f, indent=1)


def export_edgeml(args, log):
    import numpy as np
    import torch

    ck = torch.load(args.edgeml_ckpt, map_location="cpu", weights_only=False,
                    pickle_module=_pickle_module())
    sd = ck["model_state_dict"]
    log(f"edgeml keys: {list(sd.keys())}")
    sc = ck["scaler"]._state
    mean = np.asarray(sc["mean_"], dtype=np.float64)
    scale = np.asarray(sc["scale_"], dtype=np.float64)
    layers = []
    dims = [150, 64, 32, 16]
    for i in range(3):
        layers += [torch.nn.Linear(dims[i], dims[i + 1]), torch.nn.BatchNorm1d(dims[i + 1]),
                   torch.nn.ReLU(), torch.nn.Dropout(0.1)]
    layers += [torch.nn.Linear(16, 1)]
    # Rebuild the "stacks.i.j" naming.
    stacks = torch.nn.ModuleList([torch.nn.Sequential(*layers[4 * i:4 * i + 4]) for i in range(3)]
                                 + [torch.nn.Sequential(layers[12])])
    holder = torch.nn.Module()
    holder.stacks = stacks
    log(f"edgeml load: {holder.load_state_dict(sd, strict=True)}")
    holder.eval()
    rng = np.random.default_rng(7)
    rows = []
    for r in range(5):
        n = [0, 1, 3, 25, 12][r]
        v = np.zeros(150)
        conf = np.sort(rng.uniform(0.05, 1.0, n))[::-1]
        for k in range(n):
            w, h = rng.uniform(0.02, 0.9), rng.uniform(0.02, 0.9)
            v[6 * k:6 * k + 6] = [conf[k], rng.uniform(0, 1), rng.uniform(0, 1), w, h, w * h]
        rows.append(v)
    X = np.stack(rows)
    Z = torch.from_numpy((X - mean) / scale).float()
    with torch.no_grad():
        y = torch.nn.Sequential(*stacks)(Z).reshape(-1).tolist()
    log(f"edgeml outputs: {y}")
    state = {k: v.detach().double().reshape(-1).tolist() for k, v in sd.items()
             if not k.endswith("num_batches_tracked")}
    shapes = {k: list(v.shape) for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    with open(os.path.join(args.out, "edgeml_parity.json"), "w") as f:
        json.dump({"rows": X.tolist(), "torch_fp32": y, "scaler_mean": mean.tolist(),
                   "scaler_scale": scale.tolist(), "state": state, "shapes": shapes,
                   "bn_eps": 1e-5, "activation": "relu"}, f)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ck_dir = os.path.join(repo, "..", "shared", "data", "bgt-ada", "checkpoints")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-ckpt",
                    default=os.path.join(ck_dir, "skip-mobilenet_v2-offloadbin-focal.pt"))
    ap.add_argument("--edgeml-ckpt", default=os.path.join(ck_dir, "cond-edgeml-moric-wmse.pt"))
    ap.add_argument("--out", default="out")
    ap.add_argument("--no-edgeml", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log_f = open(os.path.join(args.out, "export_log.txt"), "w")

    def log(msg):
        print(msg)
        log_f.write(str(msg) + "\n")
        log_f.flush()

    rc = 0
    parts = [("skip", export_skip)] + ([] if args.no_edgeml else [("edgeml", export_edgeml)])
    for name, fn in parts:
        try:
            fn(args, log)
        except Exception:  # noqa: BLE001  keep going so one failure does not lose the other
            log(f"{name} FAILED:\n{traceback.format_exc()}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
