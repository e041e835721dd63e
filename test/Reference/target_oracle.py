#!/usr/bin/env python3
"""An independent numpy oracle of the online target's forward.

  target_oracle.py make KIND DIR [DROP]
                                   writes DIR/config.json, DIR/model.safetensors
                                   (random weights, bf16-exact values stored
                                   as F32) and DIR/tokens.safetensors, a token
                                   shard of the spec Inputs/small-online.toml
                                   (two rows of 12 tokens: row 0 packs a
                                   conversation of 5 and one of 7, row 1 is
                                   one conversation)
                                   for KIND qwen3 (q/k norms), qwen3_moe
                                   (its sparse MLPs, one expert tensor per
                                   expert as Hugging Face saves them),
                                   qwen3_moe_fused (the same model in
                                   transformers 5's fused layout:
                                   experts.gate_up_proj [E, 2I, H],
                                   experts.down_proj [E, H, I], and
                                   num_local_experts) or llama (Llama-3
                                   rope scaling, no q/k norms);
                                   DROP: a tensor left out of the checkpoint
  target_oracle.py check DIR OUT   recomputes target_hidden from those files
                                   in float64 and compares it with OUT's
                                   hidden_states (dflash-target-features'
                                   feature shard)

The math follows the Hugging Face decoders (Qwen3, Llama): pre-norm layers,
RMSNorm, rotate-half RoPE, grouped causal attention restricted to each
packed conversation, SwiGLU, residual adds; tap i is the residual stream
after decoder layer i. Written apart from the compiler's reference kernels.
"""

import json
import math
import struct
import sys

import numpy as np

