#!/usr/bin/env python3
"""Random Hugging Face targets, token rows, and the compiled target's
features against transformers, for the online suites of device-check.

  hf_targets.py small-features DEVICE WORK [KIND...]
      a small random Qwen3, a Llama-3 with rope scaling, a Qwen3-MoE, a
      gpt-oss, a Qwen3.5 and a Qwen3.5-MoE hybrid, a Qwen3-Next
      (DEVICE/tcfg/{qwen3,llama,qwen3moe,gptoss,qwen35,qwen35moe,qwen3next},
      tiny's shapes; gptoss-mxfp4:
      the gpt-oss with MXFP4 experts; KIND picks some)
      saved with save_pretrained, 6 rows of 128 tokens (4 packed),
      target-features-{tq,tl,tm} on them, and each conversation alone
      through transformers in fp32 (the reference) and in bf16 (its own
      noise floor); for the MoE also the share of tokens (x sparse layers)
      whose top-k experts the compiled target (target-features --experts)
      and transformers' bf16 forward each choose differently from its fp32
      one, and the layout save_pretrained wrote the experts in
  hf_targets.py q8-target DEVICE WORK [--features]
      the random Qwen3-8B-shaped target (DEVICE/tcfg/q8) in WORK/t8 and a
      token shard of 8 rows of 3072 in WORK/tokens; --features: also
      target-features-q8's features of rows 0..3 against transformers
  hf_targets.py q8-forward DEVICE
      transformers' forward of the Qwen3-8B-shaped target's tapped layers
      (0..33, sdpa, bf16) on 4 x 3072 tokens, timed
  hf_targets.py forward DEVICE CONFIG LAYERS [--compile]
      the same for DEVICE/tcfg/CONFIG's first LAYERS layers, eager or under
      torch.compile
  hf_targets.py a3b-tokens WORK [--seq S] [--whole]
      a token shard of qwen3-coder-30b-a3b-b16's shape (8 rows of 3072 or
      S, the even rows packed; --whole: none) in WORK/tokens; q36-tokens: qwen3.6-27b-b16's;
      q38-tokens: qwen3.8-27b-dflash2-b8's; q8-tokens: qwen3-8b-b16's
  hf_targets.py oracle DIR
      test/Reference/target_oracle.py's checkpoints in DIR/{qwen3,llama}
      through transformers against dflash-target-features' CPU features
  hf_targets.py random-decoder CONFIG_DIR OUT_DIR SEED
      a small random decoder of CONFIG_DIR/config.json, saved in OUT_DIR

Each prints one JSON line per target: the relative errors (whole tensor and
worst token) that the suite's checks hold against their limits. Needs torch,
transformers and safetensors (the GPU machine's python3).
"""

import argparse
import json
import os
import subprocess
import sys
import time

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


def each_conversation(model, ids, pos, rows, **outputs):
    """(row, start, end, model output) for each conversation of rows
    0..rows-1, run alone from position 0 through `model` with `outputs`."""
    import torch
    seq = ids.shape[1]
    for r in range(rows):
        starts = [t for t in range(seq) if pos[r, t] == 0] + [seq]
        for s, e in zip(starts, starts[1:]):
            with torch.no_grad():
                yield r, s, e, model(
                    input_ids=torch.as_tensor(ids[r:r + 1, s:e]).long().to(model.device),
                    **outputs)


def conversation_features(model, ids, pos, taps, rows, like, routes=None):
    """The reference: each conversation of rows 0..rows-1 alone from
    position 0 through `model` (tap l is hidden_states[l + 1]), the taps
    concatenated, in float32 on the CPU, shaped like `like`. With a list
    `routes` (a mixture-of-experts model), the same forward also appends
    each sparse layer's sorted top-k experts of the conversation's tokens,
    [layers, tokens, k]."""
    import torch
    out = torch.zeros_like(like)
    outputs = {"output_hidden_states": True}
    if routes is not None:
        outputs["output_router_logits"] = True
    for r, s, e, result in each_conversation(model, ids, pos, rows, **outputs):
        out[r, s:e] = torch.cat([result.hidden_states[l + 1][0] for l in taps],
                                -1).float().cpu()
        if routes is not None:
            k = model.config.num_experts_per_tok
            routes.append(torch.stack([l.float().topk(k, dim=-1).indices.sort(-1).values
                                       for l in result.router_logits]).cpu())
    return out


