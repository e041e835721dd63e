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


def make_q8_target(config_dir, out_dir):
    """A random-initialised Qwen3-8B-shaped model (transformers, bf16, on the
    GPU) saved in 5 GB shards with model.safetensors.index.json under
    out_dir: layers 0..34 (the last tap, 33, must not be the model's last
    layer, whose hidden_states entry transformers gives after the final
    norm); its config.json then says 36, as the spec does (layers 34 and 35
    are never read). Returns (config, model)."""
    import json
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(config_dir)
    cfg.num_hidden_layers = 35
    if getattr(cfg, "layer_types", None):  # transformers 5 checks it against the count
        cfg.layer_types = cfg.layer_types[:35]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="5GB")
    with open(out_dir + "/config.json") as f:
        saved = json.load(f)
    saved["num_hidden_layers"] = 36
    if "layer_types" in saved:
        saved["layer_types"] = saved["layer_types"][:1] * 36
    with open(out_dir + "/config.json", "w") as f:
        json.dump(saved, f)
    return cfg, model


def write_q8_tokens(path, vocab_size, rows=8, seq=3072):
    """A token shard of qwen3-8b-b16's shape: random ids, every even row
    packed with conversations of 64 to 1536 tokens, the odd rows one
    conversation each. Returns (ids, pos)."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab_size, size=(rows, seq)).astype(np.int32)
    pos = packed_positions(rng, rows, seq, lambda r: r % 2 == 0,
                           lambda g: int(g.integers(64, 1537)))
    meta = {"format": "dflash-token-shard", "format_version": "1", "target": "Qwen/Qwen3-8B",
            "target_layer_ids": "[1, 9, 17, 25, 33]", "hidden_size": "4096",
            "seq_len": str(seq), "packed": "true"}
    save_file({"input_ids": ids, "position_ids": pos,
               "loss_mask": np.ones((rows, seq), dtype=np.uint8),
               "num_tokens": np.full((rows,), seq, dtype=np.int32)}, path, meta)
    return ids, pos


def save_random_decoder(config_dir, out_dir, seed):
    """A small random decoder of config_dir's config.json (transformers,
    bf16), its weights wider than the default init so that every layer
    changes the residual stream, saved with save_pretrained in out_dir.
    Returns (config, model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08 if "embed" not in n else 0.5)
            else:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return cfg, model
