"""Token rows of the device scripts (scripts/device-online-target*.sh)."""

import numpy as np


def packed_positions(rng, rows, seq, is_packed, length):
    """position_ids [rows, seq]: row r holds conversations of length(rng)
    tokens end to end where is_packed(r), else one conversation."""
    pos = np.zeros((rows, seq), dtype=np.int32)
    for r in range(rows):
        t = 0
        while t < seq:
            n = min(length(rng) if is_packed(r) else seq, seq - t)
            pos[r, t:t + n] = np.arange(n)
            t += n
    return pos
