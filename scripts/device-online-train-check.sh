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
# 5. Online with the target on a thread and stream of its own (--target-gpus
#    0 --gpus 0: the path that puts it on GPUs of its own), held-out token
#    rows evaluated every 10 steps in both (3) and (5): the same losses and
#    evaluations as (3), to the bit.
# The metrics logs go to $OUT (a device call brings back only a few files),
# the programs' output to /tmp/online-train-logs.
set -u
D=.device
O=${OUT:-/tmp/dflash-online-train}
W=/tmp/online-train
L=/tmp/online-train-logs
rm -rf "$L"
mkdir -p "$O" "$L"
rm -rf $W
DFLASH_TOY_CONVERSATIONS=${CONVERSATIONS:-600} DFLASH_TOY_HELD_OUT=40 \
  bash scripts/device-real-data.sh $W specs/tiny.toml > $L/real-data.log 2>&1
echo "device-real-data rc=$?"; tail -n 3 $L/real-data.log
python3 - $D $W <<'PY'
import sys, torch
sys.path.insert(0, "scripts")
from device_rows import save_random_decoder
D, W = sys.argv[1:3]
save_random_decoder(D + "/tcfg/qwen3", W + "/target-q", seed=5)
PY
echo "target saved rc=$?"
python3 tools/dflash-prepare/dflash-prepare features --spec specs/tiny.toml --target $W/target-q \
  --tokens $W/tokens-train --out $W/features-q --overwrite > $L/features.log 2>&1
echo "dflash-prepare features rc=$?"; tail -n 1 $L/features.log
mkdir -p $W/features-compiled
for f in $W/tokens-train/*.safetensors; do
  $D/bin/target-features-tiny-online --target $W/target-q --rows $f \
    -o $W/features-compiled/$(basename $f) 2>> $L/target-features.log || echo "target-features $f failed"
done
cp $W/features-q/manifest.json $W/features-compiled/ 2>/dev/null
run() { # name data [options]
  local name=$1 data=$2
  shift 2
  timeout 200 $D/bin/train-tiny-online --data $data --target $W/target-q --steps 30 --seed 0 \
    --out /tmp/$name --log $O/$name.jsonl "$@" > $L/$name.out 2>&1
  echo "$name rc=$? $(grep -a 'online target\|done:' $L/$name.out | tr '\n' ' ' | tail -c 300)"
  grep -a "error" $L/$name.out | head -n 3
  rm -rf /tmp/$name
}
run offline $W/features-q
run online $W/tokens-train --eval-data $W/tokens-eval --eval-every 10
run offline-compiled $W/features-compiled
run online-apart $W/tokens-train --eval-data $W/tokens-eval --eval-every 10 --target-gpus 0 --gpus 0
python3 - $O <<'PY'
import json, os, sys, statistics as st
o = sys.argv[1]
def load(n, key="loss"):
    p = os.path.join(o, n + ".jsonl")
    lines = [json.loads(l) for l in open(p) if l.startswith('{"step')] if os.path.exists(p) else []
    return [x for x in lines if key in x]
off, on, comp, apart = load("offline"), load("online"), load("offline-compiled"), load("online-apart")
if not (off and on and comp and apart):
    sys.exit("missing runs: offline %d online %d offline-compiled %d online-apart %d steps"
             % (len(off), len(on), len(comp), len(apart)))
rel = lambda a, b: max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
d_tf, d_comp = rel(on, off), rel(on, comp)
print("losses at steps 0 / 29: online %.5f / %.5f, offline (transformers features) %.5f / %.5f, "
      "offline (compiled features) %.5f / %.5f" % (on[0]["loss"], on[-1]["loss"], off[0]["loss"],
      off[-1]["loss"], comp[0]["loss"], comp[-1]["loss"]))
print("max relative loss difference over 30 steps: online vs transformers features %.2e (%s), "
      "online vs compiled features %.2e (%s)" % (d_tf, "PASS" if d_tf < 2e-2 else "FAIL",
      d_comp, "PASS" if d_comp == 0 else "FAIL"))
keys = ("loss", "acc", "tau", "grad_norm")
same = len(apart) == len(on) and all(x[k] == y[k] for x, y in zip(apart, on) for k in keys)
ev_on, ev_apart = load("online", "eval_loss"), load("online-apart", "eval_loss")
ev_keys = ("eval_loss", "eval_acc", "eval_tau", "eval_rows")
ev_same = len(ev_on) == len(ev_apart) > 0 and all(
    x[k] == y[k] for x, y in zip(ev_apart, ev_on) for k in ev_keys)
print("target on its own thread and stream (--target-gpus 0 --gpus 0) vs before each step: "
      "%d steps %s, %d evaluations %s (eval loss %s)" % (len(apart), "identical" if same else "DIFFER",
      len(ev_on), "identical" if ev_same else "DIFFER", [round(x["eval_loss"], 5) for x in ev_on]))
print("PASS" if same and ev_same else "FAIL")
print("median step: online %.2f ms (target %.2f ms), target apart %.2f ms (target %.2f, waited %.2f), "
      "offline %.2f ms" % (
      st.median(x["step_ms"] for x in on[5:]), st.median(x.get("target_ms", 0) for x in on[5:]),
      st.median(x["step_ms"] for x in apart[5:]), st.median(x.get("target_ms", 0) for x in apart[5:]),
      st.median(x.get("feature_wait_ms", 0) for x in apart[5:]),
      st.median(x["step_ms"] for x in off[5:])))
PY
