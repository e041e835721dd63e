"""Rewrites dflash-synth feature shards with the tool's own writer, adding
the tensors a packed shard has (position_ids = arange(S): one conversation
a row, the same rows; num_tokens = S):
  repack_synth.py IN_DIR OUT_DIR
dflash_prepare is imported from PYTHONPATH, which lit sets."""
import os
import sys

import numpy as np

from dflash_prepare import shards

source, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for path in shards.list_shards(source):
    shard = shards.SafetensorsFile(path)
    tensors = {name: shards.Tensor(info.dtype, shard.load(name))
               for name, info in shard.tensors.items()}
    R, S = shard.tensors["input_ids"].shape
    tensors["position_ids"] = shards.Tensor("I32", np.tile(np.arange(S, dtype=np.int32), (R, 1)))
    tensors["num_tokens"] = shards.Tensor("I32", np.full(R, S, dtype=np.int32))
    shards.write_shard(os.path.join(out, os.path.basename(path)), tensors, shard.metadata)
print(f"repacked {len(shards.list_shards(out))} shard(s)")
