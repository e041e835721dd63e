"""Checks the per-bucket figures of dflash-reference's JSON lines (docs/
semantics.md section 14): every step line and the eval line carry NB values
of tau_by_bucket, acc_by_bucket and blocks_by_bucket (null where a bucket had
no kept block), tau weighted by each bucket's kept blocks is the line's tau,
and every bucket saw kept blocks in the run and in the evaluation.

  check_buckets.py JSONL NB"""
import json
import math
import sys


def check(line, prefix, nb, seen):
    taus = line[prefix + "tau_by_bucket"]
    accs = line[prefix + "acc_by_bucket"]
    blocks = line[prefix + "blocks_by_bucket"]
    where = f"step {line['step']}{' (eval)' if prefix else ''}"
    if not len(taus) == len(accs) == len(blocks) == nb:
        sys.exit(f"{where}: {len(taus)}, {len(accs)}, {len(blocks)} values, not {nb}")
    for j, (t, a, b) in enumerate(zip(taus, accs, blocks)):
        if b == 0:
            if t is not None:
                sys.exit(f"{where}: bucket {j} has no block but tau {t}")
            continue
        seen[prefix][j] += b
        if not (1 <= t and (a is None or 0 <= a <= 1)):
            sys.exit(f"{where}: bucket {j} out of range: tau {t}, acc {a}")
    weighted = sum(t * b for t, b in zip(taus, blocks) if b) / sum(blocks)
    # The values are printed with 6 significant digits.
    if not math.isclose(weighted, line[prefix + "tau"], rel_tol=1e-5):
        sys.exit(f"{where}: weighted tau {weighted} but {prefix}tau {line[prefix + 'tau']}")


def main():
    path, nb = sys.argv[1], int(sys.argv[2])
    seen = {"": [0] * nb, "eval_": [0] * nb}
    lines = {"": 0, "eval_": 0}
    with open(path) as f:
        for text in f:
            line = json.loads(text)
            prefix = "eval_" if "eval_tau" in line else ""
            check(line, prefix, nb, seen)
            lines[prefix] += 1
    for prefix, blocks in seen.items():
        if lines[prefix] and min(blocks) == 0:
            sys.exit(f"{prefix or 'step'} lines: a bucket never saw a block: {blocks}")
    print(f"buckets: {lines['']} step lines and {lines['eval_']} eval lines of {nb} "
          "buckets, every bucket seen, weighted tau = tau")


main()
