#!/usr/bin/env bash
# Runs on a GPU machine over .device/ (scripts/device-prepare.sh): the
# data-parallel and ZeRO-1 checks of bench/RESULTS.md. With two GPUs: the
# runtime's GPU tests; tiny on 2 GPUs, graph against eager; ZeRO-1 graph
# against graph and eager, 10 steps + resume against 20 straight, against
# the all-reduced buckets; a ZeRO-1 checkpoint resumed by the unsharded
# trainer. With one GPU (or two): the NCCL path against the plain one, and
# the sharded step against the unsharded one after 1 and 2 steps. Logs go
# to $OUT; a table is printed last.
set -u
source "$(dirname "$0")/device-common.sh"
D=.device
O=${OUT:-/tmp/dflash-data-parallel}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L | wc -l)
rows=()
record() { rows+=("$(printf '| %s | %s |' "$1" "$2")"); }

train() { # name binary args...: a synthetic run of seed 5 into /tmp/name
  local name=$1 bin=$2; shift 2
  timeout 120 "$D/bin/$bin" --data synthetic --seed 5 --out "/tmp/$name" \
    --log "$O/$name.jsonl" "$@" > "$O/$name.out" 2>&1
  local rc=$?
  [[ $rc == 0 ]] || record "$name" "FAILED rc=$rc: $(tail -c 200 "$O/$name.out" | tr '\r\n' '  ')"
}
compare() { # label a b [steps]: final parameters and per-step losses
  local label=$1 a=$2 b=$3 steps=${4:-20}
  local bytes=different
  cmp -s "/tmp/$a/final/model.safetensors" "/tmp/$b/final/model.safetensors" && bytes=identical
  record "$label" "$bytes; $(python3 scripts/compare-runs.py --losses "$O/$a.jsonl" "$O/$b.jsonl" \
    --steps "$steps" --loss-tol 1 --params "/tmp/$a/final/model.safetensors" \
    "/tmp/$b/final/model.safetensors" --param-tol 1 2>&1 | grep -o 'worst rel [^ ]*' | tr '\n' ' ')"
}

if [[ $gpus -ge 2 ]]; then
  record "RuntimeTrainerTest ($gpus GPUs)" "$(run_gpu_test "$D/bin/RuntimeTrainerTest" "$O" 300 0)"
  train dp2 train-tiny-b1 --gpus 0,1 --steps 20
  train dp2e train-tiny-b1 --gpus 0,1 --steps 20 --no-graph
  compare "tiny, 2 GPUs, graph vs eager" dp2 dp2e
  train z2 train-tiny-zero1 --gpus 0,1 --steps 20
  train z2b train-tiny-zero1 --gpus 0,1 --steps 20
  train z2e train-tiny-zero1 --gpus 0,1 --steps 20 --no-graph
  compare "tiny ZeRO-1, 2 GPUs, run vs run" z2 z2b
  compare "tiny ZeRO-1, 2 GPUs, graph vs eager" z2 z2e
  train z2h train-tiny-zero1 --gpus 0,1 --steps 10 --total-steps 20
  train z2h train-tiny-zero1 --gpus 0,1 --resume /tmp/z2h --steps 20
  cmp -s /tmp/z2/final/model.safetensors /tmp/z2h/final/model.safetensors && s=identical || s=different
  record "tiny ZeRO-1, 10 + resume 10 vs 20 straight" "$s"
  compare "tiny ZeRO-1 vs all-reduced buckets, 2 GPUs" z2 dp2
  train x2 train-tiny-zero1 --gpus 0,1 --steps 10 --total-steps 20
  train x2 train-tiny-b1 --gpus 0,1 --resume /tmp/x2 --steps 20
  record "ZeRO-1 checkpoint resumed unsharded vs unsharded" "$(python3 scripts/compare-runs.py \
    --params /tmp/x2/final/model.safetensors /tmp/dp2/final/model.safetensors --param-tol 1 2>&1 |
    grep -o 'worst rel [^ ]*')"
  timeout 60 "$D/bin/train-tiny-zero1" --data synthetic --gpus 0 --steps 1 \
    --out /tmp/wrong > "$O/wrong.out" 2>&1
  record "ZeRO-1 for 2 GPUs started on 1" "rc=$? $(grep -m1 -o 'error: .*' "$O/wrong.out" | cut -c1-120)"
fi

train p1 train-tiny-b1 --gpus 0 --nccl --steps 20
train p1plain train-tiny-b1 --gpus 0 --steps 20
compare "tiny, NCCL path with 1 GPU vs plain" p1 p1plain
for s in 1 2; do
  train a$s train-tiny-b1 --gpus 0 --nccl --steps $s --total-steps 20
  train o$s train-tiny-zero1-one --gpus 0 --steps $s --total-steps 20
  record "tiny ZeRO-1 vs unsharded, 1 GPU, after $s step(s)" "$(python3 scripts/compare-runs.py \
    --params /tmp/a$s/checkpoint-$s/training/state.safetensors /tmp/o$s/checkpoint-$s/training/state.safetensors \
    --param-tol 1 2>&1 | grep -o 'worst rel [^ ]*') (training state)"
done

printf '\n| check | result |\n|---|---|\n'
printf '%s\n' "${rows[@]}"
