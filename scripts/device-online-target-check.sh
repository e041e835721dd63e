#!/usr/bin/env bash
# The compiled online target on the GPU machine, over .device/ (see below).
# 1. CausalAttentionGpuTest (the packed causal attention against the CPU
#    reference).
# 2. For a small random Qwen3 and a small Llama-3 with rope scaling (the
#    configs in .device/tcfg/{qwen3,llama}, tiny's shapes, head dim 64):
#    transformers builds each from its config.json with random weights and
#    saves it (save_pretrained, bf16 safetensors); a token shard of 6 rows
#    of 128 tokens (4 packed with conversations of 1 to 90 tokens, 2 of one
#    conversation); target-features (compiled by dflashc tiny.toml --target)
#    writes their features; each conversation alone through transformers
#    (fp32 on the same bf16 weights, output_hidden_states, tap l at index
#    l + 1) must match within bf16 noise: the compiled features' relative
#    error (whole tensor, and the worst token) at most 1.5x that of
#    transformers itself run in bf16 on the same conversations.
# 3. Throughput of the Qwen3-8B-shaped target (.device/tcfg/q8, random
#    weights) at 4 x 3072 tokens, unpacked and packed, by target-features
#    --bench, with the GEMM algorithms timing chose, with cuBLASLt's first
#    choices (--no-gemm-timing) and launched op by op (--no-graph), and
#    transformers' forward of the same layers (0..33, sdpa, bf16) in the
#    same call.
# CHECK=0 skips 1 and 2, BENCH=0 skips 3, UNTIMED=0 the --no-gemm-timing
# runs of 3, EAGER=0 its --no-graph runs (the program launched op by op; by
# default --bench replays it as one CUDA graph, as train does).
# Needs in .device/bin: CausalAttentionGpuTest, target-features-tq,
# target-features-tl (1 and 2), target-features-q8 (3). Logs to $OUT.
set -u
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-online-target
if [[ ${CHECK:-1} == 1 ]]; then
run_gpu_test $D/bin/CausalAttentionGpuTest $O 120

W=/tmp/online-target
rm -rf $W && mkdir -p $W
timeout 300 python3 - $D $W $O <<'PY'
import json, os, subprocess, sys
import numpy as np
import torch
from safetensors.numpy import save_file, load_file
from transformers import AutoConfig, AutoModelForCausalLM
sys.path.insert(0, "scripts")
from device_rows import packed_positions, save_random_decoder
D, W, O = sys.argv[1:4]
taps = [1, 5]  # specs/tiny.toml's spread rule over 8 layers
ok = True
for kind, binary in [("qwen3", "target-features-tq"), ("llama", "target-features-tl")]:
    d = os.path.join(W, kind)
    cfg, model = save_random_decoder(os.path.join(D, "tcfg", kind), d, seed=3)
    rng = np.random.default_rng(4)
    S, R = 128, 6
    ids = rng.integers(0, cfg.vocab_size, size=(R, S)).astype(np.int32)
    pos = packed_positions(rng, R, S, lambda r: r < 4,
                           lambda g: int(g.choice([1, 2, 7, 30, 64, 90])))
    save_file({"input_ids": ids, "position_ids": pos,
               "loss_mask": np.ones((R, S), dtype=np.uint8)},
              os.path.join(d, "tokens.safetensors"),
              {"format": "dflash-token-shard", "format_version": "1"})
    rc = subprocess.run([os.path.join(D, "bin", binary), "--target", d, "--rows",
                         os.path.join(d, "tokens.safetensors"), "-o",
                         os.path.join(d, "features.safetensors")]).returncode
    if rc != 0:
        print("%s: target-features rc=%d: FAIL" % (kind, rc)); ok = False; continue
    import safetensors.torch as st
    got = st.load_file(os.path.join(d, "features.safetensors"))["hidden_states"].float()
    def features(dtype):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).cuda().eval()
        out_f = torch.zeros_like(got)
        for r in range(R):
            starts = [t for t in range(S) if pos[r, t] == 0] + [S]
            for s, e in zip(starts, starts[1:]):
                with torch.no_grad():
                    out = m(input_ids=torch.tensor(ids[r:r + 1, s:e]).long().cuda(),
                            output_hidden_states=True)
                out_f[r, s:e] = torch.cat([out.hidden_states[l + 1][0] for l in taps],
                                          -1).float().cpu()
        return m, out_f
    ref_model, ref = features(torch.float32)
    _, ref16 = features(torch.bfloat16)
    err = lambda x: (((x - ref).norm() / ref.norm()).item(),
                     ((x - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item())
    (whole, tok), (whole16, tok16) = err(got), err(ref16)
    passed = whole <= 1.5 * whole16 and tok <= 1.5 * tok16
    ok &= passed
    print("%s (%s): relative error against transformers fp32: compiled %.2e whole, %.2e "
          "worst token; transformers bf16 %.2e, %.2e: %s"
          % (kind, type(ref_model).__name__, whole, tok, whole16, tok16,
             "PASS" if passed else "FAIL"))
sys.exit(0 if ok else 1)
PY
echo "transformers check rc=$?"
fi

if [[ ${BENCH:-1} == 1 ]]; then
for packed in "" "--packed"; do
  for gemms in "" $([[ ${UNTIMED:-1} == 1 ]] && echo --no-gemm-timing) \
      $([[ ${EAGER:-1} == 1 ]] && echo --no-graph); do
    b=bench$packed$gemms
    timeout 200 $D/bin/target-features-q8 --bench 10 $packed $gemms > $O/$b.json 2> $O/$b.err
    echo "target-features --bench $packed $gemms rc=$? $(cat $O/$b.json)"; tail -n 2 $O/$b.err
  done
done
timeout 240 python3 - $D <<'PY'
import json, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.from_pretrained(sys.argv[1] + "/tcfg/q8")
cfg.num_hidden_layers = 34  # layers 0..33: the last tap is 33
cfg._attn_implementation = "sdpa"
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).model.eval()
ids = torch.randint(0, cfg.vocab_size, (4, 3072), device="cuda")
torch.cuda.reset_peak_memory_stats()
ms = []
with torch.no_grad():
    for i in range(8):
        torch.cuda.synchronize(); t = time.perf_counter()
        model(input_ids=ids, output_hidden_states=True)
        torch.cuda.synchronize(); ms.append((time.perf_counter() - t) * 1e3)
m = sorted(ms[3:])[len(ms[3:]) // 2]
print(json.dumps({"mode": "transformers sdpa bf16, 34 layers", "ms": round(m, 2),
                  "tokens_per_s": round(4 * 3072 / m * 1e3),
                  "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))
PY
echo "transformers bench rc=$?"
fi
