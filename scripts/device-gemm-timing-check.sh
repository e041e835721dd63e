#!/usr/bin/env bash
# The GEMM algorithms chosen by timing (kernels/Gemm.cuh), on the GPU machine
# over .device/, against cuBLASLt's first choices (--no-gemm-timing), in one
# call:
# 1. LmHeadGpuTest: the products right before and after timing, planners
#    agreeing.
# 2. The Qwen3-8B-shaped target's throughput both ways and transformers'
#    (scripts/device-online-target-check.sh with CHECK=0).
# 3. The qwen3-8b-b16 step on synthetic rows, 25 steps each way, twice,
#    alternating; then torch.compile of the same drafter (bench/step/
#    torch_step.py, fp32 masters) in the same call.
# Needs in .device/bin: LmHeadGpuTest, target-features-q8 and train-q8-online
# (dflashc specs/qwen3-8b-b16.toml --target .device/tcfg/q8: its step on
# synthetic rows is the offline step). Metrics to $OUT, output to /tmp.
set -u
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-gemm-timing
L=/tmp/gemm-timing-logs
rm -rf "$L"
mkdir -p "$L"
run_gpu_test $D/bin/LmHeadGpuTest $L 200

OUT=$L/target CHECK=0 bash scripts/device-online-target-check.sh 2>&1 | grep -a -v "^ *$"

step() { # name, extra flags
  timeout 200 $D/bin/train-q8-online --data synthetic --rows 8 --seed 0 --steps 25 \
    --out /tmp/$1 --log $O/$1.jsonl $2 > $L/$1.out 2>&1
  echo "$1 rc=$? $(grep -a 'GEMM algorithms\|in use on' $L/$1.out | cut -c1-160 | tr '\n' ' ')"
  rm -rf /tmp/$1 # 15 GB of checkpoint
}
step q8-timed ""; step q8-first --no-gemm-timing
step q8-timed2 ""; step q8-first2 --no-gemm-timing
python3 scripts/compare-step-runs.py $O q8-first q8-first2 q8-timed q8-timed2
timeout 400 python3 bench/step/torch_step.py --rows 4 --steps 20 --modes compile --masters \
  > $L/torch.txt 2>&1
echo "torch_step rc=$?"; grep -a -i "ms\|GiB" $L/torch.txt | tail -n 6
