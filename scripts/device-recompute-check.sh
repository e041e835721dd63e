#!/usr/bin/env bash
# [memory] recompute_activations on the GPU machine, over .device/, in one
# call:
# 1. tiny with recomputation against dflash-reference on the tiny problem's
#    files (10 steps, bf16 storage and fp64; the reference runs the unfused
#    step, so recomputation must not move the losses past the usual
#    tolerance), and against tiny without it (the same losses to the bit:
#    the clones compute exactly what the kept activations held).
# 2. qwen3-8b-b16 without and with recomputation, 25 synthetic steps each,
#    twice, alternating: memory in use after the first step, median step
#    time, losses against run-to-run noise; then torch.compile of the same
#    drafter (bench/step/torch_step.py, fp32 masters) in the same call.
# Needs in .device/bin: train-tiny and train-tiny-recompute (dflashc
# specs/tiny.toml, and the same with recompute_activations), train-q8 and
# train-q8-recompute (specs/qwen3-8b-b16.toml, and the same with the key);
# .device/tiny and .device/ref from scripts/device-prepare.sh. Metrics to
# $OUT, output to /tmp.
set -u
D=.device
O=${OUT:-/tmp/dflash-recompute}
L=/tmp/recompute-logs
rm -rf "$L"
mkdir -p "$O" "$L"
T=$D/tiny
for b in train-tiny train-tiny-recompute; do
  timeout 100 $D/bin/$b --target $T/target --data $T/data --init $T/init --steps 10 \
    --out /tmp/$b --log $O/$b.jsonl > $L/$b.out 2>&1
  echo "$b rc=$?"
done
for p in "" -exact; do
  python3 scripts/compare-runs.py --losses $O/train-tiny-recompute.jsonl $D/ref/tiny-losses$p.jsonl \
    --steps 10 --params /tmp/train-tiny-recompute/final/model.safetensors \
    $D/ref/tiny-params$p/model.safetensors --param-tol 5e-2 2>&1 | grep worst | sed "s/^/reference$p: /"
done
python3 scripts/compare-runs.py --losses $O/train-tiny-recompute.jsonl $O/train-tiny.jsonl --steps 10 \
  --loss-tol 0 2>&1 | grep worst | sed "s/^/recomputed vs kept: /"
cmp -s /tmp/train-tiny/final/model.safetensors /tmp/train-tiny-recompute/final/model.safetensors \
  && echo "recomputed vs kept parameters: identical" || echo "recomputed vs kept parameters: DIFFERENT"
rm -rf /tmp/train-tiny /tmp/train-tiny-recompute

step() { # name, binary
  timeout 200 $D/bin/$2 --data synthetic --rows 8 --seed 0 --steps 25 --out /tmp/$1 \
    --log $O/$1.jsonl > $L/$1.out 2>&1
  echo "$1 rc=$? $(grep -a 'in use on' $L/$1.out | tail -1 | cut -c1-120)"
  rm -rf /tmp/$1 # 15 GB of checkpoint
}
step kept train-q8; step recomputed train-q8-recompute
step kept2 train-q8; step recomputed2 train-q8-recompute
python3 scripts/compare-step-runs.py $O kept kept2 recomputed recomputed2
timeout 400 python3 bench/step/torch_step.py --rows 4 --steps 20 --modes compile --masters \
  > $L/torch.txt 2>&1
echo "torch_step rc=$?"; grep -a step_ms $L/torch.txt | tail -n 1
