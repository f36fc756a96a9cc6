#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Extracts the XGBoost booster from the bgt-ada conditioned-estimator pickle.

The artifact's cond-xgboost-moric.pkl is a plain dict whose 'model' entry is a pickled
xgboost.sklearn.XGBRegressor; its Booster's state holds the raw model as a UBJSON bytearray
({"Config": ..., "Model": ...}, XGBoost 3.1.3). Unpickling it with the xgboost package is not
needed (and Debian's python3-xgboost is 1.7.4): a restricted Unpickler replaces the xgboost classes
by inert stubs, refuses every other global except builtins.bytearray, and a small UBJSON decoder
turns the bytes into JSON.

Outputs (into --out-dir):
  cond_xgboost_moric.model.json   the "Model" part, as XGBoost's JSON model schema, adapted so
                                  libxgboost 1.7 loads it too: learner_model_param.base_score
                                  "[5.0009537E-1]" (3.x vector form) -> "5.0009537E-1".
  cond_xgboost_moric.raw.ubj      the untouched UBJSON bytes (with --keep-raw).

Usage: tools/route/extract_xgboost.py [--pkl PATH] [--out-dir tests/data/route] [--keep-raw]
No third-party Python packages are needed.
"""
import argparse
import json
import math
import os
import pickle
import struct
import sys


class _Stub:
    """Inert stand-in for an xgboost class: records the pickled state, runs no code."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.__dict__["_state"] = state


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "builtins" and name == "bytearray":
            return bytearray
        if module in ("xgboost.sklearn", "xgboost.core"):
            return type(name, (_Stub,), {})
        raise pickle.UnpicklingError(f"extract_xgboost: refusing global {module}.{name}")


# --- UBJSON (draft 12 subset XGBoost writes: {}, [], typed/counted containers, i U I l L d D S
# T F Z). Big-endian numbers.
_FMT = {"i": ">b", "U": ">B", "I": ">h", "l": ">i", "L": ">q", "d": ">f", "D": ">d"}


class _Ubj:
    def __init__(self, data):
        self.b = data
        self.p = 0

    def byte(self):
        c = chr(self.b[self.p])
        self.p += 1
        return c

    def num(self, t):
        f = _FMT[t]
        n = struct.calcsize(f)
        (v,) = struct.unpack_from(f, self.b, self.p)
        self.p += n
        return v

    def count(self):
        return self.num(self.byte())

    def string(self):
        n = self.count()
        s = self.b[self.p : self.p + n].decode("utf-8")
        self.p += n
        return s

    def value(self, t=None):
        t = t or self.byte()
        if t in _FMT:
            return self.num(t)
        if t == "S":
            return self.string()
        if t == "T":
            return True
        if t == "F":
            return False
        if t == "Z":
            return None
        if t == "[":
            return self.array()
        if t == "{":
            return self.obj()
        raise ValueError(f"ubjson: unknown marker {t!r} at byte {self.p - 1}")

    def header(self):
        typ = cnt = None
        if chr(self.b[self.p]) == "$":
            self.p += 1
            typ = self.byte()
        if chr(self.b[self.p]) == "#":
            self.p += 1
            cnt = self.count()
        return typ, cnt

    def array(self):
        typ, cnt = self.header()
        if cnt is not None:
            return [self.value(typ) for _ in range(cnt)]
        out = []
        while chr(self.b[self.p]) != "]":
            out.append(self.value())
        self.p += 1
        return out

    def obj(self):
        typ, cnt = self.header()
        out = {}
        if cnt is not None:
            for _ in range(cnt):
                k = self.string()
                out[k] = self.value(typ)
            return out
        while chr(self.b[self.p]) != "}":
            k = self.string()
            out[k] = self.value()
        self.p += 1
        return out


def decode_ubjson(data):
    u = _Ubj(data)
    v = u.value()
    if u.p != len(data):
        raise ValueError(f"ubjson: {len(data) - u.p} trailing bytes")
    return v


def _finite(x):
    # float32 values decoded to Python floats; JSON has no NaN/inf.
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("non-finite value in model")
    return x


def to_legacy_json(model):
    """Adapts an XGBoost 3.x model object so libxgboost 1.7 parses it (only base_score differs)."""
    lmp = model["learner"]["learner_model_param"]
    bs = lmp["base_score"]
    if bs.startswith("[") and bs.endswith("]"):
        inner = bs[1:-1].split(",")
        if len(inner) != 1:
            raise ValueError(f"multi-output base_score {bs} not supported")
        lmp["base_score"] = inner[0]
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--pkl", default=os.path.join(
        repo, "..", "shared", "data", "bgt-ada", "checkpoints", "cond-xgboost-moric.pkl"))
    ap.add_argument("--out-dir", default=os.path.join(repo, "tests", "data", "route"))
    ap.add_argument("--keep-raw", action="store_true")
    args = ap.parse_args()

    with open(args.pkl, "rb") as f:
        wrapper = _RestrictedUnpickler(f).load()
    reg = wrapper["model"]._state
    raw = bytes(reg["_Booster"]._state["handle"])
    doc = decode_ubjson(raw)
    model = to_legacy_json(doc["Model"])
    learner = model["learner"]
    trees = learner["gradient_booster"]["model"]["trees"]
    print(f"objective={learner['objective']['name']} base_score="
          f"{learner['learner_model_param']['base_score']} trees={len(trees)} "
          f"features={learner['learner_model_param']['num_feature']} "
          f"n_estimators={reg['n_estimators']} max_depth={reg['max_depth']}")
    for t in trees:
        for key in ("split_conditions", "base_weights"):
            for x in t[key]:
                _finite(x)
    os.makedirs(args.out_dir, exist_ok=True)
    out = os.path.join(args.out_dir, "cond_xgboost_moric.model.json")
    with open(out, "w") as f:
        # repr-exact floats: json writes the shortest round-tripping decimal of each float32->double
        json.dump(model, f, separators=(",", ":"))
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    if args.keep_raw:
        with open(os.path.join(args.out_dir, "cond_xgboost_moric.raw.ubj"), "wb") as f:
            f.write(raw)


if __name__ == "__main__":
    sys.exit(main())
