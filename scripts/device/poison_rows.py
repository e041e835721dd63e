#!/usr/bin/env python3
"""Writes a copy of a feature shard directory with NaN features in chosen rows.

    poison_rows.py IN_DIR OUT_DIR ROW [ROW ...]

ROW counts rows across the shards in file-name order (0-based); each poisoned
row gets one NaN in its hidden_states. Prints the rows as the trainer names
them ("<shard file> row <r>"), one per line, for comparison with its report.
Pure numpy (tools/dflash-prepare's reader and writer), no safetensors needed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tools", "dflash-prepare"))
from dflash_prepare import shards  # noqa: E402


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    src, dst, rows = argv[1], argv[2], sorted({int(r) for r in argv[3:]})
    os.makedirs(dst, exist_ok=True)
    first = 0
    for path in shards.list_shards(src):
        shard = shards.SafetensorsFile(path)
        tensors = {name: shards.Tensor(info.dtype, shard.load(name))
                   for name, info in shard.tensors.items()}
        count = tensors["input_ids"].array.shape[0]
        hidden = tensors["hidden_states"].array
        for row in rows:
            if first <= row < first + count:
                hidden[row - first, 1, 2] = 0x7fc0  # a bf16 quiet NaN
                print(f"{os.path.join(dst, os.path.basename(path))} row {row - first}")
        shards.write_shard(os.path.join(dst, os.path.basename(path)), tensors,
                           metadata=shard.metadata)
        first += count


if __name__ == "__main__":
    main(sys.argv)
