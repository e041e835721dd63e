#!/usr/bin/env bash
# Two builds of the qwen3-8b-b16 trainer with its Qwen3-8B-shaped online
# target (dflashc specs/qwen3-8b-b16.toml --target .device/tcfg/q8), before
# (suffix -a) and after (suffix -b) a change to kernels/ or runtime/, side by
# side in one call on the GPU machine:
# - target-features-q8-{a,b} --bench 10, unpacked and packed rows, twice
#   each, alternating (random weights, 4 x 3072 tokens);
# - train-q8o-{a,b} --data synthetic, 25 steps at 4 rows, twice each,
#   alternating: medians and the loss noise (scripts/device/measurements.py
#   compare-steps).
# TRAIN=0 runs the targets only (then only target-features-q8-{a,b} are
# needed). Needs those four binaries in .device/bin (scripts/device-prepare.sh
# --online -a in the old tree, --online -b in the new). Logs to $OUT.
# Used for: bench/RESULTS.md "GEMM timing with each plan's own beta", "The
# target MLP's gate/up GEMM with SwiGLU in its epilogue".
set -u
source "$(dirname "$0")/common.sh"
device_start /tmp/dflash-ab
for packed in "" "--packed"; do
  for round in 1 2; do
    for v in a b; do
      n=bench$packed-$v$round
      timeout 120 $D/bin/target-features-q8-$v --bench 10 $packed > $O/$n.json 2> $O/$n.err
      echo "target $v$packed round $round rc=$? $(cut -c1-150 $O/$n.json)"
    done
  done
done
[[ ${TRAIN:-1} == 1 ]] || exit 0
for round in "" 2; do
  for v in a b; do
    timeout 150 $D/bin/train-q8o-$v --data synthetic --rows 8 --seed 0 --steps 25 \
      --out /tmp/ab-$v --log $O/$v$round.jsonl > $O/train-$v$round.out 2>&1
    echo "train $v$round rc=$? $(grep -a -E 'GEMM algorithms|in use on' $O/train-$v$round.out | cut -c1-110 | tr '\n' ' ')"
    rm -rf /tmp/ab-$v # 15 GB of checkpoint
  done
done
python3 scripts/device/measurements.py compare-steps $O a a2 b b2
