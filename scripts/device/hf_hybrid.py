#!/usr/bin/env python3
"""The hybrid targets' CPU reference against transformers, in two halves.

  hf_hybrid.py make OUT            on the GPU machine: small random Qwen3.5
                                   (qwen3_5_text), Qwen3.5-MoE
                                   (qwen3_5_moe_text) and Qwen3-Next targets
                                   of scripts/hybrid-check.toml's shapes
                                   (layers alternating Gated DeltaNet and full
                                   attention), saved with save_pretrained in
                                   bf16, 4 rows of 64 tokens (rows 0 and 1
                                   packed), and transformers' features of each
                                   conversation alone in fp32 (the reference)
                                   and bf16 (its own noise), as
                                   OUT/hybrid-KIND.tar.gz
  hf_hybrid.py compare DIR...      here: dflash-target-features (build-dev) on
                                   each DIR/hybrid-KIND.tar.gz's checkpoint and
                                   rows, fp64 and bf16-stored, against the fp32
                                   reference; one JSON line per target and run

The compiled side here is the CPU reference (dflash-target-features needs
this machine's LLVM); the compiled GPU target is checked by device-check
online-features-hybrid. Needs torch and transformers for `make`, numpy for
`compare`.
"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SPEC = os.path.join(ROOT, "scripts", "hybrid-check.toml")
TAPS, ROWS, SEQ = [1, 2], 4, 64
LAYER_TYPES = ["linear_attention", "full_attention"] * 2
COMMON = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 32, "linear_value_head_dim": 32,
          "linear_conv_kernel_dim": 4, "layer_types": LAYER_TYPES,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                              "partial_rotary_factor": 0.25}}
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
       "shared_expert_intermediate_size": 96}
KINDS = {"qwen3_5_text": dict(COMMON, intermediate_size=256),
         "qwen3_5_moe_text": dict(COMMON, **MOE),
         "qwen3_next": dict(COMMON, intermediate_size=256, norm_topk_prob=True,
                            mlp_only_layers=[0], **MOE)}


def token_rows(vocab):
    """ids and positions [ROWS, SEQ]: rows 0 and 1 pack conversations of
    9..40 tokens."""
    from hf_targets import packed_positions
    rng = np.random.default_rng(4)
    ids = rng.integers(0, vocab - 1, size=(ROWS, SEQ)).astype(np.int32)
    pos = packed_positions(rng, ROWS, SEQ, lambda r: r < 2,
                           lambda g: int(g.integers(9, 41)))
    return ids, pos


def init_weights(model):
    """Wide enough that every layer moves the residual stream, with a decay
    of about e^-0.5 a token so the recurrence reaches back."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(-1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))  # used as is
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))  # zero-centred norms, dt_bias
            elif "conv1d" in name:
                p.normal_(0, 0.5)
            else:
                p.normal_(0, 0.5 if "embed" in name else 0.08)


def make(out):
    import torch
    import transformers
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    os.makedirs(out, exist_ok=True)
    for kind, fields in KINDS.items():
        work = tempfile.mkdtemp()
        folder = os.path.join(work, kind)
        try:
            cfg = AutoConfig.for_model(kind, **fields)
        except (KeyError, ValueError) as e:
            print(json.dumps({"target": kind, "skipped": f"transformers "
                              f"{transformers.__version__} has no {kind}: {e}"}), flush=True)
            continue
        torch.manual_seed(3)
        model = AutoModelForCausalLM.from_config(cfg)
        init_weights(model)
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        ids, pos = token_rows(cfg.vocab_size)
        save_file({"input_ids": ids, "position_ids": pos,
                   "loss_mask": np.ones((ROWS, SEQ), dtype=np.uint8)},
                  os.path.join(folder, "tokens.safetensors"),
                  {"format": "dflash-token-shard", "format_version": "1"})
        refs = {}
        for dtype in (torch.float32, torch.bfloat16):
            m = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).cuda().eval()
            feats = np.zeros((ROWS, SEQ, len(TAPS) * cfg.hidden_size), dtype=np.float32)
            for r in range(ROWS):
                starts = [t for t in range(SEQ) if pos[r, t] == 0] + [SEQ]
                for s, e in zip(starts, starts[1:]):
                    with torch.no_grad():
                        h = m(input_ids=torch.as_tensor(ids[r:r + 1, s:e]).long().cuda(),
                              output_hidden_states=True, use_cache=False).hidden_states
                    feats[r, s:e] = torch.cat([h[l + 1][0] for l in TAPS], -1).float().cpu()
            refs["fp32" if dtype == torch.float32 else "bf16"] = feats
            name = type(m).__name__
            del m
        save_file(refs, os.path.join(folder, "reference.safetensors"))
        whole, token = errors(refs["bf16"], refs["fp32"])
        print(json.dumps({"target": kind, "model": name, "transformers": transformers.__version__,
                          "whole_bf16": whole, "worst_token_bf16": token}), flush=True)
        with tarfile.open(os.path.join(out, f"hybrid-{kind}.tar.gz"), "w:gz") as tar:
            tar.add(folder, arcname=kind)
    return 0


def errors(got, ref):
    """(whole tensor, worst token) relative errors."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    whole = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    token = (np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)).max()
    return float(whole), float(token)


def compare(archives):
    sys.path.insert(0, os.path.join(ROOT, "test", "Reference"))
    from target_oracle import read_safetensors
    binary = os.path.join(ROOT, "build-dev", "bin", "dflash-target-features")
    failed = False
    for archive in archives:
        work = tempfile.mkdtemp()
        with tarfile.open(archive) as tar:
            tar.extractall(work)
        (kind,) = os.listdir(work)
        folder = os.path.join(work, kind)
        refs = read_safetensors(os.path.join(folder, "reference.safetensors"))
        for precision in ("exact", "storage"):
            features = os.path.join(work, precision + ".safetensors")
            rc = subprocess.run([binary, SPEC, "--target", folder, "--rows",
                                 os.path.join(folder, "tokens.safetensors"),
                                 "--precision", precision, "-o", features]).returncode
            if rc != 0:
                print(f"hf_hybrid: {kind}: dflash-target-features exited {rc}", file=sys.stderr)
                failed = True
                continue
            got = read_safetensors(features)["hidden_states"]
            whole, token = errors(got, refs["fp32"])
            whole16, token16 = errors(refs["bf16"], refs["fp32"])
            print(json.dumps({"target": kind, "precision": precision, "whole": whole,
                              "worst_token": token, "whole_bf16": whole16,
                              "worst_token_bf16": token16}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        sys.exit(make(sys.argv[2]))
    if len(sys.argv) >= 3 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2:]))
    sys.exit(__doc__)
