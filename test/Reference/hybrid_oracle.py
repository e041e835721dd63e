#!/usr/bin/env python3
"""An independent numpy oracle of a Qwen3.5 / Qwen3-Next hybrid target.

  hybrid_oracle.py make KIND DIR [DROP [SHAPE]]
                                   writes DIR/config.json, DIR/model.safetensors
                                   (random weights, bf16-exact, stored as F32)
                                   and DIR/tokens.safetensors (target_oracle.py's
                                   rows: row 0 packs conversations of 5 and 7,
                                   row 1 is one of 12) for KIND
                                   qwen3_5 (the multimodal checkpoint: the text
                                   config under text_config, its tensors under
                                   model.language_model., a vision tower
                                   beside them; dense MLPs) or
                                   qwen3_next (a flat config; the DeltaNet's
                                   projections fused and interleaved by key-head
                                   group, in_proj_qkvz and in_proj_ba; routed
                                   experts one tensor per expert beside a shared
                                   expert, layer 0 dense); DROP: a tensor (its
                                   checkpoint name) left out, or with SHAPE
                                   (comma-separated) stored misshapen
  hybrid_oracle.py check DIR OUT   recomputes target_hidden in float64 and
                                   compares it with OUT's hidden_states

The math follows transformers' Qwen3.5 and Qwen3-Next text decoders: layers 0
and 1 are Gated DeltaNet (causal depthwise conv of width 4 with SiLU over
q|k|v, L2-normalised q and k, q scaled by dk^-1/2, beta = sigmoid(b),
g = -exp(A_log) softplus(a + dt_bias), the delta rule token by token from a
zero state, RMSNorm of each head times silu(z), out_proj), layer 2 full
attention (q_proj's per-head query and gate, q/k norms, RoPE on the first
quarter of each head, causal attention, times sigmoid(gate), o_proj), every
RMSNorm but the DeltaNet's zero-centred, x * (1 + w). Each conversation
starts at a position 0: the conv and the state restart there. Written apart
from the compiler's reference kernels.
"""

import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from target_oracle import (HIDDEN, TAPS, VOCAB, bf16_exact, check,  # noqa: E402
                           rope, write_safetensors)

TEXT = {"hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "tie_word_embeddings": False, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "full_attention",
                        "linear_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25}}
CONFIGS = {
    "qwen3_5": {"model_type": "qwen3_5", "tie_word_embeddings": False,
                "text_config": dict(TEXT, model_type="qwen3_5_text"),
                "vision_config": {"model_type": "qwen3_5"}},
    "qwen3_next": dict(TEXT, model_type="qwen3_next", num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       norm_topk_prob=True, mlp_only_layers=[0]),
}


def text_config(config):
    return config.get("text_config", config)


def sparse(config, i):
    return config.get("num_experts", 0) > 0 and i not in config.get("mlp_only_layers", [])


def shapes(config):
    """Tensor names and shapes as the checkpoint stores them."""
    c = text_config(config)
    H, nh, nkv, d = c["hidden_size"], c["num_attention_heads"], \
        c["num_key_value_heads"], c["head_dim"]
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    Kd, Vd = Hk * c["linear_key_head_dim"], Hv * c["linear_value_head_dim"]
    K = c["linear_conv_kernel_dim"]
    out = {"embed_tokens.weight": (VOCAB, H), "norm.weight": (H,)}
    for i in range(max(TAPS) + 1):
        p = "layers.%d." % i
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        if c["layer_types"][i] == "linear_attention":
            la = p + "linear_attn."
            if c["model_type"] == "qwen3_next":
                out[la + "in_proj_qkvz.weight"] = (2 * Kd + 2 * Vd, H)
                out[la + "in_proj_ba.weight"] = (2 * Hv, H)
            else:
                out.update({la + "in_proj_qkv.weight": (2 * Kd + Vd, H),
                            la + "in_proj_z.weight": (Vd, H),
                            la + "in_proj_b.weight": (Hv, H),
                            la + "in_proj_a.weight": (Hv, H)})
            out.update({la + "conv1d.weight": (2 * Kd + Vd, 1, K), la + "dt_bias": (Hv,),
                        la + "A_log": (Hv,), la + "norm.weight": (c["linear_value_head_dim"],),
                        la + "out_proj.weight": (H, Vd)})
        else:
            a = p + "self_attn."
            out.update({a + "q_proj.weight": (2 * nh * d, H), a + "k_proj.weight": (nkv * d, H),
                        a + "v_proj.weight": (nkv * d, H), a + "o_proj.weight": (H, nh * d),
                        a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)})
        m = p + "mlp."
        if sparse(c, i):
            E, I2, Is = c["num_experts"], c["moe_intermediate_size"], \
                c["shared_expert_intermediate_size"]
            out[m + "gate.weight"] = (E, H)
            for j in range(E):
                out.update({m + "experts.%d.gate_proj.weight" % j: (I2, H),
                            m + "experts.%d.up_proj.weight" % j: (I2, H),
                            m + "experts.%d.down_proj.weight" % j: (H, I2)})
            out.update({m + "shared_expert.gate_proj.weight": (Is, H),
                        m + "shared_expert.up_proj.weight": (Is, H),
                        m + "shared_expert.down_proj.weight": (H, Is),
                        m + "shared_expert_gate.weight": (1, H)})
        else:
            I = c["intermediate_size"]
            out.update({m + "gate_proj.weight": (I, H), m + "up_proj.weight": (I, H),
                        m + "down_proj.weight": (H, I)})
    return out


