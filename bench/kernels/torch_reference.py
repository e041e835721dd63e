#!/usr/bin/env python3
"""PyTorch side of bench/kernels: the baselines KernelBench is compared with.

Same shapes as KernelBench.cu (qwen3-8b-b16 recipe: B 4, S 3072, N 512, bs 16,
nh/nkv/d 32/8/128; lm_head 8192 x 151936 x 4096), on the same GPU, timed the
same way (CUDA events, warm-up, median):
  - flex_attention (torch.compile'd) with the DFlash block mask of
    docs/semantics.md section 3 over kv = [context (S) | draft (Q)], enable_gqa,
    full and sliding (window 2048, causal in-block), forward and backward;
    TFLOP/s counts visible pairs only (4 d per pair forward, 2.5x backward);
  - lm_head + weighted CE: materialised logits (fp32 CE, as trainers do) and
    a chunked version (2048 rows at a time, autograd per chunk), with the
    extra memory each allocates, and the two GEMMs alone;
  - the target model's causal attention forward (KernelBench's "causal"
    section: B 4, S 3072, nh/nkv/d 32/8/128): scaled_dot_product_attention
    (is_causal, enable_gqa) on unpacked rows, and on the packed rows
    KernelBench wrote (causal_positions_b4.bin beside --out, else the same
    lognormal lengths drawn here) torch.nn.attention.varlen.varlen_attn
    where it exists, else flex_attention with a document mask;
  - the gated delta rule (KernelBench's "hybrid" section, Qwen3.6-27B's
    DeltaNet shape): transformers' torch fallback, and flash-linear-
    attention's chunk_gated_delta_rule where it is installed.
Writes one JSON object per line (name, ms, metric, value, note) to --out.
Each benchmark is guarded, so one failure does not lose the others.
"""

import argparse
import json
import os
import time
import traceback

import torch
import torch.nn.functional as F

S, N, BS, NH, NKV, D = 3072, 512, 16, 32, 8, 128
Q = N * BS


def ms_from_env(name, default):
    """A whole number of milliseconds from the environment, as KernelBench
    reads it."""
    v = os.environ.get(name, "")
    if not v:
        return default
    if not v.isdigit() or int(v) > 600000:
        raise SystemExit(f"torch_reference.py: {name} must be a whole number "
                         f"of milliseconds from 0 to 600000, got '{v}'")
    return int(v)


# The GPU idles COOLDOWN_MS before each baseline, then runs it at least
# `warmup` times and WARMUP_MS long: the same clock KernelBench times its
# kernels at (see timeMs there).
COOLDOWN_MS = ms_from_env("DFLASH_BENCH_COOLDOWN_MS", 1000)
WARMUP_MS = ms_from_env("DFLASH_BENCH_WARMUP_MS", 0)


