#!/usr/bin/env bash
# The online target on GPUs of its own, on a GPU machine with 2 or more
# GPUs (issue 20), over .device/bin/train-q8-online (`dflashc
# specs/qwen3-8b-b16.toml --target .device/tcfg/q8`).
# 1. transformers makes the random Qwen3-8B-shaped target and a token shard of
#    8 rows of 3072 (scripts/device_rows.py, as device-online-target-8b.sh).
# 2. qwen3-8b-b16, 8 steps each, median of steps 3..7:
#    - the target before every step on GPU 0, and the same on GPU 1 (the
#      run-to-run noise: the attention backward adds dQ with float atomics);
#    - target on GPU 0, drafter on GPU 1 (--target-gpus 0 --gpus 1): the
#      losses within that noise of the first run; the drafter's wait;
#    - with 3 or 4 GPUs: two or three data-parallel drafters with their own
#      targets (--gpus 1,2[,3]) against one target GPU feeding them
#      (--target-gpus 0 --gpus 1,2[,3]).
#    The table gives each run's step time, the target's busy time, the
#    drafters' wait and the tokens/s per drafter GPU: the split that
#    balances the two is the one whose drafters do not wait.
# Logs to $OUT; the checkpoints and the target are deleted afterwards.
set -u
D=.device
O=${OUT:-/tmp/dflash-online-split}
W=/tmp/online-split
mkdir -p "$O"
rm -rf $W && mkdir -p $W/tokens
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu --format=csv,noheader
if (( GPUS < 2 )); then
  echo "skipped: needs 2 GPUs, this machine has $GPUS"
  exit 0
fi
timeout 300 python3 - $D $W <<'PY' 2>&1 | grep -v "Writing\|Loading\|deprecated"
import os, sys, time
sys.path.insert(0, "scripts")
from device_rows import make_q8_target, write_q8_tokens
D, W = sys.argv[1:3]
t0 = time.time()
cfg, model = make_q8_target(D + "/tcfg/q8", W + "/t8")
write_q8_tokens(W + "/tokens/shard-00000.safetensors", cfg.vocab_size)
print("saved the target and the token shard in %.0f s" % (time.time() - t0))
PY
train() { # name options...
  local name=$1
  shift
  timeout 240 $D/bin/train-q8-online --target $W/t8 --data $W/tokens --steps 8 --seed 0 \
    --out /tmp/$name --log $O/$name.jsonl "$@" > /tmp/$name.out 2>&1
  echo "$name ($*) rc=$?"; grep -a "error\|target device" /tmp/$name.out | head -n 3
  rm -rf /tmp/$name
}
train colocated-gpu0 --gpus 0
train colocated-gpu1 --gpus 1
train split-1x1 --target-gpus 0 --gpus 1
if (( GPUS >= 3 )); then
  train colocated-x2 --gpus 1,2
  train split-1x2 --target-gpus 0 --gpus 1,2
fi
if (( GPUS >= 4 )); then
  train colocated-x3 --gpus 1,2,3
  train split-1x3 --target-gpus 0 --gpus 1,2,3
fi
rm -rf $W
python3 - $O <<'PY'
import json, os, sys, statistics as st
O = sys.argv[1]
def load(n):
    p = os.path.join(O, n + ".jsonl")
    return [json.loads(l) for l in open(p) if l.startswith('{"step')] if os.path.exists(p) else []
def rel(a, b):
    return max(max(abs(x[k] - y[k]) / abs(y[k]) for k in ("loss", "grad_norm"))
               for x, y in zip(a, b)) if a and len(a) == len(b) else float("nan")
runs = [("colocated-gpu0", 1), ("colocated-gpu1", 1), ("split-1x1", 1), ("colocated-x2", 2),
        ("split-1x2", 2), ("colocated-x3", 3), ("split-1x3", 3)]
logs = {n: load(n) for n, _ in runs}
print("| run | drafter GPUs | step ms | target ms | drafter waited ms | tokens/s per drafter GPU |")
print("|---|---|---|---|---|---|")
for n, g in runs:
    r = logs[n][3:]
    if not r:
        continue
    med = lambda k: st.median(x.get(k, 0) for x in r)
    print("| %s | %d | %.1f | %.1f | %.1f | %.0f |" % (n, g, med("step_ms"), med("target_ms"),
          med("feature_wait_ms"), med("tokens_per_s") / g))
noise = rel(logs["colocated-gpu1"], logs["colocated-gpu0"])
verdict = lambda d: "PASS" if d <= max(4 * noise, 1e-4) else "FAIL"
print("run-to-run noise (loss, grad_norm): %.2e" % noise)
for split, ref in (("split-1x1", "colocated-gpu0"), ("split-1x2", "colocated-x2"),
                   ("split-1x3", "colocated-x3")):
    if logs[split] and logs[ref]:
        d = rel(logs[split], logs[ref])
        print("%s against %s: %.2e %s" % (split, ref, d, verdict(d)))
PY
