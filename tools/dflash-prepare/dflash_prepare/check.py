"""`dflash-prepare check`: every row of a shard directory against a spec.

What the trainer needs of each row, so that a bad row is found before a long
run rather than at its step 7: the metadata the C++ reader compares with its
spec, dtypes and shapes, token ids inside the vocabulary and not the mask
token, 0/1 flags, finite features that are zero on padding, at least one
anchor candidate (two consecutive supervised tokens, in one conversation for
packed rows), and packed positions that make sense (0 at the start, +1 inside
a conversation, a restart only to 0, padding only at the end with loss_mask
0). Token shards and feature shards are told apart by `hidden_states`.
"""
import json
import os
import sys

import numpy as np

from . import shards
from .errors import UserError


class CheckResult:
    def __init__(self):
        self.problems = []        # (file, row or None, reason)
        self.bad_rows = set()     # (file, row)
        self.bad_files = set()
        self.rows = 0
        self.files = 0
        self.checked = 0          # shard files given, readable or not
        self.kinds = {}           # file -> "tokens" or "features"

    def file_problem(self, path, reason):
        self.problems.append((path, None, reason))
        self.bad_files.add(path)

    def row_problem(self, path, row, reason):
        self.problems.append((path, int(row), reason))
        self.bad_rows.add((path, int(row)))


def print_problems(result, stream):
    """Each row's problems, and each file problem once: a mismatch that many
    shards share (a spec that is not theirs) is one line with their count."""
    files = {}  # reason -> the files that have it, in order
    for path, row, reason in result.problems:
        if row is None:
            files.setdefault(reason, []).append(path)
    printed = set()
    for path, row, reason in result.problems:
        if row is not None:
            print(f"{path}: row {row}: {reason}", file=stream)
        elif reason not in printed:
            printed.add(reason)
            paths = files[reason]
            if len(paths) == 1:
                print(f"{path}: {reason}", file=stream)
            else:
                print(f"{paths[0]} and {len(paths) - 1} more: {reason} ({len(paths)} of "
                      f"{result.checked} shards)", file=stream)


def _shape_text(shape, rows):
    """A shape with its leading row count written `rows`: the same text for
    every shard."""
    dims = [str(d) for d in shape]
    if shape and shape[0] == rows:
        dims[0] = "rows"
    return "[" + ", ".join(dims) + "]"


def _expect(result, shard, name, dtype, shape):
    info = shard.tensors.get(name)
    if info is None:
        result.file_problem(shard.path, f"has no tensor '{name}'")
        return False
    if info.dtype != dtype:
        result.file_problem(shard.path, f"tensor '{name}' has dtype {info.dtype} "
                                        f"but the spec needs {dtype}")
        return False
    if info.shape != shape:
        rows = shape[0]
        result.file_problem(shard.path, f"tensor '{name}' has shape "
                                        f"{_shape_text(info.shape, rows)} but the spec needs "
                                        f"{_shape_text(shape, rows)}")
        return False
    return True


