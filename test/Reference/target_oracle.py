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
                                   num_local_experts), llama (Llama-3
                                   rope scaling, no q/k norms), gpt_oss
                                   (biased attention with sinks, sliding
                                   and full layers, YaRN, clamped SwiGLU
                                   experts in transformers' bf16 layout:
                                   gate_up_proj [E, H, 2I] gate and up
                                   interleaved, down_proj [E, I, H], x @ W)
                                   or gpt_oss_mxfp4 (the same with the
                                   experts as MXFP4 blocks and scales, the
                                   official checkpoints' layout);
                                   DROP: a tensor left out of the checkpoint
  target_oracle.py check DIR OUT   recomputes target_hidden from those files
                                   in float64 and compares it with OUT's
                                   hidden_states (dflash-target-features'
                                   feature shard)

The math follows the Hugging Face decoders (Qwen3, Llama, GptOss): pre-norm
layers, RMSNorm, rotate-half RoPE, grouped causal attention restricted to
each packed conversation, SwiGLU, residual adds; tap i is the residual
stream after decoder layer i. gpt-oss adds q/k/v/o biases, a per-head sink
logit in every softmax's denominator, a sliding window on its sliding
layers, YaRN inverse frequencies with their attention factor on cos and
sin, and a biased router: softmax over the top k logits, each expert's
gate clamped to <= 7, up to [-7, 7], (up + 1) * gate * sigmoid(1.702 gate).
Written apart from the compiler's reference kernels.
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
# gpt-oss: 8 experts of 32 in every layer, 2 a token; a window of 4 (shorter
# than both conversations) on the even layers; YaRN over 64 positions.
CONFIGS["gpt_oss"] = {
    "model_type": "gpt_oss", "hidden_size": HIDDEN, "intermediate_size": 32,
    "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": LAYERS,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention"] * (LAYERS // 2),
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 64},
    "max_position_embeddings": 2048, "attention_bias": True, "swiglu_limit": 7.0,
    "hidden_act": "silu", "tie_word_embeddings": False}
