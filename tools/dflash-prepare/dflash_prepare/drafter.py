"""An exported DFlash drafter (docs/semantics.md section 6) drafting one block at
inference, in PyTorch, written from docs/semantics.md sections 3 and 9:

- the context is the target's tapped features of every position before the
  anchor, `RMSNorm_hidden(features @ fc^T)`, whose keys and values each
  layer keeps (`Context`), since they never change;
- the block is the anchor's token then `bs - 1` mask tokens at positions
  `anchor .. anchor + bs - 1`;
- a full layer's query sees every context key and its whole block; a
  sliding layer's sees the context keys `j >= anchor + k - (W - 1)` and its
  block's slots `k' <= k`;
- slot `k` predicts the token at position `anchor + k`.
The shared `embed` and `lm_head` are the target's.

A DFlash2 drafter (section 13) adds a grouped convolution around each
sublayer, is bidirectional inside its block at every layer, and proposes by
the greedy walk with its selector: at slot `k` the top-K of the unary
logits re-ranked by `z . S[c_j]`, `z = P[p] * (y @ Wh^T)`, `p` the anchor's
token at `k = 1` and the token chosen at `k - 1` after it.
"""
import json
import os

import numpy as np

from .errors import UserError
from .shards import ShardError, SafetensorsFile


def _read_config(directory):
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None
    except ValueError as error:
        raise UserError(f"{path}: not json ({error})") from None
    architectures = config.get("architectures") or []
    if not {"DFlashDraftModel", "DFlash2DraftModel"} & set(architectures):
        raise UserError(f"{path}: architectures is {architectures!r}, not "
                        "[\"DFlashDraftModel\"] or [\"DFlash2DraftModel\"]: not an exported "
                        "DFlash drafter")
    dflash = config.get("dflash_config") or {}
    keys = ["mask_token_id", "target_layer_ids"]
    if "DFlash2DraftModel" in architectures:
        keys += ["conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"]
    for key, value in [("block_size", config.get("block_size"))] + [
            ("dflash_config." + key, dflash.get(key)) for key in keys]:
        if value is None:
            raise UserError(f"{path}: has no '{key}'")
    return config


