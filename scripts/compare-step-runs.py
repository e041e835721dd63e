#!/usr/bin/env python3
"""Two variants of a trainer, each run twice: medians and loss noise.

  compare-step-runs.py DIR A A2 B B2

reads DIR/<name>.jsonl (train --log) for the four runs and prints each run's
median step time (steps 5 on), its first and last loss, and the largest
relative loss and grad-norm differences over the steps: B against A (the
change), A against A2 and B against B2 (run-to-run noise, which a change
that only rounds differently stays within).
"""

import json
import os
import statistics
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith('{"step')]


def largest(a, b, key):
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b))


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__.strip())
    folder, names = sys.argv[1], sys.argv[2:]
    runs = {}
    for name in names:
        path = os.path.join(folder, name + ".jsonl")
        if not os.path.exists(path):
            print("%s: missing %s" % (name, path))
            continue
        rows = read(path)
        if len(rows) < 6:
            print("%s: only %d steps" % (name, len(rows)))
            continue
        runs[name] = rows
        print("%-14s median step %.1f ms (steps 5..) loss@0 %.5f loss@%d %.5f"
              % (name, statistics.median(r["step_ms"] for r in rows[5:]),
                 rows[0]["loss"], len(rows) - 1, rows[-1]["loss"]))
    if len(runs) < 4:
        sys.exit(1)
    a, a2, b, b2 = names
    for key in ["loss", "grad_norm"]:
        print("%s: %s vs %s %.2e; %s vs %s %.2e; %s vs %s %.2e"
              % (key, b, a, largest(runs[b], runs[a], key), a, a2,
                 largest(runs[a], runs[a2], key), b, b2,
                 largest(runs[b], runs[b2], key)))


if __name__ == "__main__":
    main()
