#!/usr/bin/env bash
# The online target's graph against transformers. Prepare here (no GPU, no
# transformers needed):
#   scripts/device-target-check.sh --prepare
# writes .device/target/{qwen3,llama}/ (test/Reference/target_oracle.py's
# random checkpoints in Hugging Face layout, two rows of 12 tokens, row 0
# packing two conversations) and dflash-target-features' CPU features of
# them (--precision=exact). Then on the GPU machine (which has transformers):
#   scripts/device-target-check.sh
# loads each checkpoint with AutoModelForCausalLM (fp32 on the weights' bf16
# values), runs every conversation alone from position 0 with
# output_hidden_states, takes tap l at hidden_states[l + 1], and compares
# them with the compiled graph's features token by token (bound 1e-2: the
# features are stored in bf16). Logs to $OUT.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
D=.device/target
spec=test/Reference/Inputs/small-online.toml
if [[ ${1:-} == --prepare ]]; then
  set -e
  for kind in qwen3 llama; do
    rm -rf "$D/$kind" && mkdir -p "$D/$kind"
    /usr/bin/python3 test/Reference/target_oracle.py make "$kind" "$D/$kind"
    "${BUILD:-build-rt}/bin/dflash-target-features" "$spec" --target "$D/$kind" \
      --rows "$D/$kind/tokens.safetensors" --precision=exact -o "$D/$kind/features.safetensors"
  done
  exit 0
fi
O=${OUT:-/tmp/dflash-target-check}
mkdir -p "$O"
python3 - "$D" <<'PY' 2>&1 | tee "$O/target-check.txt"
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
taps = [1, 2]  # test/Reference/Inputs/small-online.toml
ok = True
for kind in ["qwen3", "llama"]:
    d = "%s/%s" % (sys.argv[1], kind)
    model = AutoModelForCausalLM.from_pretrained(d).float().eval()
    rows = load_file(d + "/tokens.safetensors")
    got = load_file(d + "/features.safetensors")["hidden_states"].float()
    ids, pos = rows["input_ids"].long(), rows["position_ids"].long()
    worst = 0.0
    for b in range(ids.shape[0]):
        starts = [t for t in range(ids.shape[1]) if pos[b, t] == 0] + [ids.shape[1]]
        for s, e in zip(starts, starts[1:]):  # each conversation alone
            with torch.no_grad():
                out = model(input_ids=ids[b:b + 1, s:e], output_hidden_states=True)
            ref = torch.cat([out.hidden_states[l + 1][0] for l in taps], -1)
            err = ((got[b, s:e] - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
            worst = max(worst, err)
    passed = worst < 1e-2
    ok &= passed
    print("%s (%s): worst per-token |compiled - transformers| / |transformers| = %.2e: %s"
          % (kind, type(model).__name__, worst, "PASS" if passed else "FAIL"))
sys.exit(0 if ok else 1)
PY
echo "target check rc=${PIPESTATUS[0]}"
