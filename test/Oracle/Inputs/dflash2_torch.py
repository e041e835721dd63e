#!/usr/bin/env python3
"""An independent PyTorch implementation of a DFlash2 drafter's step.

Written from docs/semantics.md section 13 (and the DFlash sections 1-10 it
builds on), not from the CPU reference: the grouped dynamic convolutions, the
unary logits, the selector over the top K, the loss with its alpha_t schedule
and options, the acceptance length, the checkpoint's names and config.json.
It reuses the DFlash pieces of torch_step.py beside it (the safetensors
reader, RMSNorm, RoPE, the dense masks and attention). Four commands:

  dflash2_torch.py perturb INIT OUT [--seed N]
      Copies the checkpoint INIT (config.json, model.safetensors) to OUT with
      every norm, convolution and selector tensor redrawn far from its
      initial value (the convolutions start as the identity and the
      successor codebook as 0, which would hide them), in bf16.
  dflash2_torch.py step DUMP [--alpha-t A] [--tolerance T] [--break WHAT]
      DUMP: `dflash-reference --precision exact --dump-step` of a DFlash2
      spec. Recomputes the loss, the acceptance length and every gradient
      (autograd) in fp64 and compares them with the reference's. --alpha-t
      also requires the schedule's alpha_t at step 0 to be A. --break runs
      a deliberately wrong model, which must FAIL.
  dflash2_torch.py export CKPT
      Checks an exported DFlash2 checkpoint: exactly section 13's tensor
      names, shapes and dtype, and config.json's keys; prints dflash_config.
  dflash2_torch.py walk CKPT TARGET SHARD FIRST_ROW SERVING_DUMP [--line L]
      Loads CKPT by section 13's names, and the frozen embedding and lm_head
      of TARGET; for every row of SERVING_DUMP (`dflash-reference
      --eval-serving-dump`: the row's index among the held-out rows, its
      anchor candidates and the run at each), takes the row from SHARD
      (a dflash-synth shard whose row FIRST_ROW is held-out row 0), drafts
      a block at every candidate with the selector's greedy walk (each
      step's predecessor is the token drafted before it) and requires the
      reference's run at every candidate. --line: the run's output, whose
      eval_serving_tau the walk must also give. --break as for step.

Prints "PASS" or "FAIL" last and exits 0 or 1.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import (attention, labels_and_weights, read_safetensors, rel, rms_norm,  # noqa: E402
                        rope, visibility)

# Deliberate mistakes for the self-checks: the oracle must tell each one.
BREAKS = {
    "conv-tap": "every convolution tap reads one slot further back",
    "gold": "the other selector_gold (topk <-> inject)",
    "denominator": "the other selector_denominator (all <-> covered)",
    "stop-gradient": "the other selector_stop_gradient",
    "predecessor": "the selector's predecessor is the label, not the token before it",
    "unary": "CE_u on the logits without their unary transform",
}
WALK_BREAKS = {
    "conv-tap": BREAKS["conv-tap"],
    # Teacher forcing would not do: it is the greedy walk up to the first miss.
    "predecessor": "the selector's predecessor is the anchor token at every step",
}


def alpha_at(step, total, d2):
    """Section 13: 0 for int(warmup_ratio * total) steps, then linear to
    selector_alpha over int(ramp_ratio * total) steps, as the learning
    rate's warm-up counts them."""
    warm = int(d2["selector_warmup_ratio"] * total)
    ramp = int(d2["selector_ramp_ratio"] * total)
    if step < warm:
        return 0.0
    if step < warm + ramp:
        return d2["selector_alpha"] * (step - warm + 1) / ramp
    return d2["selector_alpha"]


