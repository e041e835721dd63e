#!/usr/bin/env python3
"""Writes a copy of a feature shard directory whose rows are packed.

    pack_rows.py IN_DIR OUT_DIR COLUMN [COLUMN ...]

Every row gets position_ids that restart at 0 at each COLUMN (docs/semantics.md
section 9), as if conversations began there; tokens, masks, features and
pinned anchors stay as they are, so the same step can be computed packed and
unpacked. Pure numpy (tools/dflash-prepare's reader and writer).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "tools", "dflash-prepare"))
from dflash_prepare import shards  # noqa: E402


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    src, dst, starts = argv[1], argv[2], sorted({int(c) for c in argv[3:]})
    os.makedirs(dst, exist_ok=True)
    for path in shards.list_shards(src):
        shard = shards.SafetensorsFile(path)
        tensors = {name: shards.Tensor(info.dtype, shard.load(name))
                   for name, info in shard.tensors.items()}
        rows, seq_len = tensors["input_ids"].array.shape
        if any(c <= 0 or c >= seq_len for c in starts):
            sys.exit(f"pack_rows.py: columns must lie in (0, {seq_len})")
        row = np.empty(seq_len, dtype=np.int32)
        begin = 0
        for c in starts + [seq_len]:
            row[begin:c] = np.arange(c - begin, dtype=np.int32)
            begin = c
        tensors["position_ids"] = shards.Tensor("I32", np.tile(row, (rows, 1)))
        shards.write_shard(os.path.join(dst, os.path.basename(path)), tensors,
                           metadata=shard.metadata)


if __name__ == "__main__":
    main(sys.argv)
