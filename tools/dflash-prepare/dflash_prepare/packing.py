"""Rows of S tokens from conversations (docs/semantics.md section 9).

Unpacked: one conversation per row, right-padded. Packed: conversations one
after another, placed first-fit-decreasing (longest first, ties in a seeded
random order; each into the first row with room, else a new row), so that
rows fill up and a run is reproducible from its inputs and seed.

A row holds `input_ids`, `loss_mask`, `position_ids` (0 at each
conversation's first token, +1 after) and `num_tokens` (the real tokens;
the rest of the row is padding: `pad_id`, loss_mask 0, and positions that
go on counting from the last conversation, so that an unpacked row's
positions are arange(S)).
"""
import random

import numpy as np


class _FirstFit:
    """Rows' free space in a max segment tree: the first row with at least
    `n` free tokens in O(log rows)."""

    def __init__(self, capacity, max_rows):
        self.capacity = capacity
        size = 1
        while size < max(1, max_rows):
            size *= 2
        self.size = size
        self.tree = [capacity] * (2 * size)  # every row, used or not, is empty
        self.used = 0

    def place(self, n):
        if self.tree[1] < n:
            raise ValueError("no row has room")  # max_rows was too small
        node = 1
        while node < self.size:
            node = 2 * node if self.tree[2 * node] >= n else 2 * node + 1
        row = node - self.size
        self.tree[node] -= n
        node //= 2
        while node:
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])
            node //= 2
        self.used = max(self.used, row + 1)
        return row


def pack_order(lengths, seq_len, seed=0):
    """Rows as lists of conversation indices, first-fit-decreasing. Every
    length must be in [1, seq_len]."""
    for i, n in enumerate(lengths):
        if not 1 <= n <= seq_len:
            raise ValueError(f"conversation {i} has {n} tokens, not in [1, {seq_len}]")
    tiebreak = list(range(len(lengths)))
    random.Random(seed).shuffle(tiebreak)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], tiebreak[i]))
    fit = _FirstFit(seq_len, len(lengths))
    rows = []
    for i in order:
        row = fit.place(lengths[i])
        if row == len(rows):
            rows.append([])
        rows[row].append(i)
    return rows


class Rows:
    """R rows of S tokens as numpy arrays."""

    def __init__(self, count, seq_len, pad_id):
        self.input_ids = np.full((count, seq_len), pad_id, dtype=np.int32)
        self.loss_mask = np.zeros((count, seq_len), dtype=np.uint8)
        self.position_ids = np.tile(np.arange(seq_len, dtype=np.int32), (count, 1))
        self.num_tokens = np.zeros(count, dtype=np.int32)
        self.conversations = np.zeros(count, dtype=np.int32)

    def __len__(self):
        return len(self.num_tokens)


def build_rows(sequences, seq_len, pad_id, pack, seed=0):
    """Rows from (ids, mask) pairs of numpy arrays; with `pack` several per
    row, else one per row in the given order."""
    lengths = [len(ids) for ids, _ in sequences]
    layout = pack_order(lengths, seq_len, seed) if pack else [[i] for i in range(len(lengths))]
    if not pack:
        for i, n in enumerate(lengths):
            if not 1 <= n <= seq_len:
                raise ValueError(f"conversation {i} has {n} tokens, not in [1, {seq_len}]")
    rows = Rows(len(layout), seq_len, pad_id)
    for r, members in enumerate(layout):
        at = 0
        for i in members:
            ids, mask = sequences[i]
            n = len(ids)
            rows.input_ids[r, at:at + n] = ids
            rows.loss_mask[r, at:at + n] = mask
            rows.position_ids[r, at:at + n] = np.arange(n, dtype=np.int32)
            at += n
        if members and at < seq_len:
            # padding goes on counting from the last conversation
            last = rows.position_ids[r, at - 1]
            rows.position_ids[r, at:] = np.arange(last + 1, last + 1 + seq_len - at,
                                                  dtype=np.int32)
        rows.num_tokens[r] = at
        rows.conversations[r] = len(members)
    return rows


def conversation_bounds(position_ids, num_tokens):
    """[(start, end)] of the conversations of one row: a new one starts at
    each position 0; the padding from `num_tokens` on is none of them."""
    starts = [int(j) for j in np.flatnonzero(position_ids[:num_tokens] == 0)]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    ends = starts[1:] + [int(num_tokens)]
    return [(s, e) for s, e in zip(starts, ends) if e > s]


def has_anchor_candidate(mask, position_ids=None):
    """Whether a row has a position a with mask[a] and mask[a+1] set and
    a+1 in a's conversation (docs/semantics.md sections 2 and 9)."""
    mask = np.asarray(mask).astype(bool)
    pair = mask[:-1] & mask[1:]
    if position_ids is not None:
        pair &= np.asarray(position_ids)[1:] != 0
    return bool(pair.any())
