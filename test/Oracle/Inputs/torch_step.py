#!/usr/bin/env python3
"""An independent PyTorch implementation of one DFlash training step.

Reads a step dump written by `dflash-reference --dump-step FILE` (every input,
frozen weight and parameter of the step, plus the reference's loss and
gradients), recomputes the forward pass of docs/semantics.md sections 3-4 with dense
attention masks built from the text of the contract, takes the gradients with
torch.autograd in fp32, and compares: relative error ||torch - ref|| / ||ref||
below --tolerance for the loss and every parameter's gradient.

Nothing here shares code with dflashc: the safetensors reader is the few lines
the format needs, and the math is written from docs/semantics.md.
Runs with Debian's python3-torch (1.13, CPU) and with PyTorch 2.x.

A drafter with [drafter.rope_scaling] (YaRN) rotates by transformers' own
Qwen3 rotary embedding built from the exported config.json (--hf-config
DIR, needs transformers): the step matches only if that file makes
transformers rotate as the reference did.
"""

import argparse
import json
import struct
import sys

import numpy as np
import torch

DTYPES = {"F64": np.float64, "F32": np.float32, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """Returns ({name: float64 or int64 numpy array}, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin:base + end]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32).astype(np.float64)
        else:
            arr = np.frombuffer(buf, dtype=DTYPES[info["dtype"]])
            arr = arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64)
        tensors[name] = arr.reshape(shape)
    return tensors, header.get("__metadata__", {})


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """Rotate-half RoPE of x [B, T, heads, d] at positions pos [B, T]; the
    inverse frequencies and angles in fp32, as Hugging Face computes them;
    cos and sin of those angles in fp32, or in fp64 for an fp64 x (the
    reference's --precision exact)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angle = pos.float()[..., None] * inv  # [B, T, d/2], fp32
    angle = angle.to(torch.promote_types(x.dtype, torch.float32))
    cos = torch.cat([angle.cos(), angle.cos()], -1)[:, :, None, :].to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1)[:, :, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def transformers_rope(config_dir):
    """rope() with cos and sin (attention factor included) from
    transformers' Qwen3RotaryEmbedding of the checkpoint's config.json."""
    import transformers
    from transformers.models.qwen3 import modeling_qwen3
    config = transformers.AutoConfig.from_pretrained(config_dir)
    rotary = modeling_qwen3.Qwen3RotaryEmbedding(config=config)
    print("oracle: rope from transformers %s, %s" % (
        transformers.__version__, getattr(rotary, "rope_type", "?")))

    def rotate(x, pos, theta):
        cos, sin = rotary(x.float(), pos)  # [B, T, d], fp32
        cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
        d = x.shape[-1]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return rotate


def visibility(anchors, keep, positions, S, bs, window, causal):
    """The [B, Q, S+Q] mask of docs/semantics.md sections 3 and 9: query (n, k)
    sees context key j iff keep and doc_start(anchor) <= j < anchor (and
    j >= anchor + k - (W-1) in a sliding layer), and draft key (n, k') of its
    own block for every k', or only k' <= k in a sliding layer."""
    B, N = anchors.shape
    Q = N * bs
    mask = torch.zeros(B, Q, S + Q, dtype=torch.bool)
    for b in range(B):
        for n in range(N):
            if not keep[b, n]:
                continue
            a = int(anchors[b, n])
            start = a - int(positions[b, a])
            for k in range(bs):
                q = n * bs + k
                lo = max(start, a + k - (window - 1)) if window else start
                if lo < a:
                    mask[b, q, lo:a] = True
                for kk in range(bs):
                    if not causal or kk <= k:
                        mask[b, q, S + n * bs + kk] = True
    return mask


def attention(q, k, v, mask):
    """q [B, Q, nh, d]; k, v [B, S+Q, nkv, d]; mask [B, Q, S+Q]. A row that
    sees nothing outputs 0."""
    nh, nkv, d = q.shape[2], k.shape[2], q.shape[3]
    group = nh // nkv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bjhd->bhqj", q, k) * d ** -0.5
    m = mask[:, None, :, :]
    scores = scores.masked_fill(~m, float("-inf"))
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    p = torch.exp(scores - peak) * m
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.einsum("bhqj,bjhd->bqhd", p, v)


def labels_and_weights(ids, loss_mask, anchors, keep, positions, bs, gamma, dtype):
    """Section 4 (with section 9's conversation rule): the label of slot
    (n, k) is input_ids[anchor + k] (0 past the row) and its weight."""
    B, S = ids.shape
    N = anchors.shape[1]
    labels = torch.zeros(B, N * bs, dtype=torch.int64)
    w = torch.zeros(B, N * bs, dtype=dtype)
    for b in range(B):
        for n in range(N):
            a = int(anchors[b, n])
            for k in range(bs):
                pos = a + k
                if pos < S:
                    labels[b, n * bs + k] = ids[b, pos]
                if keep[b, n] and k > 0 and pos < S and loss_mask[b, pos] \
                        and positions[b, pos] == positions[b, a] + k:
                    w[b, n * bs + k] = np.exp(-(k - 1) / gamma) if gamma > 0 else 1.0
    return labels, w


def step(t, cfg, dtype, rope=rope):
    ids = torch.tensor(t["input.input_ids"], dtype=torch.int64)
    loss_mask = torch.tensor(t["input.loss_mask"]) != 0
    hidden = torch.tensor(t["input.target_hidden"], dtype=dtype)
    anchors = torch.tensor(t["input.anchors"], dtype=torch.int64)
    keep = torch.tensor(t["input.keep"]) != 0
    positions = torch.tensor(t["input.position_ids"], dtype=torch.int64)
    embed = torch.tensor(t["frozen.embed"], dtype=dtype)
    lm_head = torch.tensor(t["frozen.lm_head"], dtype=dtype) \
        if "frozen.lm_head" in t else embed
    params = {name[len("param."):]: torch.tensor(v, dtype=dtype, requires_grad=True)
              for name, v in t.items() if name.startswith("param.")}
    P = params.__getitem__

    B, S = ids.shape
    N = anchors.shape[1]
    bs, nh, nkv, d = cfg["block_size"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    eps, theta, gamma, mask_id = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["gamma"], cfg["mask_token_id"]
    Q = N * bs

    # 1. Context, once.
    ctx = rms_norm(hidden @ P("fc.weight").T, P("hidden_norm.weight"), eps)
    # 2. Draft stream: the anchor's token, then mask tokens.
    noise = torch.full((B, Q), mask_id, dtype=torch.int64)
    for b in range(B):
        for n in range(N):
            if keep[b, n]:
                noise[b, n * bs] = ids[b, anchors[b, n]]
    x = embed[noise]
    # 3. Positions, within each conversation (docs/semantics.md section 9).
    ctx_pos = positions
    anchor_pos = positions.gather(1, anchors)
    draft_pos = (anchor_pos[:, :, None] + torch.arange(bs)[None, None, :]).reshape(B, Q)
    # 4. Layers.
    for i, layer in enumerate(cfg["layers"]):
        p = "layers.%d." % i
        h = rms_norm(x, P(p + "input_layernorm.weight"), eps)
        q = (h @ P(p + "self_attn.q_proj.weight").T).view(B, Q, nh, d)
        q = rope(rms_norm(q, P(p + "self_attn.q_norm.weight"), eps), draft_pos, theta)
        kv_in = torch.cat([ctx, h], 1)
        kv_pos = torch.cat([ctx_pos, draft_pos], 1)
        k = (kv_in @ P(p + "self_attn.k_proj.weight").T).view(B, S + Q, nkv, d)
        k = rope(rms_norm(k, P(p + "self_attn.k_norm.weight"), eps), kv_pos, theta)
        v = (kv_in @ P(p + "self_attn.v_proj.weight").T).view(B, S + Q, nkv, d)
        mask = visibility(anchors, keep, positions, S, bs, layer["window"],
                          layer["window"] > 0)
        o = attention(q, k, v, mask).reshape(B, Q, nh * d)
        x = x + o @ P(p + "self_attn.o_proj.weight").T
        h2 = rms_norm(x, P(p + "post_attention_layernorm.weight"), eps)
        gate = h2 @ P(p + "mlp.gate_proj.weight").T
        up = h2 @ P(p + "mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ P(p + "mlp.down_proj.weight").T
    y = rms_norm(x, P("norm.weight"), eps)
    logits = y @ lm_head.T
    # Loss: same-position labels, k > 0, inside the row and the anchor's
    # conversation, supervised, decayed.
    labels, w = labels_and_weights(ids, loss_mask, anchors, keep, positions, bs, gamma, dtype)
    ce = torch.logsumexp(logits, -1) - logits.gather(-1, labels[..., None])[..., 0]
    loss = (w * ce).sum() / w.sum()
    # Acceptance length (docs/semantics.md section 10): per kept block, the run of
    # weighted right predictions from k = 1.
    good = ((w > 0) & (logits.detach().argmax(-1) == labels)).view(B, N, bs)
    runs = torch.cumprod(good[:, :, 1:].long(), dim=2).sum(dim=2)
    tau = float((1 + runs[keep]).double().mean()) if keep.any() else 0.0
    loss.backward()
    return loss.detach(), {n: v.grad for n, v in params.items()}, tau


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (den if den > 0 else 1.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", help="step dump from dflash-reference --dump-step")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--hf-config", metavar="DIR",
                    help="rotate as transformers does from DIR/config.json (YaRN)")
    args = ap.parse_args()
    torch.manual_seed(0)
    tensors, meta = read_safetensors(args.dump)
    cfg = json.loads(meta["config"])
    dtype = getattr(torch, args.dtype)
    if "rope_scaling" in cfg and not args.hf_config:
        print("oracle: the step has rope_scaling: give --hf-config", file=sys.stderr)
        return 2
    rotate = transformers_rope(args.hf_config) if args.hf_config else rope
    loss, grads, tau = step(tensors, cfg, dtype, rotate)

    worst = rel(float(loss), float(tensors["result.loss"]))
    print("oracle: torch %s, loss torch %.8f reference %.8f rel err %.2e" %
          (torch.__version__, float(loss), float(tensors["result.loss"]), worst))
    ref_tau = float(tensors["result.tau"])
    print("oracle: tau torch %.6f reference %.6f" % (tau, ref_tau))
    worst = max(worst, rel(tau, ref_tau))
    names = sorted(grads)
    for name in names:
        ref = tensors["gradient." + name]
        err = rel(grads[name].numpy(), ref)
        worst = max(worst, err)
        print("oracle: gradient %-45s rel err %.2e" % (name, err))
    ok = worst < args.tolerance and len(names) == cfg["num_parameters"]
    print("oracle: %d gradients, worst rel err %.2e (tolerance %.0e): %s" %
          (len(names), worst, args.tolerance, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
