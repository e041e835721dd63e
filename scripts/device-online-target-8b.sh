#!/usr/bin/env bash
# The Qwen3-8B-shaped online target at S 3072, on the GPU machine, over
# .device/ (target-features-q8 and train-q8-online, both from
# `dflashc specs/qwen3-8b-b16.toml --target .device/tcfg/q8`).
# 1. transformers makes a random-initialised Qwen3-8B-shaped model on the
#    GPU (layers 0..34: the last tap is 33, and transformers' hidden_states
#    entry of a model's last layer is after the final norm; config.json then
#    says 36, as the spec does) and saves it in 5 GB shards with model.safetensors.index.json;
#    a token shard of 8 rows of 3072 (4 packed with conversations of 64 to
#    1536 tokens, 4 of one conversation).
# 2. target-features writes the features of rows 0..3; each conversation alone
#    through transformers in fp32 (and in bf16, the noise floor) is the
#    reference, as in scripts/device-online-target-check.sh.
# 3. train-q8-online trains qwen3-8b-b16 on the token shard for 8 steps,
#    computing the features with the compiled target every step: the online
#    step time, the target's share and the device memory of both together.
# Logs to $OUT; the checkpoint and the run are deleted afterwards.
set -u
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-online-8b
W=/tmp/online-8b
rm -rf $W && mkdir -p $W/tokens
timeout 420 python3 - $D $W <<'PY' 2>&1 | grep -v "Writing\|Loading\|deprecated"
import json, os, subprocess, sys, time
import numpy as np
import torch
from safetensors.torch import load_file
sys.path.insert(0, "scripts")
from device_rows import make_q8_target, write_q8_tokens
D, W = sys.argv[1:3]
taps = [1, 9, 17, 25, 33]
t0 = time.time()
cfg, model = make_q8_target(D + "/tcfg/q8", W + "/t8")
print("saved the target in %.0f s: %s" % (time.time() - t0, sorted(os.listdir(W + "/t8"))))
R, S = 8, 3072
ids, pos = write_q8_tokens(W + "/tokens/shard-00000.safetensors", cfg.vocab_size, R, S)
if os.environ.get("CHECK", "1") == "0":  # the training runs only
    sys.exit(0)
rc = subprocess.run([D + "/bin/target-features-q8", "--target", W + "/t8", "--rows",
                     W + "/tokens/shard-00000.safetensors", "-o", W + "/features.safetensors"]).returncode
print("target-features rc=%d (%.0f s)" % (rc, time.time() - t0))
if rc:
    sys.exit(1)
got = load_file(W + "/features.safetensors")["hidden_states"][:4].float()
def reference(m):
    out_f = torch.zeros_like(got)
    for r in range(4):
        starts = [t for t in range(S) if pos[r, t] == 0] + [S]
        for s, e in zip(starts, starts[1:]):
            with torch.no_grad():
                out = m(input_ids=torch.tensor(ids[r:r + 1, s:e]).long().cuda(),
                        output_hidden_states=True)
            out_f[r, s:e] = torch.cat([out.hidden_states[l + 1][0] for l in taps], -1).float().cpu()
    return out_f
ref16 = reference(model)
ref = reference(model.float())
del model
torch.cuda.empty_cache()
err = lambda x: (((x - ref).norm() / ref.norm()).item(),
                 ((x - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item())
(whole, tok), (whole16, tok16) = err(got), err(ref16)
print("qwen3-8b-shaped, 4 x 3072 (2 rows packed): relative error against transformers fp32: "
      "compiled %.2e whole, %.2e worst token; transformers bf16 %.2e, %.2e: %s (%.0f s)"
      % (whole, tok, whole16, tok16,
         "PASS" if whole <= 1.5 * whole16 and tok <= 1.5 * tok16 else "FAIL", time.time() - t0))
PY
# 4. Again (the step's dQ adds are float atomics, so two runs differ by
#    rounding: the noise floor), then with the target on a thread and stream
#    of its own on the same GPU (--target-gpus 0 --gpus 0), which must stay
#    within that noise; its step time shows what overlapping the two on one
#    GPU gives. The runs' output goes to /tmp, their logs to $OUT.
for run in q8-online q8-online-again q8-online-apart; do
  extra=""
  [[ $run == q8-online-apart ]] && extra="--target-gpus 0 --gpus 0"
  timeout 240 $D/bin/train-q8-online --target $W/t8 --data $W/tokens --steps 8 --seed 0 \
    --out /tmp/$run --log $O/$run.jsonl $extra > /tmp/$run.out 2>&1
  echo "$run rc=$?"; grep -a "online target\|in use\|error" /tmp/$run.out | head -n 5
  rm -rf /tmp/$run
done
rm -rf $W
python3 - $O <<'PY'
import json, os, sys, statistics as st
def load(n):
    p = os.path.join(sys.argv[1], n + ".jsonl")
    return [json.loads(l) for l in open(p) if l.startswith('{"step')] if os.path.exists(p) else []
on, again, apart = load("q8-online"), load("q8-online-again"), load("q8-online-apart")
if not (len(on) == len(again) == len(apart) == 8):
    sys.exit("missing steps: %d %d %d" % (len(on), len(again), len(apart)))
rel = lambda a, b, k: max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b))
r, a = on[3:], apart[3:]
print("qwen3-8b-b16 online, median of steps 3..7: %.1f ms a step, target %.1f ms, drafter %.1f ms"
      % (st.median(x["step_ms"] for x in r), st.median(x["target_ms"] for x in r),
         st.median(x["compute_ms"] - x["target_ms"] for x in r)))
print("target on its own thread and stream of the same GPU: %.1f ms a step, target %.1f ms, "
      "waited %.1f ms" % (st.median(x["step_ms"] for x in a), st.median(x["target_ms"] for x in a),
      st.median(x["feature_wait_ms"] for x in a)))
print("losses: " + "; ".join("%d: %.6f %.6f %.6f" % (x["step"], x["loss"], y["loss"], z["loss"])
                             for x, y, z in zip(on, again, apart)))
noise = max(rel(again, on, "loss"), rel(again, on, "grad_norm"))
diff = max(rel(apart, on, "loss"), rel(apart, on, "grad_norm"))
print("max relative difference of loss and grad_norm over 8 steps: run to run %.2e, target apart "
      "%.2e: %s" % (noise, diff, "PASS" if diff <= max(4 * noise, 1e-4) else "FAIL"))
PY
