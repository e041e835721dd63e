#!/usr/bin/env bash
# The largest rows per GPU of qwen3-8b-b16 on one H200, both sides, in one
# call over .device/:
# - every trainer .device/bin/train-q8-<form>-<rows> (dflashc
#   specs/qwen3-8b-b16.toml with rows_per_gpu = <rows>, and for the form
#   "recompute" [memory] recompute_activations = true; the static plan,
#   dflashc --emit=cuda's manifest.json "memory", says which should fit):
#   2 synthetic steps, the memory in use after the first step, or its error;
# - bench/step/torch_step.py (torch.compile, fp32 masters) at each of
#   TORCH_ROWS (default 8 12 16 18): its peak memory, or the out-of-memory
#   error.
# Logs to $OUT.
set -u
D=.device
O=${OUT:-/tmp/dflash-max-rows}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for b in $D/bin/train-q8-*-[0-9]*; do
  n=$(basename "$b")
  timeout 200 "$b" --data synthetic --rows 32 --seed 0 --steps 2 --out /tmp/$n \
    --log $O/$n.jsonl > $O/$n.out 2>&1
  echo "$n rc=$? $(grep -a -E 'in use on|error' $O/$n.out | tail -n 1 | cut -c1-200)"
  rm -rf /tmp/$n # 15 GB of checkpoint
done
for R in ${TORCH_ROWS:-8 12 16 18}; do
  timeout 200 python3 bench/step/torch_step.py --rows $R --steps 3 --warmup 2 --modes compile \
    --masters > $O/torch-$R.txt 2>&1
  echo "torch_step rows $R rc=$? $(grep -a step_ms $O/torch-$R.txt | tail -n 1)" \
    "$(grep -a -o 'OutOfMemoryError.\{0,100\}' $O/torch-$R.txt | head -n 1)"
done