def gconv(x, delta, base, bs, gs, broken=None):
    """out[n, k, c] = sum over o < kc with k - o >= 0 of
    (base[o, c] + delta[n, k, o, c / gs]) * x[n, k - o, c]: causal, inside
    each block. x [B, Q, H]; delta [B, Q, kc, G] (at the output slot);
    base [kc, H]."""
    B, Q, H = x.shape
    kc = base.shape[0]
    xb = x.reshape(B, Q // bs, bs, H)
    kernel = (base[None, None] + delta.repeat_interleave(gs, dim=-1)).reshape(B, Q // bs, bs, kc, H)
    out = torch.zeros_like(xb)
    for o in range(kc):
        lag = o + 1 if broken == "conv-tap" else o
        if lag >= bs:
            continue
        # Slot k reads slot k - lag of its own block; nothing before slot 0.
        shifted = torch.cat([torch.zeros_like(xb[:, :, :lag]), xb[:, :, :bs - lag]], dim=2)
        out = out + kernel[:, :, :, o, :] * shifted
    return out.reshape(B, Q, H)


def unary(z, d2):
    """T(z) = c * tanh(m * z / c), or m * z without a cap."""
    m, c = d2.get("output_multiplier", 1.0), d2.get("final_logit_softcapping", 0.0)
    return c * torch.tanh(m * z / c) if c and c > 0 else m * z


def forward(P, embed, lm_head, ids, hidden, anchors, keep, positions, cfg, d2, broken=None):
    """Sections 3 and 13: y [B, Q, H] and the unary logits u [B, Q, V]."""
    B, S = ids.shape
    N = anchors.shape[1]
    bs, nh, nkv, d = cfg["block_size"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    eps, theta, mask_id = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["mask_token_id"]
    kc, gs = d2["conv_kernel_size"], d2["conv_group_size"]
    H = embed.shape[1]
    G = H // gs
    Q = N * bs
    ctx = rms_norm(hidden @ P("fc.weight").T, P("hidden_norm.weight"), eps)
    noise = torch.full((B, Q), mask_id, dtype=torch.int64)
    for b in range(B):
        for n in range(N):
            if keep[b, n]:
                noise[b, n * bs] = ids[b, anchors[b, n]]
    x = embed[noise] * d2.get("input_embedding_scale", 1.0)
    anchor_pos = positions.gather(1, anchors)
    draft_pos = (anchor_pos[:, :, None] + torch.arange(bs)[None, None, :]).reshape(B, Q)
    kv_pos = torch.cat([positions, draft_pos], 1)
    for i, layer in enumerate(cfg["layers"]):
        p = "layers.%d." % i
        window = layer["window"]
        if 0 < window < bs:
            raise SystemExit("oracle: layer %d's window %d is below the block size %d: "
                             "the in-block window rule is not modelled" % (i, window, bs))
        # Every layer of a DFlash2 drafter is bidirectional inside its block.
        mask = visibility(anchors, keep, positions, S, bs, window, False)
        h = rms_norm(x, P(p + "input_layernorm.weight"), eps)
        D = (h @ P(p + "attention_conv.kernel_projection.weight").T).reshape(B, Q, 2, kc, G)
        base = P(p + "attention_conv.base_kernel")
        hc = gconv(h, D[:, :, 0], base[0], bs, gs, broken)
        q = (hc @ P(p + "self_attn.q_proj.weight").T).reshape(B, Q, nh, d)
        q = rope(rms_norm(q, P(p + "self_attn.q_norm.weight"), eps), draft_pos, theta)
        kv_in = torch.cat([ctx, hc], 1)  # ctx is not convolved
        k = (kv_in @ P(p + "self_attn.k_proj.weight").T).reshape(B, S + Q, nkv, d)
        k = rope(rms_norm(k, P(p + "self_attn.k_norm.weight"), eps), kv_pos, theta)
        v = (kv_in @ P(p + "self_attn.v_proj.weight").T).reshape(B, S + Q, nkv, d)
        o = attention(q, k, v, mask).reshape(B, Q, nh * d)
        x = x + gconv(o @ P(p + "self_attn.o_proj.weight").T, D[:, :, 1], base[1], bs, gs, broken)
        h2 = rms_norm(x, P(p + "post_attention_layernorm.weight"), eps)
        D2 = (h2 @ P(p + "mlp_conv.kernel_projection.weight").T).reshape(B, Q, 2, kc, G)
        base2 = P(p + "mlp_conv.base_kernel")
        h2c = gconv(h2, D2[:, :, 0], base2[0], bs, gs, broken)
        mlp = (torch.nn.functional.silu(h2c @ P(p + "mlp.gate_proj.weight").T) *
               (h2c @ P(p + "mlp.up_proj.weight").T)) @ P(p + "mlp.down_proj.weight").T
        x = x + gconv(mlp, D2[:, :, 1], base2[1], bs, gs, broken)
    y = rms_norm(x, P("norm.weight"), eps)
    return y, unary(y @ lm_head.T, d2)


def selector_scores(u, y, pred, cands, P):
    """s_j = u[c_j] + z . S[c_j] with z = P[p] * (y @ Wh^T)."""
    z = P("candidate_selector.predecessor_codebook")[pred] * \
        (y @ P("candidate_selector.hidden_projection.weight").T)
    succ = P("candidate_selector.successor_codebook")[cands]  # [..., K, r]
    return u.gather(-1, cands) + (z[..., None, :] * succ).sum(-1)


def step(t, cfg, broken=None):
    """The loss, tau and gradients of the dumped step, in fp64."""
    dtype = torch.float64
    d2 = dict(cfg["dflash2"])
    if broken == "gold":
        d2["selector_gold"] = "topk" if d2["selector_gold"] == "inject" else "inject"
    if broken == "denominator":
        d2["selector_denominator"] = "all" if d2["selector_denominator"] == "covered" else "covered"
    if broken == "stop-gradient":
        d2["selector_stop_gradient"] = not d2["selector_stop_gradient"]
    ids = torch.tensor(t["input.input_ids"], dtype=torch.int64)
    loss_mask = torch.tensor(t["input.loss_mask"]) != 0
    hidden = torch.tensor(t["input.target_hidden"], dtype=dtype)
    anchors = torch.tensor(t["input.anchors"], dtype=torch.int64)
    keep = torch.tensor(t["input.keep"]) != 0
    positions = torch.tensor(t["input.position_ids"], dtype=torch.int64)
    embed = torch.tensor(t["frozen.embed"], dtype=dtype)
    lm_head = torch.tensor(t["frozen.lm_head"], dtype=dtype) if "frozen.lm_head" in t else embed
    params = {name[len("param."):]: torch.tensor(v, dtype=dtype, requires_grad=True)
              for name, v in t.items() if name.startswith("param.")}
    P = params.__getitem__
    B, S = ids.shape
    N = anchors.shape[1]
    bs, K = cfg["block_size"], d2["selector_top_k"]

    y, u = forward(P, embed, lm_head, ids, hidden, anchors, keep, positions, cfg, d2, broken)
    labels, w = labels_and_weights(ids, loss_mask, anchors, keep, positions, bs, cfg["gamma"], dtype)
    u_ce = y @ lm_head.T if broken == "unary" else u
    ce_u = torch.logsumexp(u_ce, -1) - u_ce.gather(-1, labels[..., None])[..., 0]

    # Teacher forcing: the predecessor of slot (n, k) is input_ids[anchor + k - 1].
    slot = (anchors[:, :, None] + torch.arange(bs)[None, None, :]).reshape(B, N * bs)
    lag = 0 if broken == "predecessor" else 1
    pred = ids.gather(1, (slot - lag).clamp(0, S - 1))
    stop = d2["selector_stop_gradient"]
    u_sel, y_sel = (u.detach(), y.detach()) if stop else (u, y)
    cands = u.detach().topk(K, dim=-1).indices  # sorted, candidate K last
    cov = (cands == labels[..., None]).any(-1)
    if d2["selector_gold"] == "inject":
        # A label missing from the top K takes candidate K's place.
        last = torch.where(cov, cands[..., -1], labels)
        cands = torch.cat([cands[..., :-1], last[..., None]], -1)
        cov = torch.ones_like(cov)
    s = selector_scores(u_sel, y_sel, pred, cands, P)
    gold = (cands == labels[..., None]).to(dtype).argmax(-1)  # j*, 0 when missing
    ce_s = torch.logsumexp(s, -1) - s.gather(-1, gold[..., None])[..., 0]
    covw = w * cov.to(dtype)
    alpha_t = alpha_at(int(d2["step"]), int(d2["total_steps"]), d2)
    sel = (covw * ce_s).sum()
    if d2["selector_denominator"] == "covered":
        den = covw.sum()
        sel = sel / den if float(den) > 0 else sel * 0.0
    else:
        sel = sel / w.sum()
    loss = (w * ce_u).sum() / w.sum() + alpha_t * sel

    # Acceptance: label among the (uninjected) top K and the selector's pick.
    with torch.no_grad():
        top = u.topk(K, dim=-1).indices
        s_top = selector_scores(u, y, pred, top, P)
        pick = top.gather(-1, s_top.argmax(-1, keepdim=True))[..., 0]
        good = ((w > 0) & (pick == labels)).reshape(B, N, bs)
        runs = torch.cumprod(good[:, :, 1:].long(), dim=2).sum(dim=2)
        tau = float((1 + runs[keep]).double().mean()) if keep.any() else 0.0
        covered = float(cov[w > 0].double().mean()) if (w > 0).any() else 0.0
    loss.backward()
    grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v)) for n, v in params.items()}
    return loss.detach(), grads, tau, alpha_t, covered