def rope_frequencies(config, d, theta, torch, device, directory):
    """(inverse frequencies [d/2] in fp32, the factor cos and sin are scaled
    by): theta's, or YaRN's where config.json has `rope_scaling` (or
    transformers 5's `rope_parameters`) of rope_type "yarn"
    (docs/semantics.md section 14, computed as transformers' Qwen3 does)."""
    import math
    base = theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return 1.0 / base, 1.0
    if kind != "yarn":
        raise UserError(f"{directory}/config.json: rope_scaling.rope_type {kind!r} is not "
                        "\"yarn\", the one scaling a DFlash drafter has")
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    fast, slow = float(scaling.get("beta_fast", 32)), float(scaling.get("beta_slow", 1))
    attention = scaling.get("attention_factor")
    attention = 0.1 * math.log(factor) + 1.0 if attention is None else float(attention)

    def dimension(rotations):  # where `rotations` turns fit the original positions
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = dimension(fast), dimension(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, device=device, dtype=torch.float32) - low) /
            (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # 1: the original frequency, 0: divided by factor
    inverse = (1.0 / (factor * base)) * (1 - extrapolated) + (1.0 / base) * extrapolated
    return inverse, attention


class Context:
    """Each layer's context keys and values, position by position."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.keys = [[] for _ in drafter.layers]
        self.values = [[] for _ in drafter.layers]
        self.length = 0

    def append(self, features):
        """Adds the target's tapped features [n, L*H] of the next n positions."""
        d = self.drafter
        torch = d.torch
        features = features.to(d.dtype)
        ctx = d.rms_norm(features @ d.fc.T, d.hidden_norm)
        positions = torch.arange(self.length, self.length + len(features), device=d.device)
        for i, layer in enumerate(d.layers):
            k = d.rms_norm((ctx @ layer["k"].T).view(len(ctx), d.kv_heads, d.head_dim),
                           layer["k_norm"])
            self.keys[i].append(d.rope(k, positions))
            self.values[i].append((ctx @ layer["v"].T).view(len(ctx), d.kv_heads, d.head_dim))
        self.length += len(features)

    def layer(self, i):
        torch = self.drafter.torch
        if len(self.keys[i]) > 1:  # concatenated once, then kept whole
            self.keys[i] = [torch.cat(self.keys[i])]
            self.values[i] = [torch.cat(self.values[i])]
        return self.keys[i][0], self.values[i][0]


class Drafter:
    def __init__(self, directory, embed, lm_head, torch, device, dtype):
        self.torch, self.device, self.dtype = torch, device, dtype
        config = _read_config(directory)
        self.config = config
        self.block_size = int(config["block_size"])
        self.mask_token_id = int(config["dflash_config"]["mask_token_id"])
        self.target_layer_ids = list(config["dflash_config"]["target_layer_ids"])
        H = self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config["num_key_value_heads"])
        self.head_dim = int(config["head_dim"])
        self.eps = float(config["rms_norm_eps"])
        self.theta = float(config["rope_theta"])
        n_layers = int(config["num_hidden_layers"])
        kinds = config.get("layer_types") or ["full_attention"] * n_layers
        window = int(config.get("sliding_window") or 0)
        self.windows = [window if kind == "sliding_attention" else 0 for kind in kinds]
        if any(kind == "sliding_attention" for kind in kinds) and window <= 0:
            raise UserError(f"{directory}/config.json: a sliding layer but no sliding_window")
        path = os.path.join(directory, "model.safetensors")
        try:
            weights = SafetensorsFile(path)
        except ShardError as error:
            raise UserError(str(error)) from None
        dflash = config["dflash_config"]
        self.dflash2 = "DFlash2DraftModel" in config["architectures"]
        if self.dflash2:
            self.conv_taps = int(dflash["conv_kernel_size"])
            self.conv_group = int(dflash["conv_group_size"])
            self.top_k = int(dflash["selector_top_k"])
            self.multiplier = float(dflash.get("output_multiplier") or 1.0)
            self.softcap = float(dflash.get("final_logit_softcapping") or 0.0)
            self.embedding_scale = float(dflash.get("input_embedding_scale") or 1.0)
            if self.conv_group <= 0 or H % self.conv_group:
                raise UserError(f"{directory}/config.json: dflash_config.conv_group_size "
                                f"{self.conv_group} does not divide hidden_size {H}")
            # Every layer sees its whole block (within its window).
            self.windows_causal = False
        else:
            self.windows_causal = True
        L, I = len(self.target_layer_ids), int(config["intermediate_size"])
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim

        def tensor(name, shape):
            info = weights.tensors.get(name)
            if info is None:
                raise UserError(f"{path}: has no tensor '{name}'")
            if list(info.shape) != list(shape) or info.dtype not in ("BF16", "F32"):
                raise UserError(f"{path}: '{name}' is {info.dtype} {info.shape}, want "
                                f"BF16 {list(shape)}")
            array = weights.load(name)
            if info.dtype == "BF16":
                array = (array.astype(np.uint32) << 16).view(np.float32)
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, dtype)

        self.fc = tensor("fc.weight", [H, L * H])
        self.hidden_norm = tensor("hidden_norm.weight", [H])
        self.norm = tensor("norm.weight", [H])
        self.layers = []
        for i in range(n_layers):
            p = f"layers.{i}."
            self.layers.append({
                "input_norm": tensor(p + "input_layernorm.weight", [H]),
                "post_norm": tensor(p + "post_attention_layernorm.weight", [H]),
                "q": tensor(p + "self_attn.q_proj.weight", [q, H]),
                "k": tensor(p + "self_attn.k_proj.weight", [kv, H]),
                "v": tensor(p + "self_attn.v_proj.weight", [kv, H]),
                "o": tensor(p + "self_attn.o_proj.weight", [H, q]),
                "q_norm": tensor(p + "self_attn.q_norm.weight", [self.head_dim]),
                "k_norm": tensor(p + "self_attn.k_norm.weight", [self.head_dim]),
                "gate": tensor(p + "mlp.gate_proj.weight", [I, H]),
                "up": tensor(p + "mlp.up_proj.weight", [I, H]),
                "down": tensor(p + "mlp.down_proj.weight", [H, I]),
            })
        if self.dflash2:
            kc, G, r = self.conv_taps, H // self.conv_group, int(dflash["selector_rank"])
            V = int(tuple(lm_head.shape)[0])
            for i, layer in enumerate(self.layers):
                for conv in ("attention_conv", "mlp_conv"):
                    p = f"layers.{i}.{conv}."
                    layer[conv] = (tensor(p + "base_kernel", [2, kc, H]),
                                   tensor(p + "kernel_projection.weight", [2 * kc * G, H]))
            p = "candidate_selector."
            self.hidden_projection = tensor(p + "hidden_projection.weight", [r, H])
            self.predecessor_codebook = tensor(p + "predecessor_codebook", [V, r])
            self.successor_codebook = tensor(p + "successor_codebook", [V, r])
            if not 0 < self.top_k <= V:
                raise UserError(f"{directory}/config.json: dflash_config.selector_top_k "
                                f"{self.top_k} is not in 1..{V}")
        if tuple(embed.shape)[1] != H or tuple(lm_head.shape)[1] != H:
            raise UserError(f"{directory}: the drafter's hidden size {H} is not the "
                            f"target's ({tuple(embed.shape)[1]})")
        self.embed = embed.to(device, dtype)
        self.lm_head = lm_head.to(device, dtype)
        self.inverse_frequencies, self.attention_factor = rope_frequencies(
            config, self.head_dim, self.theta, torch, device, directory)

    def rms_norm(self, x, weight):
        xf = x.float()
        y = xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * weight.float()).to(self.dtype)

    def rope(self, x, positions):
        """Rotate-half RoPE of x [n, heads, d] at `positions` [n], fp32 angles."""
        torch = self.torch
        angles = positions.float()[:, None] * self.inverse_frequencies
        cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None] * self.attention_factor
        sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None] * self.attention_factor
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x.float() * cos + rotated.float() * sin).to(self.dtype)

    def context(self):
        return Context(self)

    def visible(self, window, anchor):
        """[bs, anchor + bs] bool: what each slot of a block at `anchor` sees
        of the context (positions 0 .. anchor - 1) and of its block."""
        torch, bs = self.torch, self.block_size
        k = torch.arange(bs, device=self.device)[:, None]
        j = torch.arange(anchor, device=self.device)[None, :]
        if window:
            context = j >= anchor + k - (window - 1)
            block = torch.arange(bs, device=self.device)[None, :] <= k
            if not self.windows_causal:  # DFlash2: the whole block, inside the window
                block = torch.ones(bs, bs, dtype=torch.bool, device=self.device)
        else:
            context = torch.ones(bs, anchor, dtype=torch.bool, device=self.device)
            block = torch.ones(bs, bs, dtype=torch.bool, device=self.device)
        return torch.cat([context, block], 1)

    def propose(self, context, token, anchor):
        """The bs - 1 tokens the drafter proposes after `token` at position
        `anchor`; `context` holds exactly the positions before it."""
        if not self.dflash2:
            return self.block_logits(context, token, anchor)[1:].argmax(-1).tolist()
        y = self.block_hidden(context, token, anchor)[1:]
        values, candidates = self.unary(y @ self.lm_head.T).topk(self.top_k, -1)
        projected = (y @ self.hidden_projection.T).float()
        chosen, predecessor = [], token
        for k in range(len(y)):  # the walk: each slot's predecessor is the last choice
            z = self.predecessor_codebook[predecessor].float() * projected[k]
            scores = values[k] + self.successor_codebook[candidates[k]].float() @ z
            predecessor = int(candidates[k][int(scores.argmax())])
            chosen.append(predecessor)
        return chosen

    def unary(self, logits):
        """Section 13's T(z) in fp32: c * tanh(m * z / c), or m * z without a cap."""
        z = logits.to(self.torch.promote_types(self.torch.float32, self.dtype))
        if self.softcap:
            return self.softcap * self.torch.tanh(self.multiplier * z / self.softcap)
        return self.multiplier * z

    def conv(self, x, delta, base):
        """Section 13's gconv over one block: x [bs, H], delta [bs, kc, G],
        base [kc, H]; causal inside the block, base + delta in fp32, the
        output rounded once."""
        torch, bs = self.torch, len(x)
        wide = torch.promote_types(torch.float32, self.dtype)
        out = torch.zeros(x.shape, dtype=wide, device=self.device)
        kernel = base.to(wide)[None] + delta.to(wide).repeat_interleave(self.conv_group, -1)
        for o in range(self.conv_taps):
            out[o:] += kernel[o:, o] * x[:bs - o].to(wide)
        return out.to(self.dtype)

    def conv_deltas(self, h, projection):
        """The two halves [2][bs, kc, G] of a sublayer's D = h @ Wc^T."""
        delta = (h @ projection.T).view(len(h), 2, self.conv_taps, -1)
        return delta[:, 0], delta[:, 1]

    def block_logits(self, context, token, anchor):
        """The logits [bs, V] of the block [token, mask, ...] at `anchor`
        (a DFlash2 drafter's before its unary transform)."""
        return self.block_hidden(context, token, anchor) @ self.lm_head.T

    def block_hidden(self, context, token, anchor):
        """The final hidden states [bs, H] of the block [token, mask, ...] at
        `anchor`, after the final norm."""
        torch, bs, d = self.torch, self.block_size, self.head_dim
        if context.length != anchor:
            raise ValueError(f"the context holds {context.length} positions, "
                             f"not the anchor's {anchor}")
        ids = torch.full((bs,), self.mask_token_id, device=self.device)
        ids[0] = token
        x = self.embed[ids]
        if self.dflash2 and self.embedding_scale != 1.0:
            x = (x.float() * self.embedding_scale).to(self.dtype)
        positions = torch.arange(anchor, anchor + bs, device=self.device)
        group = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            h = self.rms_norm(x, layer["input_norm"])
            if self.dflash2:
                base, projection = layer["attention_conv"]
                before, after = self.conv_deltas(h, projection)
                h = self.conv(h, before, base[0])
            q = self.rope(self.rms_norm((h @ layer["q"].T).view(bs, self.heads, d),
                                        layer["q_norm"]), positions)
            k = self.rope(self.rms_norm((h @ layer["k"].T).view(bs, self.kv_heads, d),
                                        layer["k_norm"]), positions)
            v = (h @ layer["v"].T).view(bs, self.kv_heads, d)
            context_k, context_v = context.layer(i)
            keys = torch.cat([context_k, k]).repeat_interleave(group, 1)
            values = torch.cat([context_v, v]).repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) * d ** -0.5
            scores = scores.masked_fill(~self.visible(self.windows[i], anchor), float("-inf"))
            attention = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.float())
            out = attention.reshape(bs, -1).to(self.dtype) @ layer["o"].T
            if self.dflash2:
                out = self.conv(out, after, base[1])
            x = x + out
            h2 = self.rms_norm(x, layer["post_norm"])
            if self.dflash2:
                base, projection = layer["mlp_conv"]
                before, after = self.conv_deltas(h2, projection)
                h2 = self.conv(h2, before, base[0])
            out = (torch.nn.functional.silu(h2 @ layer["gate"].T) *
                   (h2 @ layer["up"].T)) @ layer["down"].T
            if self.dflash2:
                out = self.conv(out, after, base[1])
            x = x + out
        return self.rms_norm(x, self.norm)
