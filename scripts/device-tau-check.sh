#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (bin/train-tiny; ref/tiny-synthetic-
# 200.jsonl from `dflash-reference specs/tiny.toml --data synthetic --rows 64
# --steps 200`): the trainer's acceptance length (SEMANTICS.md section 10)
# against the CPU reference's over 200 steps of the synthetic tiny problem,
# which the drafter learns (tau from 1 towards bs). The two compute tau from
# their own logits (bf16 on the GPU, bf16 storage on the CPU), so single
# steps may differ by a flipped argmax; the curves must agree. Logs to $OUT.
set -u
D=.device
O=${OUT:-/tmp/dflash-tau}
mkdir -p "$O"
rm -rf /tmp/tiny-tau
timeout 120 "$D/bin/train-tiny" --data synthetic --rows 64 --steps 200 \
  --out /tmp/tiny-tau --log "$O/tiny-tau.jsonl" 2> "$O/tiny-tau.err"
echo "tiny, 200 synthetic steps: rc=$?"
python3 - "$O/tiny-tau.jsonl" "$D/ref/tiny-synthetic-200.jsonl" <<'PY'
import json, sys
gpu = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cpu = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
n = min(len(gpu), len(cpu))
for s in (0, 25, 50, 100, 150, n - 1):
    print("step %3d  tau gpu %.4f cpu %.4f  acc gpu %.4f cpu %.4f  loss gpu %.4f cpu %.4f"
          % (s, gpu[s]["tau"], cpu[s]["tau"], gpu[s]["acc"], cpu[s]["acc"],
             gpu[s]["loss"], cpu[s]["loss"]))
last = range(n - 20, n)
mean = lambda rows, k: sum(rows[i][k] for i in last) / len(last)
diff = max(abs(gpu[i]["tau"] - cpu[i]["tau"]) for i in range(n))
g, c = mean(gpu, "tau"), mean(cpu, "tau")
ok = n == 200 and gpu[0]["tau"] == 1 and g > 2 and abs(g - c) < 0.05 * c
print("tau over the last 20 steps: gpu %.4f cpu %.4f; largest one-step difference %.4f: %s"
      % (g, c, diff, "PASS" if ok else "FAIL"))
PY