def _shown(value, limit=60):
    """A metadata value for a message: a long one (a chat template, a
    corrupt field) cut, saying how long it is."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} characters)"


def _check_metadata(result, shard, spec):
    ok = True
    meta = shard.metadata
    for key, wanted in spec.shard_metadata().items():
        value = meta.get(key)
        if value is None:
            result.file_problem(shard.path, f"metadata has no '{key}'")
            ok = False
            continue
        if key == "target_layer_ids":
            try:
                same = json.loads(value) == spec.layer_ids
            except (ValueError, RecursionError):
                result.file_problem(shard.path, f"metadata 'target_layer_ids' "
                                                f"('{_shown(value)}') is not a json list "
                                                "of integers")
                ok = False
                continue
        elif key in ("hidden_size", "seq_len"):
            same = value.strip() == wanted
        else:
            same = value == wanted
        if not same:
            result.file_problem(shard.path, f"metadata '{key}' is '{_shown(value)}' but "
                                            f"{spec.path} needs '{wanted}'")
            ok = False
    # Written by `tokens` (and carried into feature shards) though the trainer
    # does not read them: a shard made for another vocabulary or mask token.
    # Absent in shards of other writers, which the rows' checks then cover.
    for key, wanted in (("vocab_size", spec.vocab_size),
                        ("mask_token_id", spec.mask_token_id)):
        value = meta.get(key)
        if value is not None and value.strip() != str(wanted):
            result.file_problem(shard.path, f"metadata '{key}' is '{_shown(value)}' but "
                                            f"{spec.path} needs '{wanted}'")
            ok = False
    return ok


def _first(flags):
    """Index of the first True, for messages."""
    return int(np.flatnonzero(flags)[0])


def check_shard(result, path, spec, expect=None):
    try:
        shard = shards.SafetensorsFile(path)
    except shards.ShardError as error:
        result.file_problem(path, str(error).split(": ", 1)[-1])
        return
    result.files += 1
    kind = "features" if "hidden_states" in shard.tensors else "tokens"
    result.kinds[path] = kind
    if expect and kind != expect:
        result.file_problem(path, f"is a {'feature' if kind == 'features' else 'token'} "
                                  f"shard, not a {expect[:-1]} shard")
        return
    _check_metadata(result, shard, spec)  # reported; the rows are still checked
    info = shard.tensors.get("input_ids")
    if info is None:
        result.file_problem(path, "has no tensor 'input_ids'")
        return
    if len(info.shape) != 2:
        result.file_problem(path, f"tensor 'input_ids' has shape {info.shape} but "
                                  f"the spec needs [rows, {spec.seq_len}]")
        return
    R, S, N = info.shape[0], spec.seq_len, spec.anchors_per_row
    ok = _expect(result, shard, "input_ids", "I32", [R, S])
    ok = _expect(result, shard, "loss_mask", "U8", [R, S]) and ok
    if kind == "features":
        ok = _expect(result, shard, "hidden_states", "BF16", [R, S, spec.context_width]) and ok
    packed = "position_ids" in shard.tensors
    if packed:
        ok = _expect(result, shard, "position_ids", "I32", [R, S]) and ok
    if "num_tokens" in shard.tensors:
        ok = _expect(result, shard, "num_tokens", "I32", [R]) and ok
    pinned = "anchors" in shard.tensors or "keep" in shard.tensors
    if pinned:
        ok = _expect(result, shard, "anchors", "I32", [R, N]) and ok
        ok = _expect(result, shard, "keep", "U8", [R, N]) and ok
    if not ok:
        return
    result.rows += R

    ids = shard.load("input_ids")
    mask = shard.load("loss_mask")
    lengths = shard.load("num_tokens").astype(np.int64) if "num_tokens" in shard.tensors \
        else np.full(R, S, dtype=np.int64)
    positions = shard.load("position_ids") if packed else None
    column = np.arange(S)

    for r in range(R):
        bad = lambda reason: result.row_problem(path, r, reason)
        n = int(lengths[r])
        if not 0 <= n <= S:
            bad(f"num_tokens is {n}, outside [0, {S}]")
            n = S
        row_ids, row_mask = ids[r], mask[r]
        outside = (row_ids < 0) | (row_ids >= spec.vocab_size)
        if outside.any():
            c = _first(outside)
            bad(f"input_ids has token {int(row_ids[c])} at column {c}, outside the "
                f"vocabulary of {spec.vocab_size} tokens")
        is_mask = (row_ids == spec.mask_token_id) & (column < n)
        if is_mask.any():
            bad(f"input_ids has the mask token {spec.mask_token_id} at column "
                f"{_first(is_mask)} (the drafter could not tell it from a masked slot)")
        if (row_mask > 1).any():
            c = _first(row_mask > 1)
            bad(f"loss_mask has value {int(row_mask[c])} at column {c} (flags are 0 or 1)")
        supervised = row_mask == 1
        if supervised[n:].any():
            bad(f"loss_mask is 1 in the padding, at column {n + _first(supervised[n:])} "
                f"(num_tokens {n})")
        pair = supervised[:-1] & supervised[1:]
        if packed:
            p = positions[r].astype(np.int64)
            if p[0] != 0:
                bad(f"position_ids start at {int(p[0])}, not 0")
            step = p[1:n] - p[:max(n - 1, 0)]  # n 0: no step
            wrong = (step != 1) & (p[1:n] != 0)
            if wrong.any():
                c = _first(wrong) + 1
                bad(f"position_ids go from {int(p[c - 1])} to {int(p[c])} at column {c} "
                    "(neither +1 nor a restart at 0)")
            pair &= p[1:] != 0
        if not pair.any():
            bad("no anchor candidate: fewer than 2 consecutive supervised tokens"
                + (" within one conversation" if packed else ""))
        if pinned:
            keep = shard.array("keep")[r]
            anchors = shard.array("anchors")[r].astype(np.int64)
            if (keep > 1).any():
                bad(f"keep has value {int(keep[_first(keep > 1)])} at slot "
                    f"{_first(keep > 1)} (flags are 0 or 1)")
            kept = anchors[keep == 1]
            if ((kept < 0) | (kept > S - 2)).any():
                bad(f"anchors has {int(kept[_first((kept < 0) | (kept > S - 2))])} "
                    f"outside [0, {S - 2}]")
            if (np.diff(kept) <= 0).any():
                bad("anchors are not strictly ascending over the kept slots")
        if kind == "features":
            hidden = shard.array("hidden_states")[r]
            nonfinite = shards.bf16_nonfinite(hidden)
            if nonfinite.any():
                flat = _first(nonfinite.reshape(-1))
                bad(f"hidden_states is not finite at column {flat // spec.context_width}, "
                    f"feature {flat % spec.context_width}")
            if n < S and (hidden[n:] & 0x7FFF).any():  # -0.0 counts as zero
                c = n + _first((hidden[n:] & 0x7FFF).any(axis=1))
                bad(f"hidden_states is not zero on the padding, at column {c} "
                    f"(num_tokens {n})")


def check_paths(paths, spec, expect=None):
    result = CheckResult()
    result.checked = len(paths)
    for path in paths:
        check_shard(result, path, spec, expect)
    kinds = set(result.kinds.values())
    if len(kinds) > 1:
        result.file_problem(os.path.dirname(paths[0]) or ".",
                            "holds both token shards and feature shards")
    return result


def run(args):
    from .spec import load_spec
    spec = load_spec(args.spec)
    paths = shards.list_shards(args.directory)
    if not paths:
        raise UserError(f"{args.directory}: has no *.safetensors shards")
    result = check_paths(paths, spec)
    print_problems(result, sys.stdout)
    kinds = sorted(set(result.kinds.values()))
    kind = {"tokens": "token", "features": "feature"}
    what = "/".join(kind[k] for k in kinds) or "unreadable"
    summary = (f"check: {args.directory}: {len(paths)} {what} shard(s), "
               f"{result.rows} rows against {spec.path}")
    if result.problems:
        print(f"{summary}: {len(result.bad_rows)} bad row(s), "
              f"{len(result.bad_files)} bad file(s): FAIL")
        return 1
    print(f"{summary}: OK")
    return 0
