#!/usr/bin/env bash
# compile-spec.sh SPEC DIR [DFLASHC_ARG...]: emits SPEC's trainer sources
# into DIR (with --target TARGET_DIR among the arguments, the online target
# too) and compiles its generated translation units with nvcc (sm_90a).
set -euo pipefail
spec=$1 dir=$2
shift 2
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
dflashc "$spec" "$@" --emit=cuda -o "$dir" 2> /dev/null
tus=(step.cu eval.cu kernels.cu)
[[ $* == *--target* ]] && tus+=(target.cu)
for tu in "${tus[@]}"; do
  "$nvcc" -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
    --expt-relaxed-constexpr -I"$dir" -I"$dir/dflash" -c "$dir/$tu" \
    -o "$dir/${tu%.cu}.o"
done
echo "compiled $spec ${tus[*]}"
