#!/usr/bin/env python3
"""Reads an exported drafter checkpoint (docs/semantics.md section 6) with the
small safetensors reader of torch_step.py, checks every tensor name, shape
and dtype and the config.json fields serving engines read, and compares the
tensors with the parameters the runtime fed the step (a step dump of
dflash-reference, which loaded the same checkpoint through the runtime).

  check_export.py CHECKPOINT_DIR STEP_DUMP
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import read_safetensors  # noqa: E402


def dtypes(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def main():
    ckpt, dump = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    path = os.path.join(ckpt, "model.safetensors")
    tensors, _ = read_safetensors(path)
    kinds = dtypes(path)
    fed, _ = read_safetensors(dump)
    problems = []
    for key, want in [("architectures", ["DFlashDraftModel"]), ("model_type", "qwen3"),
                      ("hidden_act", "silu"), ("attention_bias", False),
                      ("tie_word_embeddings", False), ("torch_dtype", "bfloat16")]:
        if cfg.get(key) != want:
            problems.append("config.json %s = %r, want %r" % (key, cfg.get(key), want))
    for key in ["block_size", "num_target_layers", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "rope_theta", "vocab_size",
                "max_position_embeddings", "layer_types"]:
        if key not in cfg:
            problems.append("config.json lacks " + key)
    scaling = cfg.get("rope_scaling")
    if scaling is not None and (scaling.get("rope_type") != "yarn" or
                                not scaling.get("factor", 0) > 1 or
                                not isinstance(scaling.get("original_max_position_embeddings"), int)):
        problems.append("config.json rope_scaling is not transformers' YaRN: %r" % scaling)
    dcfg = cfg.get("dflash_config", {})
    if dcfg.get("block_size", cfg.get("block_size")) != cfg.get("block_size") or \
            "mask_token_id" not in dcfg or "target_layer_ids" not in dcfg:
        problems.append("config.json dflash_config incomplete: %r" % dcfg)
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    want = {"fc.weight": [H, len(dcfg["target_layer_ids"]) * H],
            "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(cfg["num_hidden_layers"]):
        p = "layers.%d." % i
        want.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                     p + "self_attn.q_proj.weight": [nh * d, H], p + "self_attn.k_proj.weight": [nkv * d, H],
                     p + "self_attn.v_proj.weight": [nkv * d, H], p + "self_attn.o_proj.weight": [H, nh * d],
                     p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                     p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                     p + "mlp.down_proj.weight": [H, I]})
    if sorted(tensors) != sorted(want):
        problems.append("tensor names differ: extra %s, missing %s" %
                        (sorted(set(tensors) - set(want)), sorted(set(want) - set(tensors))))
    for name, shape in want.items():
        if name not in tensors:
            continue
        if list(tensors[name].shape) != shape or kinds[name] != "BF16":
            problems.append("%s: %s %s, want %s BF16" % (name, list(tensors[name].shape), kinds[name], shape))
        # Exactly what the runtime handed the step.
        mine = torch.from_numpy(tensors[name])
        theirs = torch.from_numpy(fed["param." + name])
        if not torch.equal(mine, theirs):
            problems.append("%s differs from the runtime's parameter (max %g)" %
                            (name, float((mine - theirs).abs().max())))
    print("export: %d tensors, %d config keys, torch %s: %s" %
          (len(tensors), len(cfg), torch.__version__, "PASS" if not problems else "FAIL"))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