CONFIGS["gpt_oss_mxfp4"] = dict(CONFIGS["gpt_oss"], quantization_config={
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"]})
# E2M1's sixteen codes.
FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


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
    if config["model_type"] == "gpt_oss":
        return gpt_oss_shapes(config, shapes)
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


def gpt_oss_shapes(config, shapes):
    """transformers' GptOss names and its bf16 layout (experts x @ W)."""
    H, I = config["hidden_size"], config["intermediate_size"]
    nh, nkv, d = config["num_attention_heads"], config["num_key_value_heads"], \
        config["head_dim"]
    E = config["num_local_experts"]
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d." % i
        shapes.update({p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.sinks": (nh,),
                       p + "mlp.router.weight": (E, H), p + "mlp.router.bias": (E,),
                       p + "mlp.experts.gate_up_proj": (E, H, 2 * I),
                       p + "mlp.experts.gate_up_proj_bias": (E, 2 * I),
                       p + "mlp.experts.down_proj": (E, I, H),
                       p + "mlp.experts.down_proj_bias": (E, H)})
        for proj, shape in [("q", (nh * d, H)), ("k", (nkv * d, H)),
                            ("v", (nkv * d, H)), ("o", (H, nh * d))]:
            shapes[p + "self_attn.%s_proj.weight" % proj] = shape
            shapes[p + "self_attn.%s_proj.bias" % proj] = shape[:1]
    return shapes


def random_weight(rng, name, shape):
    if name.endswith("sinks"):
        return rng.standard_normal(shape)  # O(1): the sinks matter
    if name.endswith("bias"):
        return 0.1 * rng.standard_normal(shape)
    if len(shape) == 1:
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if "embed" in name or "lm_head" in name:
        return 0.3 * rng.standard_normal(shape)
    return (0.5 if name.endswith("_proj") else 0.08) * rng.standard_normal(shape)


def quantize_experts(config, weights, rng):
    """The official gpt-oss layout: each expert projection as random MXFP4
    "<proj>_blocks" [E, out, in/32, 16] and "<proj>_scales" [E, out, in/32]
    (uint8) in place of the bf16 tensor."""
    E, H, I = config["num_local_experts"], config["hidden_size"], \
        config["intermediate_size"]
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d.mlp.experts." % i
        for proj, rows, cols in [("gate_up_proj", 2 * I, H), ("down_proj", H, I)]:
            weights.pop(p + proj)
            weights[p + proj + "_blocks"] = ("U8", rng.integers(
                0, 256, size=(E, rows, cols // 32, 16)).astype(np.uint8))
            weights[p + proj + "_scales"] = ("U8", rng.integers(
                120, 126, size=(E, rows, cols // 32)).astype(np.uint8))
    return weights


def dequantize_experts(w):
    """An MXFP4 checkpoint's experts in the bf16 layout (x @ W): the
    dequantised [E, out, in] transposed."""
    for name in [n for n in w if n.endswith("_blocks")]:
        base = name[:-len("_blocks")]
        blocks, scales = w.pop(name), w.pop(base + "_scales").astype(np.float64)
        codes = np.stack([blocks & 15, blocks >> 4], -1)  # low nibble first
        values = FP4_VALUES[codes].reshape(blocks.shape[:-1] + (32,))
        values = values * 2.0 ** (scales - 127)[..., None]
        w[base] = values.reshape(blocks.shape[:-2] + (-1,)).transpose(0, 2, 1)
    return w


def make(kind, out, drop=None):
    config = CONFIGS[kind]
    rng = np.random.default_rng(5)
    weights = {}
    for name, shape in weight_shapes(config).items():
        w = random_weight(rng, name, shape)
        if name != drop:
            weights[name] = ("F32", bf16_exact(w))
    if kind.endswith("_fused"):
        weights = fuse_experts(config, weights)
    if kind.endswith("_mxfp4"):
        # Its own generator: the other weights and the tokens as gpt_oss's.
        weights = quantize_experts(config, weights, np.random.default_rng(6))
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
    if rope.get("rope_type") == "yarn":
        factor, original = rope["factor"], rope["original_max_position_embeddings"]

        def correction(rotations):
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = correction(rope["beta_fast"]), correction(rope["beta_slow"])
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # extrapolation's share
        inv = inv / factor * (1 - keep) + inv * keep
    return inv


def attention_factor(config):
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn":
        return 0.1 * math.log(rope["factor"]) + 1
    return 1.0


def rope(x, pos, inv, scale=1.0):
    # x [S, heads, d]; rotate-half; cos and sin times scale.
    angle = pos[:, None].astype(np.float64) * inv[None, :]
    cos = scale * np.concatenate([np.cos(angle)] * 2, -1)[:, None, :]
    sin = scale * np.concatenate([np.sin(angle)] * 2, -1)[:, None, :]
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


def gpt_oss_mlp(config, g, p, h):
    """GptOss: a biased router, softmax over the top k logits (ties: lower
    index), each token through its experts (x @ W, gate and up interleaved)."""
    k, limit = config["num_experts_per_tok"], config["swiglu_limit"]
    logits = h @ g(p + "mlp.router.weight").T + g(p + "mlp.router.bias")
    e = p + "mlp.experts."
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = sorted(range(logits.shape[1]), key=lambda j: (-logits[t, j], j))[:k]
        weights = np.exp(logits[t, chosen] - logits[t, chosen].max())
        weights /= weights.sum()
        for j, weight in zip(chosen, weights):
            gu = h[t] @ g(e + "gate_up_proj")[j] + g(e + "gate_up_proj_bias")[j]
            gate, up = np.minimum(gu[0::2], limit), np.clip(gu[1::2], -limit, limit)
            act = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
            out[t] += weight * (act @ g(e + "down_proj")[j] + g(e + "down_proj_bias")[j])
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
    gpt_oss = config["model_type"] == "gpt_oss"
    # A sliding layer's query i also sees only keys i - j < window.
    windowed = visible & (idx[:, None] - idx[None, :] < config.get("sliding_window", S))
    bias = g if gpt_oss else (lambda name: 0.0)
    taps = []
    for i in range(max(TAPS) + 1):
        p = "model.layers.%d." % i
        a = p + "self_attn."
        h = rms_norm(x, g(p + "input_layernorm.weight"), eps)
        q = (h @ g(a + "q_proj.weight").T + bias(a + "q_proj.bias")).reshape(S, nh, d)
        k = (h @ g(a + "k_proj.weight").T + bias(a + "k_proj.bias")).reshape(S, nkv, d)
        v = (h @ g(a + "v_proj.weight").T + bias(a + "v_proj.bias")).reshape(S, nkv, d)
        if config["model_type"] not in ("llama", "gpt_oss"):
            q = rms_norm(q, g(a + "q_norm.weight"), eps)
            k = rms_norm(k, g(a + "k_norm.weight"), eps)
        scale = attention_factor(config)
        q, k = rope(q, pos, inv, scale), rope(k, pos, inv, scale)
        sliding = config.get("layer_types", [""] * (i + 1))[i] == "sliding_attention"
        out = np.zeros((S, nh, d))
        for head in range(nh):
            kv = head // (nh // nkv)
            scores = q[:, head] @ k[:, kv].T / math.sqrt(d)
            scores = np.where(windowed if sliding else visible, scores, -np.inf)
            # gpt-oss's sink: one more logit in the denominator, no value.
            sink = g(a + "sinks")[head] if gpt_oss else -np.inf
            m = np.maximum(scores.max(-1, keepdims=True), sink)
            prob = np.exp(scores - m)
            prob /= prob.sum(-1, keepdims=True) + np.exp(sink - m)
            out[:, head] = prob @ v[:, kv]
        x = x + out.reshape(S, nh * d) @ g(a + "o_proj.weight").T + bias(a + "o_proj.bias")
        h2 = rms_norm(x, g(p + "post_attention_layernorm.weight"), eps)
        if gpt_oss:
            x = x + gpt_oss_mlp(config, g, p, h2)
        elif sparse_layer(config, i):
            x = x + sparse_mlp(config, g, p, h2)
        else:
            x = x + swiglu_mlp(g, p + "mlp.", h2)
        if i in TAPS:
            taps.append(x)
    return np.concatenate(taps, -1)


def check(directory, features_path, forward=forward, prepare=None):
    """Recomputes target_hidden with `forward` (config, weights, ids, pos of
    one row) from DIR's checkpoint (`prepare` rewrites its tensors first)
    and prints the worst per-token error of OUT's hidden_states; 0 when
    within the bound."""
    config = json.load(open(directory + "/config.json"))
    w = read_safetensors(directory + "/model.safetensors")
    if prepare:
        w = prepare(config, w)
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


def standard_layout(config, w):
    """Each expert's tensors, as forward reads them."""
    return dequantize_experts(w) if config["model_type"] == "gpt_oss" else unfuse_experts(w)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        sys.exit(0)
    sys.exit(check(sys.argv[2], sys.argv[3], prepare=standard_layout))
