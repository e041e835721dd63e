#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (bin/train-tiny; ref/tiny-eval-10.jsonl
# from `dflash-reference specs/tiny.toml --data synthetic --rows 64 --steps 10
# --eval-rows 20`): held-out evaluation (train --eval-data).
# 1. The evaluation program against the CPU reference: 10 steps of the
#    synthetic tiny problem, then 20 held-out rows evaluated by each (the GPU
#    with its forward-only eval.cu, the CPU interpreting @eval in bf16
#    storage precision). Ten steps of rounding separate the parameters a
#    little (the training losses agree to about 2e-4), so: eval loss within
#    1% and acc and tau within 0.02 of the reference's.
# 2. A 300-step run evaluated every 50 steps: eval tau rises above 2 on rows
#    it never trained on, best/ holds the best drafter and its eval.json,
#    every step logs acc_by_position.
# Logs to $OUT.
set -u
D=.device
O=${OUT:-/tmp/dflash-eval}
mkdir -p "$O"
rm -rf /tmp/tiny-eval /tmp/tiny-eval-300
timeout 120 "$D/bin/train-tiny" --data synthetic --rows 64 --steps 10 \
  --eval-data synthetic --eval-rows 20 --out /tmp/tiny-eval \
  --log "$O/tiny-eval-10.jsonl" 2> "$O/tiny-eval-10.err"
echo "tiny, 10 steps and an evaluation: rc=$?"
timeout 200 "$D/bin/train-tiny" --data synthetic --rows 64 --steps 300 \
  --eval-data synthetic --eval-rows 40 --eval-every 50 --out /tmp/tiny-eval-300 \
  --log "$O/tiny-eval-300.jsonl" 2> "$O/tiny-eval-300.err"
echo "tiny, 300 steps evaluated every 50: rc=$?"
cp -r /tmp/tiny-eval-300/best "$O/best-300" 2>/dev/null
python3 - "$O" "$D/ref/tiny-eval-10.jsonl" <<'PY'
import json, os, sys
out, ref = sys.argv[1], sys.argv[2]
def lines(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")]
gpu = [l for l in lines(os.path.join(out, "tiny-eval-10.jsonl")) if "eval_loss" in l]
cpu = [l for l in lines(ref) if "eval_loss" in l]
ok1 = len(gpu) == 1 and len(cpu) == 1
if ok1:
    g, c = gpu[0], cpu[0]
    for k in ("eval_loss", "eval_acc", "eval_tau"):
        print("%-10s gpu %.6f  cpu %.6f" % (k, g[k], c[k]))
    print("eval_acc_by_position gpu", g["eval_acc_by_position"])
    print("eval_acc_by_position cpu", c["eval_acc_by_position"])
    ok1 = (abs(g["eval_loss"] - c["eval_loss"]) < 0.01 * c["eval_loss"]
           and abs(g["eval_acc"] - c["eval_acc"]) < 0.02
           and abs(g["eval_tau"] - c["eval_tau"]) < 0.02
           and g["eval_rows"] == 20 and g["step"] == 9)
print("1. evaluation vs the CPU reference:", "PASS" if ok1 else "FAIL")
run = lines(os.path.join(out, "tiny-eval-300.jsonl"))
evals = [l for l in run if "eval_loss" in l]
steps = [l for l in run if "loss" in l]
for e in evals:
    print("eval after step %3d: loss %.4f acc %.4f tau %.3f acc@k %s"
          % (e["step"] + 1, e["eval_loss"], e["eval_acc"], e["eval_tau"],
             " ".join("%.2f" % a if a is not None else "-" for a in e["eval_acc_by_position"])))
best_path = os.path.join(out, "best-300", "eval.json")
best = json.load(open(best_path)) if os.path.exists(best_path) else None
ok2 = (len(evals) == 6 and [e["step"] for e in evals] == [49, 99, 149, 199, 249, 299]
       and evals[-1]["eval_tau"] > 2 and evals[-1]["eval_tau"] > evals[0]["eval_tau"]
       and best is not None and abs(best["eval_tau"] - max(e["eval_tau"] for e in evals)) < 1e-6
       and os.path.exists(os.path.join(out, "best-300", "model.safetensors"))
       and len(steps) == 300 and all(len(l.get("acc_by_position", [])) == 7 for l in steps))
print("best/: step %s tau %s" % (best and best["step"] + 1, best and best["eval_tau"]))
print("2. 300 steps with evaluations and best/:", "PASS" if ok2 else "FAIL")
PY
grep -h "eval\|best\|error" "$O"/tiny-eval-*.err | head -20
