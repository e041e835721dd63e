#!/usr/bin/env bash
# The target MLP's gate/up GEMM with SwiGLU in its epilogue
# (kernels/SwiGluGemm.cuh, dflash.linear_swiglu) on the GPU machine, in one
# call, over .device/ (FUSE_TARGET_MLP=1 scripts/device-prepare.sh --online
# -b, then scripts/device-prepare.sh --online -a with ONLINE_TARGETS=q8: the
# target without the fusion, the default):
# 1. DenseGpuTest: every case, the SwiGluGemm ones (both forms against a
#    double reference, odd tiles, determinism) included. The rest of the
#    call runs only if they pass (a broken kernel could hang the target).
# 2. KernelBench swiglu-gemm: the one-CTA and cluster forms against
#    cuBLASLt's two products and the SwiGLU pass at the Qwen3-8B target's
#    MLP (12288 tokens), rested and at the sustained clock.
# 3. AB=1 (default): the Qwen3-8B-shaped target without the fusion (a, the
#    binary .device/bin/target-features-q8-a) and with it (b) side by side,
#    TRAIN=0 scripts/device-ab-check.sh.
# 4. CHECK=1 (default): scripts/device-online-target-check.sh: the causal
#    attention tests, the features of a small random Qwen3 and Llama-3
#    against transformers (binaries target-features-tq / -tl) and, with
#    BENCH=1 (default), target-features-q8 beside transformers' forward.
# Logs to $OUT.
set -u
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-swiglu-gemm
run_gpu_test $D/bin/DenseGpuTest $O 300 12 || { echo "device-swiglu-gemm-check: DenseGpuTest failed; stopping"; exit 1; }
timeout 200 $D/bin/KernelBench $O/kernels.jsonl swiglu-gemm > $O/kernels.log 2>&1
echo "KernelBench swiglu-gemm rc=$?"; grep -a -E "gate\+up|swiglu gemm|gemm 8192|clock" $O/kernels.log
[[ ${AB:-1} == 1 ]] && OUT=$O TRAIN=0 scripts/device-ab-check.sh
if [[ ${CHECK:-1} == 1 ]]; then
  # The checks read the unsuffixed names: the b builds (with the fusion).
  for n in tq tl q8; do
    [[ -f $D/bin/target-features-$n-b ]] && cp $D/bin/target-features-$n-b $D/bin/target-features-$n
  done
  OUT=$O UNTIMED=0 scripts/device-online-target-check.sh
fi