def random_weight(rng, name, shape):
    if name.endswith("A_log"):
        return -1.0 + 0.3 * rng.standard_normal(shape)  # decay ~ e^-0.5 a token
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(shape)  # used as is
    if len(shape) == 1:
        return 0.1 * rng.standard_normal(shape)  # zero-centred norms, dt_bias
    if "conv1d" in name:
        return 0.5 * rng.standard_normal(shape)
    if "embed" in name or "lm_head" in name:
        return 0.3 * rng.standard_normal(shape)
    return 0.08 * rng.standard_normal(shape)


def prefix(config):
    return "model.language_model." if "text_config" in config else "model."


def make(kind, out, drop=None, shape=None):
    config = CONFIGS[kind]
    rng = np.random.default_rng(8)
    weights = {prefix(config) + name: ("F32", bf16_exact(random_weight(rng, name, shape)))
               for name, shape in shapes(config).items()}
    if drop and shape:
        weights[drop] = ("F32", np.zeros([int(n) for n in shape.split(",")], np.float32))
    elif drop:
        del weights[drop]
    weights["lm_head.weight"] = ("F32", bf16_exact(0.3 * rng.standard_normal((VOCAB, HIDDEN))))
    if "text_config" in config:  # a vision tower the text model ignores
        weights["model.visual.patch_embed.proj.weight"] = ("F32", np.ones((4, 3), np.float32))
    with open(out + "/config.json", "w") as f:
        json.dump(config, f)
    write_safetensors(out + "/model.safetensors", weights)
    ids = rng.integers(0, VOCAB - 1, size=(2, 12)).astype(np.int32)
    pos = np.array([list(range(5)) + list(range(7)), list(range(12))], dtype=np.int32)
    metadata = {"format": "dflash-token-shard", "format_version": "1", "target": "",
                "target_layer_ids": json.dumps(TAPS), "hidden_size": str(HIDDEN),
                "seq_len": "12", "packed": "true"}
    write_safetensors(out + "/tokens.safetensors",
                      {"input_ids": ("I32", ids), "loss_mask": ("U8", (pos >= 2).astype(np.uint8)),
                       "position_ids": ("I32", pos),
                       "num_tokens": ("I32", np.array([12, 12], dtype=np.int32))}, metadata)


def centred_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1 + w)


def silu(x):
    return x / (1 + np.exp(-x))


def delta_net(c, g, p, h, pos):
    S = h.shape[0]
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    r = Hv // Hk
    if c["model_type"] == "qwen3_next":
        groups = (h @ g(p + "in_proj_qkvz.weight").T).reshape(S, Hk, 2 * dk + 2 * r * dv)
        q, k = groups[..., :dk], groups[..., dk:2 * dk]
        v, z = groups[..., 2 * dk:2 * dk + r * dv], groups[..., 2 * dk + r * dv:]
        qkv = np.concatenate([q.reshape(S, -1), k.reshape(S, -1), v.reshape(S, -1)], -1)
        ba = (h @ g(p + "in_proj_ba.weight").T).reshape(S, Hk, 2 * r)
        b, a = ba[..., :r].reshape(S, Hv), ba[..., r:].reshape(S, Hv)
        z = z.reshape(S, Hv, dv)
    else:
        qkv = h @ g(p + "in_proj_qkv.weight").T
        z = (h @ g(p + "in_proj_z.weight").T).reshape(S, Hv, dv)
        b, a = h @ g(p + "in_proj_b.weight").T, h @ g(p + "in_proj_a.weight").T
    w = g(p + "conv1d.weight")[:, 0, :]  # [C, K]
    conv = np.zeros_like(qkv)
    for t in range(S):
        first = t - pos[t]  # the conversation's first token
        for j in range(K):
            src = t - (K - 1) + j
            if src >= first:
                conv[t] += w[:, j] * qkv[src]
    conv = silu(conv)
    Kd = Hk * dk
    q = conv[:, :Kd].reshape(S, Hk, dk)
    k = conv[:, Kd:2 * Kd].reshape(S, Hk, dk)
    v = conv[:, 2 * Kd:].reshape(S, Hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-b))
    decay = -np.exp(g(p + "A_log")) * np.log1p(np.exp(a + g(p + "dt_bias")))
    out = np.zeros((S, Hv, dv))
    for head in range(Hv):
        kh = head // r
        state = np.zeros((dk, dv))
        for t in range(S):
            if pos[t] == 0:
                state = np.zeros((dk, dv))
            state = state * np.exp(decay[t, head])
            delta = beta[t, head] * (v[t, head] - k[t, kh] @ state)
            state = state + np.outer(k[t, kh], delta)
            out[t, head] = q[t, kh] @ state
    normed = out / np.sqrt(np.mean(out * out, -1, keepdims=True) + c["rms_norm_eps"])
    y = normed * g(p + "norm.weight") * silu(z)
    return y.reshape(S, Hv * dv) @ g(p + "out_proj.weight").T


