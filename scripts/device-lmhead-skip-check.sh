#!/usr/bin/env bash
# Runs on a GPU machine over .device/: the lm_head's slot-0 skip (branch
# lmhead-skip-slot0) checked and timed before it lands. Needs in .device/bin:
# LmHeadGpuTest, DenseGpuTest, KernelBench (bench/kernels/run.sh's build),
# train-tiny (main) and train-tinyn (this branch), train-q8 / train-q8n
# (qwen3-8b-b16, 4 rows) and train-q8-r1 / train-q8-r1n (the same spec with
# rows_per_gpu = 1), each pair built from main and from the branch; and
# device-eval-check.sh's inputs. Logs to $OUT.
set -u
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/device-common.sh"
device_start /tmp/o
for t in LmHeadGpuTest DenseGpuTest; do
  run_gpu_test $D/bin/$t $O 120
done
for v in tiny-old tiny-new; do
  b=train-tiny; [[ $v == tiny-new ]] && b=train-tinyn
  timeout 100 $D/bin/$b --data synthetic --rows 64 --steps 30 --out /tmp/$v --log $O/$v.jsonl > $O/$v.out 2>&1; echo "$v rc=$?"
done
python3 - $O/tiny-old.jsonl $O/tiny-new.jsonl <<'PY'
import json,sys
a=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step')]
b=[json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"step')]
d=max(abs(x["loss"]-y["loss"])/abs(x["loss"]) for x,y in zip(a,b))
print("tiny 30 steps: loss old %.5f new %.5f (step 29), max rel diff over steps %.2e; acc %.4f/%.4f tau %.4f/%.4f"%(a[-1]["loss"],b[-1]["loss"],d,a[-1]["acc"],b[-1]["acc"],a[-1]["tau"],b[-1]["tau"]))
PY
cp $D/bin/train-tinyn $D/bin/train-tiny
bash scripts/device-eval-check.sh 2>&1 | tail -n 6
timeout 120 $D/bin/KernelBench $O/kb.jsonl lmhead > $O/kb.txt 2>&1; echo "KernelBench rc=$?"; grep -a "lm_head" $O/kb.txt
run() { timeout 150 $D/bin/$2 --data synthetic --rows 8 --seed 0 --steps 25 --out /tmp/$1 --log $O/$1.jsonl > $O/$1.out 2>&1; echo "$1 rc=$? $(grep -a 'in use on' $O/$1.out | tail -c 80)"; rm -rf /tmp/$1; }  # 15 GB checkpoints fill the disk
run q8-old train-q8; run q8-new train-q8n; run q8-old2 train-q8; run q8-new2 train-q8n
run r1-old train-q8-r1; run r1-new train-q8-r1n
python3 - $O <<'PY'
import json,sys,os,statistics as st
o=sys.argv[1]
for n in ["q8-old","q8-new","q8-old2","q8-new2","r1-old","r1-new"]:
    p=os.path.join(o,n+".jsonl")
    if not os.path.exists(p): print(n,"missing"); continue
    r=[json.loads(l) for l in open(p) if l.startswith('{"step')]
    print("%-8s median step %.1f ms (steps 5..) loss@0 %.4f loss@24 %.4f" % (n, st.median(x["step_ms"] for x in r[5:]), r[0]["loss"], r[-1]["loss"]))
PY
