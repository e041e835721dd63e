#!/usr/bin/env python3
"""Compares two training runs: per-step losses (JSON lines) and the
parameters of their exported checkpoints (SEMANTICS.md section 6).

  compare-runs.py --losses A.jsonl B.jsonl --steps 10 --loss-tol 2e-2
  compare-runs.py --params A/model.safetensors B/model.safetensors --param-tol 1e-2

Relative errors: |a - b| / |b| per loss, ||a - b|| / ||b|| per tensor.
Exits 1 when any exceeds its tolerance. Needs only numpy.
"""
import argparse
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, {"F32": np.float32, "F64": np.float64,
                                      "I64": np.int64}[info["dtype"]])
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line)["loss"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--losses", nargs=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loss-tol", type=float, default=2e-2)
    ap.add_argument("--params", nargs=2)
    ap.add_argument("--param-tol", type=float, default=1e-2)
    a = ap.parse_args()
    ok = True
    if a.losses:
        x, y = losses(a.losses[0]), losses(a.losses[1])
        if len(x) < a.steps or len(y) < a.steps:
            print("compare: fewer than %d steps (%d, %d)" % (a.steps, len(x), len(y)))
            return 1
        worst = 0.0
        for i in range(a.steps):
            rel = abs(x[i] - y[i]) / abs(y[i])
            worst = max(worst, rel)
            print("compare: step %2d loss %.6f vs %.6f rel %.2e" % (i, x[i], y[i], rel))
        print("compare: losses worst rel %.2e (tolerance %.0e): %s" %
              (worst, a.loss_tol, "PASS" if worst <= a.loss_tol else "FAIL"))
        ok &= worst <= a.loss_tol
    if a.params:
        p, q = read_safetensors(a.params[0]), read_safetensors(a.params[1])
        if sorted(p) != sorted(q):
            print("compare: tensor names differ")
            return 1
        worst, worst_name = 0.0, ""
        for name in sorted(p):
            rel = np.linalg.norm(p[name] - q[name]) / max(np.linalg.norm(q[name]), 1e-30)
            if rel > worst:
                worst, worst_name = rel, name
        print("compare: %d tensors, worst rel %.2e (%s) (tolerance %.0e): %s" %
              (len(p), worst, worst_name, a.param_tol, "PASS" if worst <= a.param_tol else "FAIL"))
        ok &= worst <= a.param_tol
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
