#!/usr/bin/env python3
"""The PyTorch reference of one DFlash training step, timed on the GPU.

The same step as dflashc's trainer (docs/semantics.md): fc + hidden norm over the
target features, the draft blocks, pre-norm layers with grouped block-prefix
attention through flex_attention (compiled) with the DFlash block mask, the
weighted cross-entropy, backward, and AdamW. Modes:
  eager    the drafter eagerly, flex_attention compiled (the usual recipe)
  compile  torch.compile of the whole drafter (flex_attention inside)
--masters keeps fp32 master weights for the optimizer as dflashc does (by
default AdamW updates the bf16 parameters: less optimizer traffic).
Prints one JSON line per mode: median step ms over --steps timed steps after
--warmup, draft and context tokens/s, TFLOP/s (with --flops from dflashc's
manifest.json), peak memory. Anchors are fixed across steps so that the block
mask is built once (the most favourable setting for PyTorch). With
--anchor-layout synthetic (default) they follow the loss masks of `train --data
synthetic` (runtime/Synthetic.h: a prompt of S/8..S/4 unsupervised tokens, a
quarter of the rows ending early), so both sides attend over the same
amount of context; --anchor-layout uniform draws them over the whole row.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(pos, d, theta):
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=pos.device).float() / d))
    ang = pos.float()[..., None] * inv
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    return cos, sin


def apply_rope(x, cos, sin):
    # x [B, heads, T, d]; cos/sin [B, T, d]
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(x.dtype)


class Drafter(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        H, I, L = a.hidden, a.intermediate, a.taps
        self.a = a
        lin = lambda o, i: torch.nn.Parameter(torch.randn(o, i) * 0.02)
        one = lambda n: torch.nn.Parameter(torch.ones(n))
        self.fc = lin(H, L * H)
        self.hidden_norm = one(H)
        self.layers = torch.nn.ModuleList()
        for _ in range(a.layers):
            m = torch.nn.Module()
            m.inp = one(H)
            m.q = lin(a.heads * a.head_dim, H)
            m.k = lin(a.kv_heads * a.head_dim, H)
            m.v = lin(a.kv_heads * a.head_dim, H)
            m.o = lin(H, a.heads * a.head_dim)
            m.qn = one(a.head_dim)
            m.kn = one(a.head_dim)
            m.post = one(H)
            m.gate = lin(I, H)
            m.up = lin(I, H)
            m.down = lin(H, I)
            self.layers.append(m)
        self.norm = one(H)

    def forward(self, hidden, noise_emb, ctx_pos, draft_pos, masks, lm_head,
                labels, weights, attend):
        a = self.a
        B, S = hidden.shape[:2]
        Q = noise_emb.shape[1]
        nh, nkv, d, eps = a.heads, a.kv_heads, a.head_dim, 1e-6
        ctx = rms_norm(hidden @ self.fc.T, self.hidden_norm, eps)
        x = noise_emb
        pos = torch.cat([ctx_pos, draft_pos], 1)
        kcos, ksin = rope_tables(pos, d, a.theta)
        qcos, qsin = rope_tables(draft_pos, d, a.theta)
        for i, m in enumerate(self.layers):
            h = rms_norm(x, m.inp, eps)
            q = (h @ m.q.T).view(B, Q, nh, d)
            q = apply_rope(rms_norm(q, m.qn, eps).transpose(1, 2), qcos, qsin)
            kv_in = torch.cat([ctx, h], 1)
            k = (kv_in @ m.k.T).view(B, S + Q, nkv, d)
            k = apply_rope(rms_norm(k, m.kn, eps).transpose(1, 2), kcos, ksin)
            v = (kv_in @ m.v.T).view(B, S + Q, nkv, d).transpose(1, 2)
            o = attend(q, k, v, block_mask=masks[i], enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(B, Q, nh * d) @ m.o.T
            h2 = rms_norm(x, m.post, eps)
            x = x + (F.silu(h2 @ m.gate.T) * (h2 @ m.up.T)) @ m.down.T
        y = rms_norm(x, self.norm, eps)
        logits = (y @ lm_head.T).float()
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                             reduction="none")
        return (ce * weights.view(-1)).sum() / weights.sum()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("hidden", 4096), ("intermediate", 12288), ("layers", 5),
                          ("heads", 32), ("kv-heads", 8), ("head-dim", 128),
                          ("taps", 5), ("vocab", 151936), ("block", 16),
                          ("seq", 3072), ("anchors", 512), ("rows", 4),
                          ("steps", 10), ("warmup", 3)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--theta", type=float, default=1e6)
    ap.add_argument("--windows", default="", help="comma list per layer, 0 = full")
    ap.add_argument("--flops", type=float, default=0.0, help="FLOPs per step")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--anchor-layout", choices=["synthetic", "uniform"], default="synthetic")
    ap.add_argument("--masters", action="store_true",
                    help="fp32 master weights and gradients for clipping and AdamW, "
                         "copied back to the bf16 parameters (what dflashc's step does)")
    a = ap.parse_args()
    windows = [int(w) for w in a.windows.split(",")] if a.windows else [0] * a.layers
    dev = "cuda"
    torch.manual_seed(0)
    B, S, N, bs, Q = a.rows, a.seq, a.anchors, a.block, a.anchors * a.block
    hidden = torch.randn(B, S, a.taps * a.hidden, device=dev, dtype=torch.bfloat16)
    lm_head = torch.randn(a.vocab, a.hidden, device=dev, dtype=torch.bfloat16) * 0.02
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(B):
        if a.anchor_layout == "uniform":
            lo, length = 0, S
        else:
            lo = S // 8 + int(torch.randint(0, S // 8 + 1, (1,), generator=g))
            length = S
            if int(torch.randint(0, 4, (1,), generator=g)) == 0:
                length = min(S, lo + 2 + int(torch.randint(0, S - lo - 1, (1,), generator=g)))
        candidates = torch.arange(lo, length - 1)
        rows.append(candidates[torch.randperm(len(candidates), generator=g)])
    n_eff = min(N, max(len(r) for r in rows))
    anchors = torch.zeros(B, N, dtype=torch.int32)
    keep = torch.zeros(B, N, dtype=torch.bool)
    for b, r in enumerate(rows):
        take = r[:n_eff].sort().values
        anchors[b, :len(take)] = take.int()
        keep[b, :len(take)] = True
    anchors, keep = anchors.to(dev), keep.to(dev)
    draft_pos = (anchors[:, :, None] + torch.arange(bs, device=dev)).view(B, Q)
    ctx_pos = torch.arange(S, device=dev)[None].expand(B, S)
    noise_emb = torch.randn(B, Q, a.hidden, device=dev, dtype=torch.bfloat16) * 0.02
    labels = torch.randint(0, a.vocab, (B, Q), device=dev)
    k_in = torch.arange(bs, device=dev).repeat(N)
    weights = ((k_in > 0).float() * torch.exp(-(k_in - 1).clamp(min=0) / 7.0))[None].expand(B, Q).contiguous()

    def mask_for(window):
        def mask_mod(b, h, q_idx, kv_idx):
            n = q_idx // bs
            k = q_idx % bs
            anchor = anchors[b, n]
            ctx_ok = keep[b, n] & (kv_idx < S) & (kv_idx < anchor)
            if window:
                ctx_ok = ctx_ok & (kv_idx >= anchor + k - (window - 1))
            kd = kv_idx - S
            draft_ok = keep[b, n] & (kv_idx >= S) & (kd // bs == n)
            if window:
                draft_ok = draft_ok & (kd % bs <= k)
            return ctx_ok | draft_ok
        return create_block_mask(mask_mod, B, None, Q, S + Q, device=dev)

    masks = [mask_for(w) for w in windows]
    flex = torch.compile(flex_attention)
    for mode in a.modes.split(","):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = Drafter(a).to(dev, torch.bfloat16)
        params = list(model.parameters())
        # --masters: the optimizer owns fp32 copies; the bf16 parameters only
        # compute. Otherwise AdamW updates the bf16 parameters directly.
        masters = [p.detach().float().requires_grad_() for p in params] if a.masters else params
        opt = torch.optim.AdamW(masters, lr=6e-4, fused=True)
        fwd = torch.compile(model) if mode == "compile" else model
        times = []
        t0 = time.time()
        for it in range(a.warmup + a.steps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            loss = fwd(hidden, noise_emb, ctx_pos, draft_pos, masks, lm_head,
                       labels, weights, flex)
            loss.backward()
            if a.masters:
                for m, p in zip(masters, params):
                    m.grad = p.grad.float()
                    p.grad = None
            torch.nn.utils.clip_grad_norm_(masters, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if a.masters:
                with torch.no_grad():
                    torch._foreach_copy_(params, masters)
            end.record()
            torch.cuda.synchronize()
            if it >= a.warmup:
                times.append(start.elapsed_time(end))
        times.sort()
        ms = times[len(times) // 2]
        print(json.dumps({
            "mode": "torch-" + mode + ("-masters" if a.masters else ""),
            "step_ms": round(ms, 3),
            "draft_tokens_per_s": round(B * Q / ms * 1e3),
            "context_tokens_per_s": round(B * S / ms * 1e3),
            "tflops": round(a.flops / ms / 1e9, 1) if a.flops else None,
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "loss": round(float(loss.detach()), 4),
            "wall_s_incl_compile": round(time.time() - t0, 1)}), flush=True)
        del model, opt, fwd, params, masters


if __name__ == "__main__":
    main()