def sparse_layer_ids(cfg):
    """The layers whose MLP routes tokens to experts, as transformers builds
    them: every gpt-oss layer; a Qwen3-MoE layer unless mlp_only_layers
    names it or decoder_sparse_step skips it."""
    if cfg.model_type == "gpt_oss":
        return list(range(cfg.num_hidden_layers))
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    dense = set(getattr(cfg, "mlp_only_layers", []) or [])
    return [i for i in range(cfg.num_hidden_layers)
            if i not in dense and cfg.num_experts > 0 and (i + 1) % step == 0]


def compiled_routes(path, cfg, reference):
    """target-features --experts' ids, sorted per token, [layers, R*S, k] in
    layer order, and the matching layers of `reference` (transformers'
    [its router layers, tokens, k]: the compiled target runs up to the last
    tap only)."""
    import torch
    import safetensors.torch
    tensors = safetensors.torch.load_file(path)
    by_layer = sorted((int(name.split(".")[2]), t) for name, t in tensors.items())
    compiled = torch.stack([t.reshape(-1, t.shape[-1]).long().sort(-1).values
                            for _, t in by_layer])
    sparse = sparse_layer_ids(cfg)
    rank = {layer: j for j, layer in enumerate(sparse)}
    if reference.shape[0] == cfg.num_hidden_layers:  # a router output per layer
        rank = {layer: layer for layer in sparse}
    matching = reference[[rank[layer] for layer, _ in by_layer]]
    if matching.shape != compiled.shape:
        raise SystemExit(f"hf_targets: {path}: expert ids {list(compiled.shape)} against "
                         f"transformers' {list(matching.shape)}")
    return compiled, matching


def topk_differ_pct(got, ref):
    """Percent of (layer, token) pairs whose sorted top-k sets differ."""
    return 100 * (got != ref.long()).any(-1).float().mean().item()


def relative_errors(got, ref):
    """(whole tensor, worst token) relative errors of got against ref."""
    whole = ((got - ref).norm() / ref.norm()).item()
    token = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    return whole, token


def save_random_decoder(config_dir, out_dir, seed):
    """A small random decoder of config_dir's config.json (bf16), its
    weights wider than the default init so that every layer changes the
    residual stream, saved with save_pretrained. Returns (config, model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    if "linear_attention" in (getattr(cfg, "layer_types", None) or []):
        # A hybrid: zero-centred norms near 0, a decay the recurrence
        # reaches back through (hf_hybrid.py's rule).
        from hf_hybrid import init_weights
        init_weights(model)
        model.save_pretrained(out_dir, safe_serialization=True)
        return cfg, model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # transformers 5 keeps a MoE's experts as [E, ...]
                p.normal_(0, 0.08 if "embed" not in name else 0.5)
            else:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return cfg, model


def make_q8_target(config_dir, out_dir):
    """A random Qwen3-8B-shaped model (bf16, on the GPU) saved in 5 GB
    shards with model.safetensors.index.json: layers 0..34 (the last tap,
    33, must not be the model's last layer, whose hidden_states entry
    transformers gives after the final norm); its config.json then says 36,
    as the spec does (layers 34 and 35 are never read)."""
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
    with open(os.path.join(out_dir, "config.json")) as f:
        saved = json.load(f)
    saved["num_hidden_layers"] = 36
    if "layer_types" in saved:
        saved["layer_types"] = saved["layer_types"][:1] * 36
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(saved, f)
    return cfg, model


Q8_SHARD = {"target": "Qwen/Qwen3-8B", "target_layer_ids": "[1, 9, 17, 25, 33]",
            "hidden_size": "4096"}
A3B_SHARD = {"target": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
             "target_layer_ids": "[1, 7, 14, 20, 26, 32, 39, 45]", "hidden_size": "2048"}
Q36_SHARD = {"target": "Qwen/Qwen3.6-27B", "target_layer_ids": "[1, 16, 31, 46, 61]",
             "hidden_size": "5120"}
Q38_SHARD = {"target": "Qwen/Qwen3.8-27B", "target_layer_ids": "[5, 19, 33, 47, 61]",
             "hidden_size": "5120"}
TINY_SHARD = {"target": "dflash-synth/tiny-target", "target_layer_ids": "[1, 5]",
              "hidden_size": "256"}
# The token shards `SPEC-tokens WORK` writes: the shard's metadata, the vocabulary.
TOKEN_SHARDS = {"q8": (Q8_SHARD, 151936), "a3b": (A3B_SHARD, 151936),
                "q36": (Q36_SHARD, 248320), "q38": (Q38_SHARD, 248320),
                "tiny": (TINY_SHARD, 1024)}


def write_q8_tokens(path, vocab_size, rows=8, seq=3072, spec=Q8_SHARD, packed=True):
    """A token shard of qwen3-8b-b16's shape (or `spec`'s target): random
    ids, the even rows packed with conversations of 64 to 1536 tokens (all
    rows one conversation without `packed`), the odd rows one conversation
    each. Returns (ids, pos)."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab_size, size=(rows, seq)).astype(np.int32)
    pos = packed_positions(rng, rows, seq, lambda r: packed and r % 2 == 0,
                           lambda g: int(g.integers(64, 1537)))
    meta = dict(spec, format="dflash-token-shard", format_version="1", seq_len=str(seq),
                packed="true")
    save_file({"input_ids": ids, "position_ids": pos,
               "loss_mask": np.ones((rows, seq), dtype=np.uint8),
               "num_tokens": np.full((rows,), seq, dtype=np.int32)}, path, meta)
    return ids, pos