HIDDEN, INTER, LAYERS, VOCAB = 64, 96, 4, 128
TAPS = [1, 2]
CONFIGS = {
    "qwen3": {"model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False},
    "llama": {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS, "num_attention_heads": 4,
              "num_key_value_heads": 1, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
              "hidden_act": "silu", "tie_word_embeddings": False,
              # A short original context: within 12 positions and head_dim 16
              # all three bands of the scaling occur.
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0,
                                  "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64}},
}
# Qwen3-MoE: 8 experts of 32, 2 a token, renormalised; layer 0 dense.
CONFIGS["qwen3_moe"] = dict(CONFIGS["qwen3"], model_type="qwen3_moe", num_experts=8,
                            num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True, decoder_sparse_step=1,
                            mlp_only_layers=[0])
CONFIGS["qwen3_moe_fused"] = {("num_local_experts" if k == "num_experts" else k): v
                              for k, v in CONFIGS["qwen3_moe"].items()}


def expert_count(config):
    return config.get("num_experts", config.get("num_local_experts", 0))


def sparse_layer(config, i):
    return expert_count(config) > 0 and \
        i not in config.get("mlp_only_layers", []) and \
        (i + 1) % config.get("decoder_sparse_step", 1) == 0


def bf16_exact(x):
    """float32 values rounded to bf16 (nearest even), still float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtype={"F32": np.float32, "I32": np.int32,
                                                    "U8": np.uint8,
                                                    "BF16": np.uint16}[entry["dtype"]])
        if entry["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.reshape(entry["shape"])
    return out


def weight_shapes(config):
    H, I = config["hidden_size"], config["intermediate_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim", H // nh)
    # The drafter reads embed and lm_head too; the final norm completes the
    # checkpoint for transformers (no tap reads it).
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], H),
              "lm_head.weight": (config["vocab_size"], H),
              "model.norm.weight": (H,)}
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d." % i
        shapes.update({p + "input_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (nh * d, H),
                       p + "self_attn.k_proj.weight": (nkv * d, H),
                       p + "self_attn.v_proj.weight": (nkv * d, H),
                       p + "self_attn.o_proj.weight": (H, nh * d),
                       p + "post_attention_layernorm.weight": (H,)})
        if sparse_layer(config, i):
            E, I2 = expert_count(config), config["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (E, H)
            for j in range(E):
                e = p + "mlp.experts.%d." % j
                shapes.update({e + "gate_proj.weight": (I2, H),
                               e + "up_proj.weight": (I2, H),
                               e + "down_proj.weight": (H, I2)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (I, H),
                           p + "mlp.up_proj.weight": (I, H),
                           p + "mlp.down_proj.weight": (H, I)})
        if config["model_type"] != "llama":
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
    return shapes


def make(kind, out, drop=None):
    config = CONFIGS[kind]
    rng = np.random.default_rng(5)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = (0.3 if "embed" in name or "lm_head" in name else 0.08) * \
                rng.standard_normal(shape)
        if name != drop:
            weights[name] = ("F32", bf16_exact(w))
    if kind.endswith("_fused"):
        weights = fuse_experts(config, weights)
    with open(out + "/config.json", "w") as f:
        json.dump(config, f)
    write_safetensors(out + "/model.safetensors", weights)
    # Token ids below the mask token (127); the first tokens of each
    # conversation unsupervised.
    ids = rng.integers(0, VOCAB - 1, size=(2, 12)).astype(np.int32)
    pos = np.array([list(range(5)) + list(range(7)), list(range(12))], dtype=np.int32)
    mask = (pos >= 2).astype(np.uint8)
    metadata = {"format": "dflash-token-shard", "format_version": "1", "target": "",
                "target_layer_ids": json.dumps(TAPS), "hidden_size": str(HIDDEN),
                "seq_len": "12", "packed": "true"}
    write_safetensors(out + "/tokens.safetensors",
                      {"input_ids": ("I32", ids), "loss_mask": ("U8", mask),
                       "position_ids": ("I32", pos),
                       "num_tokens": ("I32", np.array([12, 12], dtype=np.int32))},
                      metadata)


def fuse_experts(config, weights):
    """transformers 5's layout: each sparse layer's experts as
    mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and
    mlp.experts.down_proj [E, H, I]."""
    out = {}
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d.mlp.experts." % i
        if not sparse_layer(config, i):
            continue
        E = expert_count(config)
        take = lambda j, proj: weights.pop(p + "%d.%s.weight" % (j, proj))[1]
        out[p + "gate_up_proj"] = ("F32", np.stack(
            [np.concatenate([take(j, "gate_proj"), take(j, "up_proj")]) for j in range(E)]))
        out[p + "down_proj"] = ("F32", np.stack([take(j, "down_proj") for j in range(E)]))
    weights.update(out)
    return weights


def unfuse_experts(w):
    """The per-expert tensors of a fused checkpoint (fuse_experts' inverse)."""
    for name in [n for n in w if n.endswith("mlp.experts.gate_up_proj")]:
        p = name[:-len("gate_up_proj")]
        gate_up, down = w.pop(name), w.pop(p + "down_proj")
        half = gate_up.shape[1] // 2
        for j in range(gate_up.shape[0]):
            w[p + "%d.gate_proj.weight" % j] = gate_up[j, :half]
            w[p + "%d.up_proj.weight" % j] = gate_up[j, half:]
            w[p + "%d.down_proj.weight" % j] = down[j]
    return w


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def inverse_frequencies(config, d):
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    if rope.get("rope_type") == "llama3":
        factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        original = rope["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv
        smooth = (original / wavelength - lo) / (hi - lo)
        scaled = np.where(wavelength > original / lo, inv / factor, inv)
        between = (wavelength <= original / lo) & (wavelength >= original / hi)
        inv = np.where(between, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


def rope(x, pos, inv):
    # x [S, heads, d]; rotate-half.
    angle = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(angle)] * 2, -1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def swiglu_mlp(g, p, h):
    gate, up = h @ g(p + "gate_proj.weight").T, h @ g(p + "up_proj.weight").T
    return (gate / (1 + np.exp(-gate)) * up) @ g(p + "down_proj.weight").T


def sparse_mlp(config, g, p, h):
    """Qwen3-MoE: softmax over the experts, the top k (ties: lower index),
    renormalised when norm_topk_prob, each token through its experts."""
    k = config["num_experts_per_tok"]
    logits = h @ g(p + "mlp.gate.weight").T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = sorted(range(prob.shape[1]), key=lambda e: (-prob[t, e], e))[:k]
        weights = prob[t, chosen]
        if config.get("norm_topk_prob"):
            weights = weights / weights.sum()
        for e, weight in zip(chosen, weights):
            out[t] += weight * swiglu_mlp(g, p + "mlp.experts.%d." % e, h[t:t + 1])[0]
    return out


def forward(config, w, ids, pos):
    H, nh = config["hidden_size"], config["num_attention_heads"]
    nkv = config["num_key_value_heads"]
    d = config.get("head_dim", H // nh)
    eps = config["rms_norm_eps"]
    inv = inverse_frequencies(config, d)
    S = len(ids)
    g = lambda name: w[name].astype(np.float64)
    x = g("model.embed_tokens.weight")[ids]
    # Key j is visible to query i iff j <= i in the same conversation.
    idx = np.arange(S)
    visible = (idx[None, :] <= idx[:, None]) & \
        (pos[:, None] - pos[None, :] == idx[:, None] - idx[None, :])
    taps = []
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d." % i
        h = rms_norm(x, g(p + "input_layernorm.weight"), eps)
        q = (h @ g(p + "self_attn.q_proj.weight").T).reshape(S, nh, d)
        k = (h @ g(p + "self_attn.k_proj.weight").T).reshape(S, nkv, d)
        v = (h @ g(p + "self_attn.v_proj.weight").T).reshape(S, nkv, d)
        if config["model_type"] != "llama":
            q = rms_norm(q, g(p + "self_attn.q_norm.weight"), eps)
            k = rms_norm(k, g(p + "self_attn.k_norm.weight"), eps)
        q, k = rope(q, pos, inv), rope(k, pos, inv)
        out = np.zeros((S, nh, d))
        for head in range(nh):
            kv = head // (nh // nkv)
            scores = q[:, head] @ k[:, kv].T / math.sqrt(d)
            scores = np.where(visible, scores, -np.inf)
            prob = np.exp(scores - scores.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            out[:, head] = prob @ v[:, kv]
        x = x + out.reshape(S, nh * d) @ g(p + "self_attn.o_proj.weight").T
        h2 = rms_norm(x, g(p + "post_attention_layernorm.weight"), eps)
        if sparse_layer(config, i):
            x = x + sparse_mlp(config, g, p, h2)
        else:
            x = x + swiglu_mlp(g, p + "mlp.", h2)
        if i in TAPS:
            taps.append(x)
    return np.concatenate(taps, -1)


def check(directory, features_path):
    config = json.load(open(directory + "/config.json"))
    w = unfuse_experts(read_safetensors(directory + "/model.safetensors"))
    rows = read_safetensors(directory + "/tokens.safetensors")
    got = read_safetensors(features_path)["hidden_states"].astype(np.float64)
    worst = 0.0
    for b in range(rows["input_ids"].shape[0]):
        ref = forward(config, w, rows["input_ids"][b], rows["position_ids"][b])
        for t in range(ref.shape[0]):
            err = np.linalg.norm(got[b, t] - ref[t]) / np.linalg.norm(ref[t])
            worst = max(worst, err)
    ok = worst < 1e-2
    print("%s: worst per-token |out - ref| / |ref| = %.2e (%s, bound 1e-2)"
          % (config["model_type"], worst, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        sys.exit(0)
    sys.exit(check(sys.argv[2], sys.argv[3]))