def time_ms(fn, warmup=3, reps=15):
    torch.cuda.synchronize()
    time.sleep(COOLDOWN_MS / 1e3)
    start = time.monotonic()
    i = 0
    while i < warmup or (time.monotonic() - start) * 1e3 < WARMUP_MS:
        fn()
        torch.cuda.synchronize()
        i += 1
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return ms[reps // 2]


class Reporter:
    def __init__(self, path):
        self.file = open(path, "w") if path else None

    def __call__(self, name, ms, metric, value, note=""):
        print(f"{name:<44} {ms:9.3f} ms  {value:9.1f} {metric:<8} {note}",
              flush=True)
        if self.file:
            self.file.write(json.dumps({"name": name, "ms": ms,
                                        "metric": metric, "value": value,
                                        "note": note}) + "\n")
            self.file.flush()


def load_anchors(path, B):
    if path and os.path.exists(path):
        import numpy as np
        a = np.fromfile(path, dtype=np.int32).reshape(B, N)
        return torch.from_numpy(a).cuda()
    g = torch.Generator().manual_seed(42)
    rows = [torch.randperm(S - 1, generator=g)[:N].sort().values
            for _ in range(B)]
    return torch.stack(rows).to(torch.int32).cuda()


def visible_pairs(anchors, window, causal):
    a = anchors.to(torch.int64).unsqueeze(-1)           # [B, N, 1]
    k = torch.arange(BS, device=a.device).view(1, 1, BS)
    lo = (a + k - (window - 1)).clamp(min=0) if window > 0 else torch.zeros_like(a + k)
    ctx = (a - lo).clamp(min=0)
    draft = (k + 1) if causal else torch.full_like(k, BS)
    return float((ctx + draft).sum().item()) * NH


def attention(report, B, window, causal, anchor_path):
    from torch.nn.attention.flex_attention import (create_block_mask,
                                                   flex_attention)
    anchors = load_anchors(anchor_path, B)
    keep = torch.ones(B, N, dtype=torch.bool, device="cuda")

    def mask_mod(b, h, q_idx, kv_idx):
        n = q_idx // BS
        k = q_idx % BS
        a = anchors[b, n]
        ctx = (kv_idx < S) & (kv_idx < a)
        if window > 0:
            ctx = ctx & (kv_idx >= a + k - (window - 1))
        t = kv_idx - S
        draft = (kv_idx >= S) & (t // BS == n)
        if causal:
            draft = draft & (t % BS <= k)
        return keep[b, n] & (ctx | draft)

    kind = f"sliding{window}" if window > 0 else "full"
    block_mask = create_block_mask(mask_mod, B, None, Q, S + Q, device="cuda",
                                   _compile=True)
    mask_ms = time_ms(lambda: create_block_mask(mask_mod, B, None, Q, S + Q,
                                                device="cuda", _compile=True),
                      1, 3)
    q = torch.randn(B, NH, Q, D, device="cuda", dtype=torch.bfloat16) * 1.5
    k = torch.randn(B, NKV, S + Q, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, NKV, S + Q, D, device="cuda", dtype=torch.bfloat16)
    flex = torch.compile(flex_attention, dynamic=False)
    flops = 4.0 * D * visible_pairs(anchors, window, causal)
    with torch.no_grad():
        fwd = time_ms(lambda: flex(q, k, v, block_mask=block_mask,
                                   enable_gqa=True))
    report(f"flex_attention fwd {kind} B={B}", fwd, "TFLOP/s",
           flops / (fwd * 1e9), f"block mask build {mask_ms:.2f} ms")
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out = flex(q, k, v, block_mask=block_mask, enable_gqa=True)
    d_out = torch.randn_like(out)
    bwd = time_ms(lambda: torch.autograd.grad(out, (q, k, v), d_out,
                                              retain_graph=True))
    report(f"flex_attention bwd {kind} B={B}", bwd, "TFLOP/s",
           2.5 * flops / (bwd * 1e9))


def lm_head(report):
    rows, V, H = 8192, 151936, 4096
    torch.manual_seed(0)
    y = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)
    W = (torch.randn(V, H, device="cuda") * 0.02).to(torch.bfloat16)
    labels = torch.randint(0, V, (rows,), device="cuda")
    w = torch.ones(rows, device="cuda")
    w[::16] = 0
    flops = 4.0 * rows * V * H

    def materialised():
        yy = y.detach().requires_grad_()
        logits = yy @ W.t()
        loss = (F.cross_entropy(logits.float(), labels, reduction="none")
                * w).sum()
        loss.backward()
        return yy.grad

    def chunked(chunk=2048):
        dy = torch.empty_like(y)
        for i in range(0, rows, chunk):
            yc = y[i:i + chunk].detach().requires_grad_()
            logits = yc @ W.t()
            loss = (F.cross_entropy(logits.float(), labels[i:i + chunk],
                                    reduction="none") * w[i:i + chunk]).sum()
            (g,) = torch.autograd.grad(loss, yc)
            dy[i:i + chunk] = g
        return dy

    def gemms():
        logits = y @ W.t()
        return logits @ W

    for name, fn in (("materialised", materialised),
                     ("chunked 2048", chunked)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 1e6
        ms = time_ms(fn, 2, 7)
        report(f"torch lm_head+CE {name}", ms, "TFLOP/s", flops / (ms * 1e9),
               f"extra {extra:.0f} MB")
    ms = time_ms(gemms, 2, 7)
    report("torch lm_head GEMMs alone (unchunked)", ms, "TFLOP/s",
           flops / (ms * 1e9))


def causal_positions(path, B, S):
    """The packed rows' position_ids KernelBench wrote, else lognormal
    conversation lengths (mean about 900) drawn here."""
    import numpy as np
    if path and os.path.exists(path):
        return torch.from_numpy(
            np.fromfile(path, dtype=np.int32).reshape(B, S).copy())
    rng = np.random.default_rng(77)
    rows = []
    for _ in range(B):
        pos = []
        while len(pos) < S:
            n = int(min(max(round(rng.lognormal(np.log(900.0) - 0.32, 0.8)),
                            1), S - len(pos)))
            pos += list(range(n))
        rows.append(pos)
    return torch.tensor(rows, dtype=torch.int32)


def causal(report, positions_path):
    B, S = 4, 3072
    torch.manual_seed(0)
    q = torch.randn(B, S, NH, D, device="cuda", dtype=torch.bfloat16) * 1.5
    k = torch.randn(B, S, NKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, S, NKV, D, device="cuda", dtype=torch.bfloat16)
    # Unpacked: every row one conversation.
    flops = 4.0 * D * NH * B * S * (S + 1) / 2
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    # [B, heads, S, D]
    with torch.no_grad():
        ms = time_ms(lambda: F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True, enable_gqa=True))
    report(f"torch sdpa causal fwd unpacked B={B}", ms, "TFLOP/s",
           flops / (ms * 1e9))

    # Packed: conversations from the position_ids (each starts at 0).
    pos = causal_positions(positions_path, B, S)
    starts = (pos.flatten() == 0).nonzero().flatten().tolist() + [B * S]
    lengths = [b - a for a, b in zip(starts[:-1], starts[1:])]
    flops = 4.0 * D * NH * sum(n * (n + 1) / 2 for n in lengths)
    note = f"{len(lengths)} conversations, mean {B * S / len(lengths):.0f}"
    try:
        import inspect
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None:
        params = inspect.signature(varlen_attn).parameters
        cu = torch.tensor(starts, dtype=torch.int32, device="cuda")
        longest = max(lengths)
        kw = {}
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)  # causal
        qf, kf, vf = (x.reshape(B * S, -1, D) for x in (q, k, v))
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        elif NKV != NH:
            # No GQA flag: give it every query head's keys (the copies are
            # made once, outside the timing).
            kf = kf.repeat_interleave(NH // NKV, dim=1).contiguous()
            vf = vf.repeat_interleave(NH // NKV, dim=1).contiguous()
        try:
            with torch.no_grad():
                ms = time_ms(lambda: varlen_attn(qf, kf, vf, cu, cu, longest,
                                                 longest, **kw))
            report(f"torch varlen_attn causal fwd packed B={B}", ms,
                   "TFLOP/s", flops / (ms * 1e9), note)
            return
        except Exception:
            traceback.print_exc()
            print("varlen_attn failed: flex_attention with a document mask")
    from torch.nn.attention.flex_attention import (create_block_mask,
                                                   flex_attention)
    doc = (torch.arange(S).view(1, S) - pos.to(torch.int64)).cuda()

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    block_mask = create_block_mask(mask_mod, B, None, S, S, device="cuda",
                                   _compile=True)
    flex = torch.compile(flex_attention, dynamic=False)
    with torch.no_grad():
        ms = time_ms(lambda: flex(qt, kt, vt, block_mask=block_mask,
                                  enable_gqa=True))
    report(f"torch flex_attention causal fwd packed B={B}", ms, "TFLOP/s",
           flops / (ms * 1e9), note)


def hybrid(report, positions_path):
    """The gated delta rule at KernelBench's "hybrid" shape (Qwen3.6-27B's
    DeltaNet: B 4, S 3072, 16 key and 48 value heads of 128): transformers'
    torch_chunk_gated_delta_rule (its fallback without flash-linear-attention)
    on unpacked rows, and flash-linear-attention's chunk_gated_delta_rule
    where it is installed (unpacked, and on the packed rows through
    cu_seqlens). FLOPs: the op's count, 7 dk dv a token and value head."""
    B, S, HK, HV, DH = 4, 3072, 16, 48, 128
    torch.manual_seed(0)
    q = torch.randn(B, S, HK, DH, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, HK, DH, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, S, HV, DH, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(B, S, HV, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(B, S, HV, device="cuda", dtype=torch.bfloat16)
    a_log = torch.linspace(-5.0, -1.0, HV, device="cuda")
    dt_bias = 0.05 * (torch.arange(HV, device="cuda") % 5).float()
    g = -a_log.exp() * F.softplus(a.float() + dt_bias)
    beta = b.float().sigmoid().to(torch.bfloat16)
    # The model repeats each key head for its value heads before the rule.
    qv, kv = (x.repeat_interleave(HV // HK, dim=2) for x in (q, k))
    flops = 7.0 * DH * DH * B * S * HV
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next as m
        rule = m.torch_chunk_gated_delta_rule
        with torch.no_grad():
            ms = time_ms(lambda: rule(qv, kv, v, g=g, beta=beta,
                                      use_qk_l2norm_in_kernel=True),
                         warmup=1, reps=5)
        report(f"transformers torch_chunk_gated_delta_rule unpacked B={B}",
               ms, "TFLOP/s", flops / (ms * 1e9))
    except Exception:
        traceback.print_exc()
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        print("flash-linear-attention is not installed: no fla baseline")
        return
    with torch.no_grad():
        ms = time_ms(lambda: chunk_gated_delta_rule(
            qv, kv, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True))
    report(f"fla chunk_gated_delta_rule unpacked B={B}", ms, "TFLOP/s",
           flops / (ms * 1e9))
    pos = causal_positions(positions_path, B, S)
    starts = (pos.flatten() == 0).nonzero().flatten().tolist() + [B * S]
    cu = torch.tensor(starts, dtype=torch.long, device="cuda")
    packed = [x.reshape(1, B * S, *x.shape[2:]) for x in (qv, kv, v, g, beta)]
    with torch.no_grad():
        ms = time_ms(lambda: chunk_gated_delta_rule(
            *packed[:3], g=packed[3], beta=packed[4], cu_seqlens=cu,
            use_qk_l2norm_in_kernel=True))
    report(f"fla chunk_gated_delta_rule packed B={B}", ms, "TFLOP/s",
           flops / (ms * 1e9), f"{len(starts) - 1} conversations")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    parser.add_argument("--anchors", default="")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    report = Reporter(args.out)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    jobs = []
    if not args.only or "attention" in args.only:
        jobs += [lambda: attention(report, 4, 0, False, args.anchors),
                 lambda: attention(report, 4, 2048, True, args.anchors)]
    if not args.only or "lmhead" in args.only:
        jobs.append(lambda: lm_head(report))
    if not args.only or "causal" in args.only:
        positions = os.path.join(os.path.dirname(args.out) or ".",
                                 "causal_positions_b4.bin")
        jobs.append(lambda: causal(report, positions))
    if not args.only or "hybrid" in args.only:
        positions = os.path.join(os.path.dirname(args.out) or ".",
                                 "causal_positions_b4.bin")
        jobs.append(lambda: hybrid(report, positions))
    for job in jobs:
        try:
            job()
        except Exception:
            traceback.print_exc()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
