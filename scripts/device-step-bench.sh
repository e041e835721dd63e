#!/usr/bin/env bash
# Runs on a GPU machine over .device/ (scripts/device-prepare.sh): the
# qwen3-8b-b16 training step of bench/RESULTS.md. The dflashc trainer on one
# GPU and PyTorch's torch.compile of the same drafter in the same run; with
# two GPUs also the data-parallel trainer and its ZeRO-1 form (scaling and
# memory per GPU). Medians of steps 5 onwards. Logs go to $OUT.
#   STEPS (30), ROWS (16 synthetic rows: enough for 30 steps on 2 GPUs and
#   quick to generate), TORCH (1: run the PyTorch baselines, torch.compile
#   with bf16 parameters updated directly and with fp32 masters)
set -u
export NCCL_NVLS_ENABLE=0
steps=${STEPS:-30}
gpus=$(nvidia-smi -L | wc -l)
source "$(dirname "$0")/device-common.sh"
device_start /tmp/dflash-step-bench

run() { # name binary args...
  local name=$1 bin=$2; shift 2
  timeout 240 "$D/bin/$bin" --data synthetic --rows "${ROWS:-16}" --seed 0 \
    --steps "$steps" --out "/tmp/$name" --log "$O/$name.jsonl" "$@" > "$O/$name.out" 2>&1
  echo "$name rc=$? $(grep -a 'done:' "$O/$name.out" | tail -c 140)"
  rm -rf "/tmp/$name" # its checkpoints (15 GB each) would fill the disk
}
run q8-1gpu train-qwen3-8b --gpus 0
if [[ $gpus -ge 2 ]]; then
  run q8-2gpu train-qwen3-8b --gpus 0,1
  run q8-2gpu-zero1 train-qwen3-8b-zero1 --gpus 0,1
fi
if [[ ${TORCH:-1} == 1 ]]; then
  flops=$(python3 -c "import json; print(json.load(open('$D/ref/qwen3-8b-manifest.json'))['flops_per_step']['total'])")
  timeout 300 python3 bench/step/torch_step.py --flops "$flops" --steps 6 --warmup 3 \
    --modes compile > "$O/torch.log" 2>&1
  echo "torch rc=$?"
  # Like for like: fp32 master weights in the optimizer, as dflashc keeps.
  timeout 300 python3 bench/step/torch_step.py --flops "$flops" --steps 6 --warmup 3 \
    --modes compile --masters >> "$O/torch.log" 2>&1
  echo "torch --masters rc=$?"
fi

python3 - "$O" <<'PY'
import json, os, statistics as st, sys
out = sys.argv[1]
print("\n| run | step ms | context tokens/s | draft tokens/s | TFLOP/s | memory |")
print("|---|---|---|---|---|---|")
for name in ["q8-1gpu", "q8-2gpu", "q8-2gpu-zero1"]:
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path):
        continue
    rows = [json.loads(l) for l in open(path) if l.startswith("{")][5:]
    if not rows:
        print("| %s | no steps | | | | |" % name)
        continue
    med = lambda k: st.median(r[k] for r in rows)
    mem = [l.split(";")[-1].strip() for l in open(os.path.join(out, name + ".out"), errors="replace")
           if "in use" in l and "device 0" in l]
    print("| %s | %.1f | %.0f | %.0f | %.1f | %s |" % (name, med("step_ms"), med("tokens_per_s"),
          med("draft_tokens_per_s"), med("tflops"), mem[0] if mem else ""))
torch = os.path.join(out, "torch.log")
if os.path.exists(torch):
    for l in open(torch):
        if l.startswith("{"):
            r = json.loads(l)
            print("| torch %s | %.1f | %.0f | %.0f | %.1f | %.1f GiB peak |" % (r["mode"], r["step_ms"],
                  r["context_tokens_per_s"], r["draft_tokens_per_s"], r["tflops"], r["peak_gib"]))
PY
