#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (bin/train-tiny; ref/tiny-synthetic-
# 200.jsonl from `dflash-reference specs/tiny.toml --data synthetic --rows 64
# --steps 200`): the trainer's acceptance length (SEMANTICS.md section 10)
# against the CPU reference's over 200 steps of the synthetic tiny problem,
# which the drafter learns (tau from 1 towards bs). The two compute tau from
# their own logits (bf16 on the GPU, bf16 storage on the CPU) along their own
# trajectories, which rounding separates (the losses differ by about 10% in
# mid-run), so this compares curves, not steps: both start at 1 and end
# above 2.5, their means over the last 20 steps within 20%. (That tau is
# counted right from given logits is pinned by DenseGpuTest and
# LmHeadGpuTest against the reference, and by the PyTorch oracle.)
# Logs to $OUT.
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
ok = (n == 200 and gpu[0]["tau"] == 1 and cpu[0]["tau"] == 1 and g > 2.5
      and c > 2.5 and abs(g - c) < 0.2 * c)
print("tau over the last 20 steps: gpu %.4f cpu %.4f; largest one-step difference %.4f: %s"
      % (g, c, diff, "PASS" if ok else "FAIL"))
PY
