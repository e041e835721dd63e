"""Acceptance length and accuracy of drafted blocks (docs/semantics.md sections 4
and 10), in numpy: a reference for tests and for checking a trainer's
figures against logits.

Arrays are per block: `predicted` and `labels` [blocks, bs] (argmax and
target token of slot k), `weight` [blocks, bs] (the loss weight w; 0 at
k = 0 and wherever the label is not supervised) and `keep` [blocks].
"""
import numpy as np


def accepted_runs(predicted, labels, weight):
    """run_n: the largest r with w(n, k) > 0 and a correct prediction for
    every 1 <= k <= r (slot 0 is the anchor, never drafted)."""
    good = (np.asarray(weight) > 0) & (np.asarray(predicted) == np.asarray(labels))
    return np.cumprod(good[:, 1:], axis=1).sum(axis=1)


def acceptance_length(predicted, labels, weight, keep):
    """tau = mean over kept blocks of 1 + run_n; 0 blocks kept gives nan."""
    keep = np.asarray(keep).astype(bool)
    if not keep.any():
        return float("nan")
    runs = accepted_runs(predicted, labels, weight)
    return float((1 + runs[keep]).mean())


def accuracy(predicted, labels, weight, keep):
    """sum([argmax == label] * [w > 0]) / sum([w > 0]) over kept blocks."""
    keep = np.asarray(keep).astype(bool)[:, None]
    counted = (np.asarray(weight) > 0) & keep
    if not counted.any():
        return float("nan")
    right = counted & (np.asarray(predicted) == np.asarray(labels))
    return float(right.sum() / counted.sum())


def accuracy_per_position(predicted, labels, weight, keep):
    """Accuracy at each block position k (nan where nothing counts, e.g. k = 0)."""
    keep = np.asarray(keep).astype(bool)[:, None]
    counted = (np.asarray(weight) > 0) & keep
    right = counted & (np.asarray(predicted) == np.asarray(labels))
    total = counted.sum(axis=0).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, right.sum(axis=0) / total, np.nan)
