#!/usr/bin/env python3
"""Opens an exported drafter checkpoint with the real libraries: every tensor
docs/semantics.md section 6 lists, with its shape and dtype, through
safetensors.torch.load_file, and config.json through
transformers.Qwen3Config.from_pretrained. Exits 1 on any mismatch.

  check_checkpoint.py DIR
"""
import json
import sys

from safetensors.torch import load_file
import torch
import transformers


def main():
    d = sys.argv[1]
    cfg = json.load(open(d + "/config.json"))
    tensors = load_file(d + "/model.safetensors")
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    L = len(cfg["dflash_config"]["target_layer_ids"])
    want = {"fc.weight": [H, L * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(cfg["num_hidden_layers"]):
        p = "layers.%d." % i
        want.update({
            p + "input_layernorm.weight": [H],
            p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [nh * hd, H],
            p + "self_attn.k_proj.weight": [nkv * hd, H],
            p + "self_attn.v_proj.weight": [nkv * hd, H],
            p + "self_attn.o_proj.weight": [H, nh * hd],
            p + "self_attn.q_norm.weight": [hd],
            p + "self_attn.k_norm.weight": [hd],
            p + "mlp.gate_proj.weight": [I, H],
            p + "mlp.up_proj.weight": [I, H],
            p + "mlp.down_proj.weight": [H, I],
        })
    bad = []
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            bad.append("missing " + name)
        elif list(t.shape) != shape or t.dtype != torch.bfloat16:
            bad.append("%s: %s %s, want %s bf16" % (name, list(t.shape), t.dtype, shape))
    extra = sorted(set(tensors) - set(want))
    if extra:
        bad.append("unexpected tensors: %s" % extra)
    qc = transformers.Qwen3Config.from_pretrained(d)
    for key in ["hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"]:
        if getattr(qc, key) != cfg[key]:
            bad.append("Qwen3Config.%s = %s, config.json %s" % (key, getattr(qc, key), cfg[key]))
    for key in ["architectures", "block_size", "dflash_config"]:
        if key not in cfg:
            bad.append("config.json lacks " + key)
    print("checkpoint %s: %d tensors, transformers %s, Qwen3Config layers %d: %s" %
          (d, len(tensors), transformers.__version__, qc.num_hidden_layers,
           "PASS" if not bad else "FAIL"))
    for b in bad:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
