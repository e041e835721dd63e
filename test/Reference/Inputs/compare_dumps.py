#!/usr/bin/env python3
"""Compares two dflash-reference --dump-step files, tensor by tensor.

    compare_dumps.py A B TOLERANCE

Every tensor of A must be in B with the same dtype and shape, and
||a - b|| / ||b|| <= TOLERANCE (exactly equal where ||b|| is 0). Prints
"gradients: N tensors within TOLERANCE" (N: the gradient tensors) or names
the first tensor that differs and exits 1. Pure Python: the dumps are F64.
"""
import json
import math
import struct
import sys


def read(path):
    data = open(path, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    body = data[8 + size:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F64":
            sys.exit(f"{path}: tensor '{name}' is {info['dtype']}, not F64")
        begin, end = info["data_offsets"]
        values = struct.unpack(f"<{(end - begin) // 8}d", body[begin:end])
        tensors[name] = (info["shape"], values)
    return tensors


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    a, b, tolerance = read(argv[1]), read(argv[2]), float(argv[3])
    for name, (shape, values) in a.items():
        if name not in b or b[name][0] != shape:
            print(f"{name}: {shape} in {argv[1]}, "
                  f"{b[name][0] if name in b else 'absent'} in {argv[2]}")
            return 1
        other = b[name][1]
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(values, other)))
        norm = math.sqrt(sum(y * y for y in other))
        if (norm == 0 and diff != 0) or (norm > 0 and diff / norm > tolerance):
            print(f"{name}: relative difference {diff / norm if norm else diff:.3e}")
            return 1
    gradients = sum(1 for name in a if name.startswith("gradient."))
    print(f"gradients: {gradients} tensors within {argv[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
