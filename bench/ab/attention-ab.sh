#!/usr/bin/env bash
# Attention forwards before (-a) and after (-b) a change to kernels/, side
# by side in one call on the GPU machine, over .device/bin:
# - the changed tree's CausalAttentionGpuTest and AttentionGpuTest (the
#   drafter's forward shares the wgmma tile code);
# - KernelBench-{a,b} "causal,attention-fwd" twice each, alternating (the
#   target's causal forward unpacked and packed, the drafter's forwards);
#   VARIANTS="a b c" adds builds, ONLY="causal" narrows the sections;
# - PyTorch's SDPA / varlen attention on the same causal rows
#   (bench/kernels/torch_reference.py --only causal);
# - with target-features-q8-{a,b} present, bench/ab/ab-check.sh's
#   target rounds (TRAIN=0).
# Used for: bench/RESULTS.md "lazy softmax rescale in the wgmma forwards",
# "One copy of the wgmma forwards' shared steps".
# Build KernelBench-a from a worktree of the old tree (bench/kernels/run.sh's
# nvcc line), target-features-q8-a with DFLASHC wrapping dflashc
# --source-dir OLD_TREE (scripts/device-prepare.sh --online -a). Logs to $OUT.
set -u
source "$(dirname "$0")/common.sh"
device_start /tmp/dflash-attention-ab
for t in CausalAttentionGpuTest AttentionGpuTest; do
  [[ -x $D/bin/$t ]] || continue
  run_gpu_test $D/bin/$t /tmp
done
for round in 1 2; do
  for v in ${VARIANTS:-a b}; do
    timeout 240 $D/bin/KernelBench-$v $O/kernels-$v$round.jsonl ${ONLY:-causal,attention-fwd} \
      > /tmp/kernels-$v$round.log 2>&1
    echo "KernelBench-$v round $round rc=$?"
    grep -a -E "causal|fwd" /tmp/kernels-$v$round.log | grep -a -v "mt[12] kt\|mma.sync" | cut -c1-100
  done
done
timeout 240 python3 bench/kernels/torch_reference.py --out $O/torch.jsonl --only causal \
  > /tmp/torch.log 2>&1
echo "torch_reference causal rc=$?"; grep -a -i "causal" /tmp/torch.log | tail -n 4
if [[ -x $D/bin/target-features-q8-a && -x $D/bin/target-features-q8-b ]]; then
  OUT=$O TRAIN=0 bash bench/ab/ab-check.sh
fi
