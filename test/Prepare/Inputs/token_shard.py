"""Writes one small packed token shard for a spec with the tool's own writer:
  token_shard.py SPEC OUT_DIR [--rows R] [--break REASON]
REASON: vocab (a token outside the vocabulary in row 1), candidate (row 0
without two consecutive supervised tokens), positions (row 0's positions
jump). dflash_prepare is imported from PYTHONPATH, which lit sets."""
import argparse
import os

import numpy as np

from dflash_prepare import packing, shards
from dflash_prepare.spec import load_spec

parser = argparse.ArgumentParser()
parser.add_argument("spec")
parser.add_argument("out")
parser.add_argument("--rows", type=int, default=4)
parser.add_argument("--break", dest="broken", choices=["vocab", "candidate", "positions"])
args = parser.parse_args()
spec = load_spec(args.spec)
S = spec.seq_len
rng = np.random.default_rng(0)
sequences, rows = [], []
while len(rows) < args.rows:
    for _ in range(2 * args.rows):
        n = int(rng.integers(4, max(5, S // 2)))
        ids = rng.integers(0, spec.mask_token_id, size=n).astype(np.int32)
        mask = np.zeros(n, dtype=np.uint8)
        mask[n // 2:] = 1
        sequences.append((ids, mask))
    rows = packing.build_rows(sequences, S, 0, pack=True, seed=0)
tensors = {"input_ids": shards.Tensor("I32", rows.input_ids[:args.rows]),
           "loss_mask": shards.Tensor("U8", rows.loss_mask[:args.rows]),
           "num_tokens": shards.Tensor("I32", rows.num_tokens[:args.rows]),
           "position_ids": shards.Tensor("I32", rows.position_ids[:args.rows])}
if args.broken == "vocab":
    tensors["input_ids"].array[1, 2] = spec.vocab_size
elif args.broken == "candidate":
    tensors["loss_mask"].array[0] = 0
elif args.broken == "positions":
    tensors["position_ids"].array[0, 3] += 5
os.makedirs(args.out, exist_ok=True)
shards.write_shard(os.path.join(args.out, "shard-00000.safetensors"), tensors,
                   spec.shard_metadata())