def run_step(args):
    tensors, meta = read_safetensors(args.dump)
    cfg = json.loads(meta["config"])
    if "dflash2" not in cfg:
        print("oracle: %s is not the step of a DFlash2 drafter (no dflash2 in its config)" % args.dump)
        return 2
    if args.break_:
        print("oracle: broken on purpose: %s" % BREAKS[args.break_])
    loss, grads, tau, alpha_t, covered = step(tensors, cfg, args.break_)
    d2 = cfg["dflash2"]
    print("oracle: torch %s, gold %s, denominator %s, stop_gradient %s, alpha_t %.6g, "
          "labels in the top %d: %.3f" % (
              torch.__version__, d2["selector_gold"], d2["selector_denominator"],
              str(d2["selector_stop_gradient"]).lower(), alpha_t, d2["selector_top_k"], covered))
    print("oracle: unary transform: output_multiplier %.6g, final_logit_softcapping %.6g" % (
        d2.get("output_multiplier", 1.0), d2.get("final_logit_softcapping", 0.0)))
    problems = []
    if args.alpha_t is not None and abs(alpha_t - args.alpha_t) > 1e-12:
        problems.append("alpha_t %.6g, the test expects %.6g" % (alpha_t, args.alpha_t))
    worst = rel(float(loss), float(tensors["result.loss"]))
    print("oracle: loss torch %.12f reference %.12f rel err %.2e" % (
        float(loss), float(tensors["result.loss"]), worst))
    ref_tau = float(tensors["result.tau"])
    print("oracle: tau torch %.6f reference %.6f" % (tau, ref_tau))
    worst = max(worst, rel(tau, ref_tau))
    names = sorted(grads)
    for name in names:
        key = "gradient." + name
        if key not in tensors:
            problems.append("the dump has no " + key)
            continue
        err = rel(grads[name].numpy(), tensors[key])
        worst = max(worst, err)
        print("oracle: gradient %-55s rel err %.2e" % (name, err))
    if len(names) != cfg["num_parameters"]:
        problems.append("%d parameters, the dump's config says %d" % (len(names), cfg["num_parameters"]))
    for p in problems:
        print("oracle: " + p)
    ok = worst < args.tolerance and not problems
    print("oracle: %d gradients, worst rel err %.2e (tolerance %.0e): %s" %
          (len(names), worst, args.tolerance, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


# --- perturb -----------------------------------------------------------------

def to_bf16_bits(values):
    """Round to nearest even, as float32 -> bfloat16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_bf16_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        blob = to_bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def perturbed(name, value, rng):
    shape = value.shape
    if name.endswith("norm.weight"):
        return 1 + 0.1 * rng.standard_normal(shape)
    if name.endswith("base_kernel"):  # [2, kc, H]: tap 0 near 1, the others near 0
        out = 0.3 * rng.standard_normal(shape)
        out[:, 0, :] += 1
        return out
    if name.endswith("kernel_projection.weight"):
        return 0.02 * rng.standard_normal(shape)
    if name.endswith("_codebook"):
        return rng.standard_normal(shape)
    if name.endswith("hidden_projection.weight"):
        return 0.1 * rng.standard_normal(shape)
    return value


def run_perturb(args):
    tensors, _ = read_safetensors(os.path.join(args.init, "model.safetensors"))
    rng = np.random.default_rng(args.seed)
    out = {name: perturbed(name, tensors[name], rng) for name in sorted(tensors)}
    os.makedirs(args.out, exist_ok=True)
    write_bf16_safetensors(os.path.join(args.out, "model.safetensors"), out)
    with open(os.path.join(args.init, "config.json")) as f:
        config = f.read()
    with open(os.path.join(args.out, "config.json"), "w") as f:
        f.write(config)
    changed = sum(1 for n in tensors if out[n] is not tensors[n])
    print("perturb: %d of %d tensors redrawn, seed %d" % (changed, len(tensors), args.seed))
    return 0


# --- export ------------------------------------------------------------------

def dtypes(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def section13_shapes(cfg):
    """Every tensor of the exported drafter and its shape, from config.json:
    section 6's, plus the convolutions and the selector of section 13."""
    dc = cfg["dflash_config"]
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    kc, gs, r = dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"]
    want = {"fc.weight": [H, len(dc["target_layer_ids"]) * H],
            "hidden_norm.weight": [H], "norm.weight": [H],
            "candidate_selector.hidden_projection.weight": [r, H],
            "candidate_selector.predecessor_codebook": [V, r],
            "candidate_selector.successor_codebook": [V, r]}
    for i in range(cfg["num_hidden_layers"]):
        p = "layers.%d." % i
        want.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                     p + "self_attn.q_proj.weight": [nh * d, H], p + "self_attn.k_proj.weight": [nkv * d, H],
                     p + "self_attn.v_proj.weight": [nkv * d, H], p + "self_attn.o_proj.weight": [H, nh * d],
                     p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                     p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                     p + "mlp.down_proj.weight": [H, I]})
        for conv in ("attention_conv", "mlp_conv"):
            want[p + conv + ".base_kernel"] = [2, kc, H]
            want[p + conv + ".kernel_projection.weight"] = [2 * kc * (H // gs), H]
    return want


def run_export(args):
    with open(os.path.join(args.ckpt, "config.json")) as f:
        cfg = json.load(f)
    path = os.path.join(args.ckpt, "model.safetensors")
    kinds = dtypes(path)
    tensors, _ = read_safetensors(path)
    problems = []
    for key, want in [("architectures", ["DFlash2DraftModel"]), ("model_type", "qwen3"),
                      ("is_causal", False), ("hidden_act", "silu"), ("attention_bias", False),
                      ("tie_word_embeddings", False), ("torch_dtype", "bfloat16")]:
        if key not in cfg or cfg[key] != want:
            problems.append("config.json %s = %r, want %r" % (key, cfg.get(key), want))
    for key in ["block_size", "num_target_layers", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "rope_theta", "vocab_size",
                "max_position_embeddings", "layer_types", "dflash_config"]:
        if key not in cfg:
            problems.append("config.json lacks " + key)
    dc = cfg.get("dflash_config", {})
    for key in ["block_size", "mask_token_id", "target_layer_ids", "conv_kernel_size",
                "conv_group_size", "selector_rank", "selector_top_k"]:
        if key not in dc:
            problems.append("config.json dflash_config lacks " + key)
    if dc.get("block_size") != cfg.get("block_size"):
        problems.append("block_size %r at the top level, %r in dflash_config" %
                        (cfg.get("block_size"), dc.get("block_size")))
    if any(t == "sliding_attention" for t in cfg.get("layer_types", [])) and \
            (cfg.get("use_sliding_window") is not True or "sliding_window" not in cfg):
        problems.append("a sliding layer without use_sliding_window: true and sliding_window")
    if problems:
        for p in problems:
            print("export: " + p)
        print("export: FAIL")
        return 1
    want = section13_shapes(cfg)
    if sorted(tensors) != sorted(want):
        problems.append("tensor names differ from section 13's: extra %s, missing %s" %
                        (sorted(set(tensors) - set(want)), sorted(set(want) - set(tensors))))
    for name, shape in sorted(want.items()):
        if name in tensors and (list(tensors[name].shape) != shape or kinds[name] != "BF16"):
            problems.append("%s: %s %s, want %s BF16" % (name, list(tensors[name].shape),
                                                         kinds[name], shape))
    print("export: dflash_config %s" % json.dumps(dc, sort_keys=True))
    for p in problems:
        print("export: " + p)
    print("export: %d tensors, %d config keys: %s" % (len(tensors), len(cfg), "PASS" if not problems else "FAIL"))
    return 1 if problems else 0


# --- walk --------------------------------------------------------------------

def candidates(mask, positions):
    """Section 2 (and 9): a and a + 1 supervised, in one conversation."""
    return [a for a in range(len(mask) - 1)
            if mask[a] and mask[a + 1] and positions[a + 1] == positions[a] + 1]


def run_walk(args):
    dtype = torch.float64
    with open(os.path.join(args.ckpt, "config.json")) as f:
        hf = json.load(f)
    dc = hf["dflash_config"]
    weights, _ = read_safetensors(os.path.join(args.ckpt, "model.safetensors"))
    want = section13_shapes(hf)
    if sorted(weights) != sorted(want):
        print("walk: %s does not hold section 13's tensors: FAIL" % args.ckpt)
        return 1
    params = {n: torch.tensor(v, dtype=dtype) for n, v in weights.items()}
    P = params.__getitem__
    target, _ = read_safetensors(os.path.join(args.target, "model.safetensors"))
    embed = torch.tensor(target["model.embed_tokens.weight"], dtype=dtype)
    lm_head = torch.tensor(target["lm_head.weight"], dtype=dtype) if "lm_head.weight" in target else embed
    shard, _ = read_safetensors(args.shard)
    bs, K = dc["block_size"], dc["selector_top_k"]
    window = hf.get("sliding_window", 0)
    cfg = {"block_size": bs, "num_heads": hf["num_attention_heads"],
           "num_kv_heads": hf["num_key_value_heads"], "head_dim": hf["head_dim"],
           "rms_norm_eps": hf["rms_norm_eps"], "rope_theta": hf["rope_theta"],
           "mask_token_id": dc["mask_token_id"],
           "layers": [{"window": window if kind == "sliding_attention" else 0}
                      for kind in hf["layer_types"]]}
    d2 = {"conv_kernel_size": dc["conv_kernel_size"], "conv_group_size": dc["conv_group_size"]}
    for key in ("output_multiplier", "final_logit_softcapping", "input_embedding_scale"):
        if key in dc:
            d2[key] = dc[key]
    if args.break_:
        print("walk: broken on purpose: %s" % WALK_BREAKS[args.break_])
    problems = []
    rows = blocks = hits = longest = 0
    walked_runs = walked_blocks = 0
    sample = None
    with open(args.serving_dump) as f:
        dumped = [json.loads(line) for line in f if line.strip()]
    for entry in dumped:
        index = args.first_row + entry["row"]
        if index >= shard["input_ids"].shape[0]:
            problems.append("row %d: the shard has %d rows" % (index, shard["input_ids"].shape[0]))
            continue
        ids = torch.tensor(shard["input_ids"][index:index + 1], dtype=torch.int64)
        loss_mask = torch.tensor(shard["loss_mask"][index:index + 1]) != 0
        hidden = torch.tensor(shard["hidden_states"][index:index + 1], dtype=dtype)
        S = ids.shape[1]
        positions = torch.arange(S)[None, :]
        if "position_ids" in shard:
            positions = torch.tensor(shard["position_ids"][index:index + 1], dtype=torch.int64)
        # The same row as the reference walked.
        if [int(m) for m in loss_mask[0]] != entry["loss_mask"] or \
                [int(p) for p in positions[0]] != entry["position_ids"]:
            problems.append("row %d: the shard's loss_mask or position_ids are not the dump's" % index)
            continue
        cands = candidates(entry["loss_mask"], entry["position_ids"])
        if cands != entry["candidates"] or len(entry["runs"]) != len(cands):
            problems.append("row %d: the dump's candidates or runs are not section 2's" % index)
            continue
        rows += 1
        if not cands:
            continue
        anchors = torch.tensor([cands], dtype=torch.int64)
        keep = torch.ones_like(anchors, dtype=torch.bool)
        N = len(cands)
        with torch.no_grad():
            y, u = forward(P, embed, lm_head, ids, hidden, anchors, keep, positions, cfg, d2,
                           args.break_)
            labels, w = labels_and_weights(ids, loss_mask, anchors, keep, positions, bs, 0.0, dtype)
            y, u = y.reshape(N, bs, -1), u.reshape(N, bs, -1)
            labels, w = labels.reshape(N, bs), w.reshape(N, bs)
            # The greedy walk through each block: k = 1's predecessor is the
            # anchor token, each later one the token drafted before it.
            pred = ids[0, anchors[0]]
            drafted = []
            for k in range(1, bs):
                top = u[:, k].topk(K, dim=-1).indices  # [N, K]
                scores = selector_scores(u[:, k], y[:, k], pred, top, P)
                pick = top.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]
                drafted.append(pick)
                if args.break_ != "predecessor":
                    pred = pick
            drafted = torch.stack(drafted, 1)  # [N, bs - 1]
            good = (w[:, 1:] > 0) & (drafted == labels[:, 1:])
            runs = torch.cumprod(good.long(), dim=1).sum(1).tolist()
        blocks += N
        for a, mine, theirs, tokens in zip(cands, runs, entry["runs"], drafted.tolist()):
            if mine == theirs:
                hits += 1
            elif len(problems) < 10:
                problems.append("row %d, anchor %d: run %d, the reference's %d (drafted %s)" %
                                (index, a, mine, theirs, tokens))
            longest = max(longest, mine)
            if sample is None and mine >= 2:
                sample = (index, a, tokens[:mine])
        # The walk as a server drafts (docs/runtime.md, "Serving tau").
        run_at = dict(zip(cands, runs))
        a = cands[0]
        while a is not None:
            walked_runs += 1 + run_at[a]
            walked_blocks += 1
            later = [c for c in cands if c >= a + 1 + run_at[a]]
            a = later[0] if later else None
    print("walk: torch %s, %d rows, runs equal at %d of %d anchor candidates, longest %d" %
          (torch.__version__, rows, hits, blocks, longest))
    if sample:
        print("walk: row %d, anchor %d drafts %s, all accepted" % sample)
    tau = walked_runs / walked_blocks if walked_blocks else 0.0
    if args.line:
        with open(args.line) as f:
            lines = [json.loads(x) for x in f if x.startswith("{") and "eval_serving_tau" in x]
        if not lines:
            problems.append("%s has no eval_serving_tau" % args.line)
        else:
            ref = lines[-1]["eval_serving_tau"]
            print("walk: serving tau torch %.6f reference %.6f" % (tau, ref))
            if abs(tau - ref) > 1e-6 * max(tau, 1.0):
                problems.append("serving tau %.6f, the reference's %.6f" % (tau, ref))
    for p in problems:
        print("walk: " + p)
    ok = not problems and rows == len(dumped) and rows > 0 and hits == blocks
    print("walk: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("perturb", help="redraw a checkpoint's norms, convolutions and selector")
    p.add_argument("init")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("step", help="loss, tau and gradients of a step dump")
    p.add_argument("dump")
    p.add_argument("--alpha-t", type=float, dest="alpha_t")
    p.add_argument("--tolerance", type=float, default=1e-9)
    p.add_argument("--break", dest="break_", choices=sorted(BREAKS))
    p = sub.add_parser("export", help="section 13's names, shapes and config.json")
    p.add_argument("ckpt")
    p = sub.add_parser("walk", help="the greedy walk's runs against the reference's")
    p.add_argument("ckpt")
    p.add_argument("target")
    p.add_argument("shard")
    p.add_argument("first_row", type=int)
    p.add_argument("serving_dump")
    p.add_argument("--line")
    p.add_argument("--break", dest="break_", choices=sorted(WALK_BREAKS))
    args = ap.parse_args()
    torch.manual_seed(0)
    return {"perturb": run_perturb, "step": run_step, "export": run_export,
            "walk": run_walk}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
