#!/usr/bin/env python3
"""What packing buys a static-shape step (docs/semantics.md sections 2 and 9).

Draws conversation lengths like real chat data (lognormal, mean about 1,000
tokens, clipped at S; the last 30-70% of each conversation supervised), lays
them out one per row or packed with tools/dflash-prepare's first-fit
decreasing, samples anchors per batch of B rows as the trainer does
(candidates a with a and a+1 supervised and in one conversation, N_eff =
min(N, the batch's most), uniform without replacement) and counts:
  - the share of the N anchor slots per row that are kept;
  - useful draft tokens per step: slots (n, k > 0) with w > 0;
  - useful draft tokens per second at --step-ms (the step has static shapes,
    so its time is the same packed or not: measure it on the H200).

    packing_bench.py [--conversations 4000] [--seq-len 3072] [--anchors 512]
                     [--block-size 16] [--rows 4] [--step-ms 492] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tools", "dflash-prepare"))
from dflash_prepare.packing import build_rows  # noqa: E402


def conversations(count, seq_len, rng):
    sigma = 0.8
    mu = np.log(1000.0) - sigma * sigma / 2  # mean exp(mu + sigma^2 / 2) = 1000
    lengths = np.clip(np.rint(rng.lognormal(mu, sigma, count)), 4, seq_len)
    out = []
    for n in lengths.astype(int):
        prompt = int(n * rng.uniform(0.3, 0.7))
        mask = np.zeros(n, dtype=np.uint8)
        mask[prompt:] = 1
        out.append((np.ones(n, dtype=np.int32), mask))
    return out, lengths


def step_counts(rows, first, B, N, bs, rng):
    """Kept slots and useful draft tokens of the batch rows[first:first+B]."""
    S = rows.loss_mask.shape[1]
    cands = []
    for r in range(first, first + B):
        m, p = rows.loss_mask[r], rows.position_ids[r]
        ok = (m[:-1] == 1) & (m[1:] == 1) & (p[1:] == p[:-1] + 1)
        cands.append(np.flatnonzero(ok))
    n_eff = min(N, max(len(c) for c in cands))
    kept = useful = 0
    for r, c in zip(range(first, first + B), cands):
        draws = min(n_eff, len(c))
        anchors = rng.choice(c, size=draws, replace=False) if draws else []
        m, p = rows.loss_mask[r], rows.position_ids[r]
        kept += draws
        for a in anchors:
            k = np.arange(1, bs)
            t = a + k
            inside = t < S
            t = t[inside]
            useful += int(np.sum((m[t] == 1) & (p[t] == p[a] + k[inside])))
    return kept, useful


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=4000)
    ap.add_argument("--seq-len", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rows", type=int, default=4, help="rows per GPU (B)")
    ap.add_argument("--step-ms", type=float, default=492.0,
                    help="the step's time on the GPU (qwen3-8b-b16, 4 rows: "
                         "bench/RESULTS.md)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    convs, lengths = conversations(a.conversations, a.seq_len, rng)
    print(f"packing bench: {a.conversations} conversations, mean {lengths.mean():.0f} "
          f"tokens (median {np.median(lengths):.0f}, {np.mean(lengths == a.seq_len):.1%} "
          f"clipped at S = {a.seq_len}); N {a.anchors}, bs {a.block_size}, B {a.rows}")
    print(f"{'layout':<10} {'rows':>6} {'steps':>6} {'slots kept':>11} "
          f"{'useful/step':>12} {'useful tokens/s':>16}")
    results = {}
    for pack in (False, True):
        rows = build_rows(convs, a.seq_len, 0, pack, seed=a.seed)
        steps = len(rows) // a.rows
        kept = useful = 0
        for s in range(steps):
            k, u = step_counts(rows, s * a.rows, a.rows, a.anchors, a.block_size, rng)
            kept += k
            useful += u
        share = kept / (steps * a.rows * a.anchors)
        per_step = useful / steps
        per_s = per_step / (a.step_ms / 1000.0)
        results[pack] = (steps, per_step)
        print(f"{'packed' if pack else 'unpacked':<10} {len(rows):>6} {steps:>6} "
              f"{share:>11.1%} {per_step:>12.0f} {per_s:>16.0f}")
    (s0, u0), (s1, u1) = results[False], results[True]
    print(f"packing: {u1 / u0:.2f}x useful draft tokens per step, "
          f"{s0 / s1:.2f}x fewer steps per epoch")


if __name__ == "__main__":
    main()
