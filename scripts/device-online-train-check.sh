#!/usr/bin/env bash
# Online training against offline training, on the GPU machine, over
# .device/: tiny with the small random Qwen3 of .device/tcfg/qwen3 (head dim
# 64, which the causal attention kernel takes), compiled in by
# `dflashc specs/tiny.toml --target .device/tcfg/qwen3` (.device/bin/
# train-tiny-online and target-features-tiny-online).
# 1. scripts/device-real-data.sh makes toy conversations, a tokenizer and
#    packed token shards (and a toy target this check does not use);
#    transformers saves the random Qwen3 (save_pretrained) in W/target-q.
# 2. Offline: dflash-prepare features (transformers) writes the features of
#    the token shards; train reads them for 30 steps.
# 3. Online: train reads the token shards and computes the features with its
#    compiled target every step, for 30 steps. Its losses must match (2)'s
#    within bf16 tolerance (the features differ by bf16 rounding).
# 4. Offline on the compiled target's own features (target-features, shard
#    by shard): the same features as (3), so the same losses to the bit.
# Logs to $OUT.
set -u
D=.device
O=${OUT:-/tmp/dflash-online-train}
W=/tmp/online-train
mkdir -p "$O"
rm -rf $W
DFLASH_TOY_CONVERSATIONS=${CONVERSATIONS:-600} DFLASH_TOY_HELD_OUT=40 \
  bash scripts/device-real-data.sh $W specs/tiny.toml > $O/real-data.log 2>&1
echo "device-real-data rc=$?"; tail -n 3 $O/real-data.log
python3 - $D $W <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
D, W = sys.argv[1:3]
torch.manual_seed(5)
cfg = AutoConfig.from_pretrained(D + "/tcfg/qwen3")
model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
with torch.no_grad():
    for n, p in model.named_parameters():
        if p.dim() == 2:
            p.normal_(0, 0.08 if "embed" not in n else 0.5)
        else:
            p.copy_(1 + 0.1 * torch.randn_like(p))
model.save_pretrained(W + "/target-q", safe_serialization=True)
PY
echo "target saved rc=$?"
python3 tools/dflash-prepare/dflash-prepare features --spec specs/tiny.toml --target $W/target-q \
  --tokens $W/tokens-train --out $W/features-q --overwrite > $O/features.log 2>&1
echo "dflash-prepare features rc=$?"; tail -n 1 $O/features.log
mkdir -p $W/features-compiled
for f in $W/tokens-train/*.safetensors; do
  $D/bin/target-features-tiny-online --target $W/target-q --rows $f \
    -o $W/features-compiled/$(basename $f) 2>> $O/target-features.log || echo "target-features $f failed"
done
cp $W/features-q/manifest.json $W/features-compiled/ 2>/dev/null
run() { # name data
  timeout 200 $D/bin/train-tiny-online --data $2 --target $W/target-q --steps 30 --seed 0 \
    --out /tmp/$1 --log $O/$1.jsonl > $O/$1.out 2>&1
  echo "$1 rc=$? $(grep -a 'online target\|done:' $O/$1.out | tr '\n' ' ' | tail -c 300)"
  grep -a "error" $O/$1.out | head -n 3
}
run offline $W/features-q
run online $W/tokens-train
run offline-compiled $W/features-compiled
python3 - $O <<'PY'
import json, os, sys, statistics as st
o = sys.argv[1]
def load(n):
    p = os.path.join(o, n + ".jsonl")
    return [json.loads(l) for l in open(p) if l.startswith('{"step')] if os.path.exists(p) else []
off, on, comp = load("offline"), load("online"), load("offline-compiled")
if not (off and on and comp):
    sys.exit("missing runs: offline %d online %d offline-compiled %d steps" % (len(off), len(on), len(comp)))
rel = lambda a, b: max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
d_tf, d_comp = rel(on, off), rel(on, comp)
print("losses at steps 0 / 29: online %.5f / %.5f, offline (transformers features) %.5f / %.5f, "
      "offline (compiled features) %.5f / %.5f" % (on[0]["loss"], on[-1]["loss"], off[0]["loss"],
      off[-1]["loss"], comp[0]["loss"], comp[-1]["loss"]))
print("max relative loss difference over 30 steps: online vs transformers features %.2e (%s), "
      "online vs compiled features %.2e (%s)" % (d_tf, "PASS" if d_tf < 2e-2 else "FAIL",
      d_comp, "PASS" if d_comp == 0 else "FAIL"))
print("median step: online %.2f ms (target %.2f ms), offline %.2f ms" % (
      st.median(x["step_ms"] for x in on[5:]), st.median(x.get("target_ms", 0) for x in on[5:]),
      st.median(x["step_ms"] for x in off[5:])))
PY
