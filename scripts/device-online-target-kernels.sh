#!/usr/bin/env bash
# The online target's kernels alone, on the GPU machine, over .device/bin
# (DenseGpuTest and CausalAttentionGpuTest from build-rt/test/gpu,
# KernelBench from bench/kernels/run.sh's nvcc line): the RoPE-alone and
# embedding tests, the causal attention tests, then KernelBench's "causal"
# section (B 4, S 3072, qwen3-8b heads, unpacked and packed) beside PyTorch's
# SDPA / varlen attention on the same rows (bench/kernels/torch_reference.py
# --only causal). Logs to $OUT.
set -u
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-online-kernels
for t in DenseGpuTest CausalAttentionGpuTest; do
  run_gpu_test $D/bin/$t $O 180
done
timeout 180 $D/bin/KernelBench $O/kernels.jsonl causal > $O/kernels.log 2>&1
echo "KernelBench causal rc=$?"; grep -a "causal" $O/kernels.log
timeout 240 python3 bench/kernels/torch_reference.py --out $O/torch.jsonl --only causal > $O/torch.log 2>&1
echo "torch_reference causal rc=$?"; grep -a -i "causal" $O/torch.log | tail -n 4