def gated_attention(c, g, p, h, pos):
    S, nh, nkv, d = h.shape[0], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    rope_params = c["rope_parameters"]
    rd = int(d * rope_params["partial_rotary_factor"])
    inv = 1.0 / rope_params["rope_theta"] ** (np.arange(0, rd, 2) / rd)
    qg = (h @ g(p + "q_proj.weight").T).reshape(S, nh, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(S, nh * d)
    q = centred_norm(q, g(p + "q_norm.weight"), eps)
    k = centred_norm((h @ g(p + "k_proj.weight").T).reshape(S, nkv, d), g(p + "k_norm.weight"), eps)
    v = (h @ g(p + "v_proj.weight").T).reshape(S, nkv, d)
    q = np.concatenate([rope(q[..., :rd], pos, inv), q[..., rd:]], -1)
    k = np.concatenate([rope(k[..., :rd], pos, inv), k[..., rd:]], -1)
    idx = np.arange(S)
    visible = (idx[None, :] <= idx[:, None]) & \
        (pos[:, None] - pos[None, :] == idx[:, None] - idx[None, :])
    out = np.zeros((S, nh, d))
    for head in range(nh):
        kv = head // (nh // nkv)
        scores = np.where(visible, q[:, head] @ k[:, kv].T / math.sqrt(d), -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, head] = (prob / prob.sum(-1, keepdims=True)) @ v[:, kv]
    gated = out.reshape(S, nh * d) / (1 + np.exp(-gate))
    return gated @ g(p + "o_proj.weight").T


def swiglu(g, p, h):
    gate, up = h @ g(p + "gate_proj.weight").T, h @ g(p + "up_proj.weight").T
    return (silu(gate) * up) @ g(p + "down_proj.weight").T


def moe(c, g, p, h):
    logits = h @ g(p + "gate.weight").T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = sorted(range(prob.shape[1]), key=lambda e: (-prob[t, e], e))
        chosen = chosen[:c["num_experts_per_tok"]]
        weights = prob[t, chosen] / prob[t, chosen].sum()
        for e, weight in zip(chosen, weights):
            out[t] += weight * swiglu(g, p + "experts.%d." % e, h[t:t + 1])[0]
    shared_gate = 1 / (1 + np.exp(-(h @ g(p + "shared_expert_gate.weight").T)))
    return out + shared_gate * swiglu(g, p + "shared_expert.", h)


def forward(config, w, ids, pos):
    c, pre = text_config(config), prefix(config)
    g = lambda name: w[pre + name].astype(np.float64)  # noqa: E731
    eps = c["rms_norm_eps"]
    x = g("embed_tokens.weight")[ids]
    taps = []
    for i in range(max(TAPS) + 1):
        p = "layers.%d." % i
        h = centred_norm(x, g(p + "input_layernorm.weight"), eps)
        if c["layer_types"][i] == "linear_attention":
            x = x + delta_net(c, g, p + "linear_attn.", h, pos)
        else:
            x = x + gated_attention(c, g, p + "self_attn.", h, pos)
        h2 = centred_norm(x, g(p + "post_attention_layernorm.weight"), eps)
        x = x + (moe(c, g, p + "mlp.", h2) if sparse(c, i) else swiglu(g, p + "mlp.", h2))
        if i in TAPS:
            taps.append(x)
    return np.concatenate(taps, -1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(*sys.argv[2:6])
        sys.exit(0)
    sys.exit(check(sys.argv[2], sys.argv[3], forward=forward))
