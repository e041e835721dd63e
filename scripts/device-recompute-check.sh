#!/usr/bin/env bash
# [memory] recompute_activations / recompute_mlp_products on the GPU, over
# .device/, in one call:
# 1. each tiny trainer of TINY (default: train-tiny train-tiny-recompute)
#    against dflash-reference on the tiny problem's files (10 steps, bf16
#    storage and fp64; the reference runs the unfused step, so recomputation
#    must not move the losses past the usual tolerance), and every one after
#    the first against the first (the same losses and parameters to the bit:
#    the clones compute exactly what the kept activations held).
# 2. each qwen3-8b-b16 trainer of Q8 (NAME:BINARY pairs, default
#    kept:train-q8 recomputed:train-q8-recompute), STEPS synthetic steps
#    (default 25), ROUNDS times (default 2), alternating: memory in use after
#    the first step, median step time; with two rounds of two trainers the
#    losses against run-to-run noise (scripts/compare-step-runs.py); then,
#    with TORCH=1 (the default), torch.compile of the same drafter
#    (bench/step/torch_step.py, fp32 masters).
# The binaries: dflashc of specs/tiny.toml and specs/qwen3-8b-b16.toml, and
# of the same with the [memory] keys; .device/tiny and .device/ref from
# scripts/device-prepare.sh. Metrics to $OUT, output to /tmp.
set -u
D=.device
O=${OUT:-/tmp/dflash-recompute}
L=/tmp/recompute-logs
rm -rf "$L"
mkdir -p "$O" "$L"
T=$D/tiny
tiny=(${TINY:-train-tiny train-tiny-recompute})
for b in "${tiny[@]}"; do
  timeout 100 $D/bin/$b --target $T/target --data $T/data --init $T/init --steps 10 \
    --out /tmp/$b --log $O/$b.jsonl > $L/$b.out 2>&1
  echo "$b rc=$?"
  for p in "" -exact; do
    python3 scripts/compare-runs.py --losses $O/$b.jsonl $D/ref/tiny-losses$p.jsonl \
      --steps 10 --params /tmp/$b/final/model.safetensors \
      $D/ref/tiny-params$p/model.safetensors --param-tol 5e-2 2>&1 | grep worst | sed "s/^/$b vs reference$p: /"
  done
  if [[ $b != "${tiny[0]}" ]]; then
    python3 scripts/compare-runs.py --losses $O/$b.jsonl $O/${tiny[0]}.jsonl --steps 10 \
      --loss-tol 0 2>&1 | grep worst | sed "s/^/$b vs ${tiny[0]}: /"
    cmp -s /tmp/${tiny[0]}/final/model.safetensors /tmp/$b/final/model.safetensors \
      && echo "$b vs ${tiny[0]} parameters: identical" || echo "$b vs ${tiny[0]} parameters: DIFFERENT"
  fi
done
for b in "${tiny[@]}"; do rm -rf /tmp/$b; done

q8=(${Q8:-kept:train-q8 recomputed:train-q8-recompute})
names=()
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for pair in "${q8[@]}"; do
    n=${pair%%:*}; b=${pair#*:}
    [[ $r -gt 1 ]] && n=$n$r
    names+=("$n")
    timeout 200 $D/bin/$b --data synthetic --rows 8 --seed 0 --steps ${STEPS:-25} --out /tmp/$n \
      --log $O/$n.jsonl > $L/$n.out 2>&1
    echo "$n rc=$? $(grep -a 'in use on' $L/$n.out | tail -1 | cut -c1-120)"
    rm -rf /tmp/$n # 15 GB of checkpoint
  done
done
if [[ ${#names[@]} == 4 ]]; then
  python3 scripts/compare-step-runs.py $O "${names[0]}" "${names[2]}" "${names[1]}" "${names[3]}"
else
  python3 - $O "${names[@]}" <<'PY'
import json, statistics, sys
for n in sys.argv[2:]:
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl") if l.startswith('{"step')]
    ms = [r["step_ms"] for r in rows[5:] if "step_ms" in r]
    print(f"{n:14} median step {statistics.median(ms):.1f} ms (steps 5..) "
          f"loss@0 {rows[0]['loss']:.5f} loss@{len(rows) - 1} {rows[-1]['loss']:.5f}")
PY
fi
if [[ ${TORCH:-1} == 1 ]]; then
  timeout 400 python3 bench/step/torch_step.py --rows 4 --steps 20 --modes compile --masters \
    > $L/torch.txt 2>&1
  echo "torch_step rc=$?"; grep -a step_ms $L/torch.txt | tail -n 1
fi