SMALL_TARGETS = {"qwen3": "target-features-tq", "llama": "target-features-tl",
                 "qwen3moe": "target-features-tm", "gptoss": "target-features-tg",
                 "gptoss-mxfp4": "target-features-tg", "qwen35": "target-features-th",
                 "qwen35moe": "target-features-thm", "qwen3next": "target-features-tn"}
MOE_TARGETS = ("qwen3moe", "gptoss", "gptoss-mxfp4", "qwen35moe", "qwen3next")
# Without KINDS: those online-features prepares (the hybrids have a suite
# of their own, online-features-hybrid).
DEFAULT_SMALL_TARGETS = ("qwen3", "llama", "qwen3moe", "gptoss", "gptoss-mxfp4")
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def write_mxfp4_copy(folder, out_dir, seed):
    """The gpt-oss checkpoint in `folder` again in the official layout, its
    experts as MXFP4 (random blocks and scales, "<proj>_blocks" [E, R,
    C/32, 16] and "<proj>_scales" [E, R, C/32] uint8, outputs first), and
    the same experts dequantised by transformers' own convert_moe_packed_
    tensors written back into `folder`'s bf16 layout, so that transformers
    runs the model the MXFP4 file holds. Returns nothing."""
    import glob
    import shutil
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(seed)
    os.makedirs(out_dir, exist_ok=True)
    (path,) = glob.glob(os.path.join(folder, "*.safetensors"))
    tensors = load_file(path)
    packed, plain = {}, {}
    for name, t in tensors.items():
        if not (name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj")):
            packed[name] = plain[name] = t
            continue
        E, rows, cols = t.shape[0], t.shape[2], t.shape[1]  # bf16 is [E, in, out]
        blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(118, 125, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        # transformers' dequantisation gives its bf16 layout [E, in, out].
        plain[name] = convert_moe_packed_tensors(blocks, scales).to(torch.bfloat16).contiguous()
    save_file(packed, os.path.join(out_dir, "model.safetensors"), {"format": "pt"})
    save_file(plain, path, {"format": "pt"})
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(folder, extra)):
            shutil.copy(os.path.join(folder, extra), out_dir)


def expert_layout(folder):
    """How save_pretrained stored the experts: per expert or fused."""
    from safetensors import safe_open
    import glob
    names = []
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        with safe_open(path, "pt") as f:
            names += list(f.keys())
    if any(n.endswith("mlp.experts.gate_up_proj_blocks") for n in names):
        return "MXFP4 (experts.gate_up_proj_blocks, _scales)"
    if any(n.endswith("mlp.experts.gate_up_proj_bias") for n in names):
        return "gpt-oss bf16 (experts.gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H])"
    if any(n.endswith("mlp.experts.gate_up_proj") for n in names):
        return "fused (experts.gate_up_proj, experts.down_proj)"
    if any(".mlp.experts.0.gate_proj.weight" in n for n in names):
        return "per expert (experts.J.gate_proj.weight ...)"
    return "no experts found"


def small_features(device, work, kinds):
    import torch
    import safetensors.torch
    import transformers
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM
    taps = [1, 5]  # specs/tiny.toml's spread rule over 8 layers
    failed = False
    for kind in kinds or DEFAULT_SMALL_TARGETS:
        binary = SMALL_TARGETS[kind]
        folder = os.path.join(work, kind)
        if kind == "gptoss-mxfp4":
            # transformers reads the bf16 copy of the experts the MXFP4
            # file holds; the compiled target reads the MXFP4 file.
            cfg, _ = save_random_decoder(os.path.join(device, "tcfg", "gptoss"),
                                         folder + "-bf16", seed=5)
            write_mxfp4_copy(folder + "-bf16", folder, seed=6)
        else:
            cfg, _ = save_random_decoder(os.path.join(device, "tcfg", kind), folder, seed=3)
        model_folder = folder + "-bf16" if kind == "gptoss-mxfp4" else folder
        rng = np.random.default_rng(4)
        seq, rows = 128, 6
        ids = rng.integers(0, cfg.vocab_size, size=(rows, seq)).astype(np.int32)
        pos = packed_positions(rng, rows, seq, lambda r: r < 4,
                               lambda g: int(g.choice([1, 2, 7, 30, 64, 90])))
        tokens = os.path.join(folder, "tokens.safetensors")
        save_file({"input_ids": ids, "position_ids": pos,
                   "loss_mask": np.ones((rows, seq), dtype=np.uint8)}, tokens,
                  {"format": "dflash-token-shard", "format_version": "1"})
        features = os.path.join(folder, "features.safetensors")
        experts = os.path.join(folder, "experts.safetensors")
        command = [os.path.join(device, "bin", binary), "--target", folder, "--rows",
                   tokens, "-o", features]
        if kind in MOE_TARGETS:
            command += ["--experts", experts]
        rc = subprocess.run(command).returncode
        if rc != 0:
            print(f"hf_targets: {binary} exited {rc}", file=sys.stderr)
            failed = True
            continue
        got = safetensors.torch.load_file(features)["hidden_states"].float()
        references, routes = {}, {}
        for dtype in (torch.float32, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(model_folder,
                                                         dtype=dtype).cuda().eval()
            chosen = [] if kind in MOE_TARGETS else None
            references[dtype] = conversation_features(model, ids, pos, taps, rows, got,
                                                      routes=chosen)
            if chosen:
                routes[dtype] = torch.cat(chosen, dim=1)  # [layers, tokens, k]
            name = type(model).__name__
            del model
        whole, token = relative_errors(got, references[torch.float32])
        whole16, token16 = relative_errors(references[torch.bfloat16], references[torch.float32])
        line = {"target": kind, "model": name, "transformers": transformers.__version__,
                "whole": whole, "worst_token": token,
                "whole_bf16": whole16, "worst_token_bf16": token16}
        if len(routes) == 2:
            line["topk_differ_pct"] = topk_differ_pct(routes[torch.bfloat16],
                                                      routes[torch.float32])
            compiled, layers = compiled_routes(experts, cfg, routes[torch.float32])
            line["topk_differ_pct_compiled"] = topk_differ_pct(compiled, layers)
            _, layers16 = compiled_routes(experts, cfg, routes[torch.bfloat16])
            line["topk_differ_pct_compiled_vs_bf16"] = topk_differ_pct(compiled, layers16)
        if kind in MOE_TARGETS:
            line["expert_layout"] = expert_layout(folder)
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def q8_target(device, work, features):
    from safetensors.torch import load_file
    start = time.time()
    cfg, model = make_q8_target(os.path.join(device, "tcfg", "q8"), os.path.join(work, "t8"))
    os.makedirs(os.path.join(work, "tokens"), exist_ok=True)
    shard = os.path.join(work, "tokens", "shard-00000.safetensors")
    ids, pos = write_q8_tokens(shard, cfg.vocab_size)
    print(f"hf_targets: the target and the token shard saved in {time.time() - start:.0f} s",
          file=sys.stderr)
    if not features:
        return 0
    out = os.path.join(work, "features.safetensors")
    rc = subprocess.run([os.path.join(device, "bin", "target-features-q8"), "--target",
                         os.path.join(work, "t8"), "--rows", shard, "-o", out]).returncode
    if rc != 0:
        print(f"hf_targets: target-features-q8 exited {rc}", file=sys.stderr)
        return 1
    rows, taps = 4, [1, 9, 17, 25, 33]
    got = load_file(out)["hidden_states"][:rows].float()
    ref16 = conversation_features(model, ids, pos, taps, rows, got)
    ref = conversation_features(model.float(), ids, pos, taps, rows, got)
    whole, token = relative_errors(got, ref)
    whole16, token16 = relative_errors(ref16, ref)
    print(json.dumps({"target": "q8", "whole": whole, "worst_token": token,
                      "whole_bf16": whole16, "worst_token_bf16": token16,
                      "seconds": round(time.time() - start)}), flush=True)
    return 0


def linear_attention_kernels(model):
    """For a hybrid (Gated DeltaNet) model, which kernels transformers ran:
    the function its first DeltaNet layer holds as chunk_gated_delta_rule
    (flash-linear-attention's, or transformers' torch fallback), and whether
    it has causal-conv1d's kernel; "" for any other model."""
    for layer in model.modules():
        rule = getattr(layer, "chunk_gated_delta_rule", None)
        if rule is None:
            continue
        conv = getattr(layer, "causal_conv1d_fn", None)
        return ", delta rule %s.%s, conv %s" % (
            getattr(rule, "__module__", "?"), getattr(rule, "__name__", type(rule).__name__),
            "causal-conv1d" if conv is not None else "torch fallback")
    return ""


def forward_bench(device, config_name, layers, compiled=False):
    """transformers' forward of DEVICE/tcfg/CONFIG's first `layers` layers
    (random weights, bf16, sdpa) on 4 x 3072 tokens, timed (median of 5
    after 3 warm-up); `compiled`: under torch.compile."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(os.path.join(device, "tcfg", config_name))
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:layers]
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).model.eval()
    ids = torch.randint(0, cfg.vocab_size, (4, 3072), device="cuda")
    run = torch.compile(model) if compiled else model
    torch.cuda.reset_peak_memory_stats()
    times = []
    start_all = time.perf_counter()
    with torch.no_grad():
        for _ in range(8):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(input_ids=ids, output_hidden_states=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
    ms = sorted(times[3:])[len(times[3:]) // 2]
    experts = getattr(cfg, "_experts_implementation", None)
    mode = "transformers sdpa bf16%s, %d layers%s%s" % (
        ", torch.compile" if compiled else "", layers,
        ", experts %s" % experts if experts else "", linear_attention_kernels(model))
    print(json.dumps({"mode": mode, "ms": round(ms, 2),
                      "tokens_per_s": round(4 * 3072 / ms * 1e3),
                      "first_s": round(times[0] / 1e3, 1),
                      "total_s": round(time.perf_counter() - start_all, 1),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))
    return 0


def oracle(folder):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    taps = [1, 2]  # test/Reference/Inputs/small-online.toml
    for kind in ("qwen3", "llama"):
        d = os.path.join(folder, kind)
        model = AutoModelForCausalLM.from_pretrained(d).float().eval()
        rows = load_file(os.path.join(d, "tokens.safetensors"))
        got = load_file(os.path.join(d, "features.safetensors"))["hidden_states"].float()
        ids, pos = rows["input_ids"].long().numpy(), rows["position_ids"].long().numpy()
        ref = conversation_features(model, ids, pos, taps, ids.shape[0], got)
        _, token = relative_errors(got, ref)
        print(json.dumps({"target": kind, "model": type(model).__name__, "worst_token": token}))
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "small-features" and set(argv[3:]) <= set(SMALL_TARGETS):
        return small_features(argv[1], argv[2], argv[3:])
    if len(argv) in (3, 4) and argv[0] == "q8-target" and argv[3:] in ([], ["--features"]):
        return q8_target(argv[1], argv[2], argv[3:] == ["--features"])
    if len(argv) == 2 and argv[0] == "q8-forward":
        return forward_bench(argv[1], "q8", 34)  # layers 0..33: the last tap is 33
    if len(argv) in (4, 5) and argv[0] == "forward" and argv[4:] in ([], ["--compile"]):
        return forward_bench(argv[1], argv[2], int(argv[3]), argv[4:] == ["--compile"])
    if len(argv) >= 2 and argv[0].endswith("-tokens") and argv[0][:-7] in TOKEN_SHARDS:
        spec, vocab = TOKEN_SHARDS[argv[0][:-7]]
        options = argparse.ArgumentParser(prog=f"hf_targets.py {argv[0]}")
        options.add_argument("work")
        options.add_argument("--seq", type=int, default=3072)
        options.add_argument("--whole", action="store_true",
                             help="every row one conversation (default: even rows packed)")
        args = options.parse_args(argv[1:])
        os.makedirs(os.path.join(args.work, "tokens"), exist_ok=True)
        write_q8_tokens(os.path.join(args.work, "tokens", "shard-00000.safetensors"), vocab,
                        seq=args.seq, spec=spec, packed=not args.whole)
        return 0
    if len(argv) == 2 and argv[0] == "oracle":
        return oracle(argv[1])
    if len(argv) == 4 and argv[0] == "random-decoder":
        save_random_decoder(argv[1], argv[2], int(argv[3]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
