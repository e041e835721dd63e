#!/usr/bin/env bash
# Real-data path on the GPU machine, without network: makes in WORK a small
# byte-level BPE tokenizer (trained on the spot, Qwen-style chat template with
# generation markers), a random-initialised Qwen3 target whose hidden size,
# layer count and vocabulary are SPEC's target's, and a few hundred
# synthetic multi-turn conversations with learnable answers (held-out ones
# too); then runs dflash-prepare tokens --pack, features and check on both,
# prints a summary and the commands that would train on the result.
# Usage: scripts/device-real-data.sh WORK [SPEC]   (SPEC: specs/tiny.toml)
# The 300-step demo of issue 17 uses SPEC scripts/real-data-demo.toml (tiny
# with 16 rows a step) and DFLASH_TOY_CONVERSATIONS=3000.
# Needs python3 with torch >= 2, transformers and tokenizers (the GPU
# machine's); set PYTHON to use another interpreter.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:?usage: scripts/device-real-data.sh WORK [SPEC]}
spec=${2:-$root/specs/tiny.toml}
python=${PYTHON:-python3}
prepare="$python $root/tools/dflash-prepare/dflash-prepare"
toy="$python $root/tools/dflash-prepare/make-toy"
conversations=${DFLASH_TOY_CONVERSATIONS:-500}
held_out=${DFLASH_TOY_HELD_OUT:-80}

step() { echo "device-real-data: $*" >&2; }

[[ -f $spec ]] || { echo "device-real-data: error: $spec: no such spec" >&2; exit 2; }
$python - <<'PY' || exit 2
import sys
try:
    import torch, transformers, tokenizers
except ImportError as error:
    sys.exit(f"device-real-data: error: {error}; needs torch >= 2, transformers and tokenizers")
if int(torch.__version__.split(".")[0]) < 2:
    sys.exit(f"device-real-data: error: torch {torch.__version__} is older than 2")
print(f"device-real-data: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), "
      f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
      file=sys.stderr)
PY
mkdir -p "$work"
work=$(cd "$work" && pwd)

# The tokenizer stays below the mask token, so that it never produces it.
vocab=$($python - "$spec" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    spec = tomllib.load(f)
print(min(1000, spec["drafter"]["mask_token_id"], spec["target"]["vocab_size"]))
PY
)

step "corpus: $conversations conversations to train on, $held_out held out"
$toy corpus "$work/chat.jsonl" --count "$conversations" --seed 0 >&2
$toy corpus "$work/chat-eval.jsonl" --count "$held_out" --seed 1 >&2
step "tokenizer (at most $vocab tokens) and target ($spec)"
$toy tokenizer "$work/tokenizer" --corpus "$work/chat.jsonl" --vocab-size "$vocab" >&2
$toy target "$work/target" --spec "$spec" --seed 0 >&2

for set in train eval; do
  input=$work/chat.jsonl
  [[ $set == eval ]] && input=$work/chat-eval.jsonl
  step "tokens ($set)"
  $prepare tokens "$input" --spec "$spec" --tokenizer "$work/tokenizer" \
    --out "$work/tokens-$set" --pack --overwrite
  step "features ($set)"
  $prepare features --spec "$spec" --target "$work/target" \
    --tokens "$work/tokens-$set" --out "$work/features-$set" --overwrite
  step "check ($set)"
  $prepare check "$work/tokens-$set" --spec "$spec"
  $prepare check "$work/features-$set" --spec "$spec"
done

$python - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
for kind in ("train", "eval"):
    with open(os.path.join(work, f"tokens-{kind}", "manifest.json")) as f:
        report = json.load(f)["report"]
    with open(os.path.join(work, f"features-{kind}", "manifest.json")) as f:
        features = json.load(f)["report"]
    size = sum(os.path.getsize(os.path.join(work, f"features-{kind}", n))
               for n in os.listdir(os.path.join(work, f"features-{kind}"))
               if n.endswith(".safetensors"))
    dropped = sum(report["dropped"].values())
    print(f"summary {kind}: {report['conversations']} conversations ({dropped} dropped: "
          f"{report['dropped'] or 'none'}) in {report['rows']} packed rows, "
          f"{100 * report['fill']:.1f}% of the row slots used, "
          f"{report['supervised_tokens']} supervised tokens; features: {features['rows']} rows, "
          f"{features['skipped_non_finite']} skipped, {size / 1e6:.1f} MB")
PY

cat <<EOF
device-real-data: done. To train on it:
  build-dev/bin/dflashc $spec --emit=cuda -o $work/trainer
  cmake -S $work/trainer -B $work/trainer/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDFLASH_ENABLE_MPI=OFF
  ninja -C $work/trainer/build
  $work/trainer/build/train --target $work/target --data $work/features-train --steps 300 --out $work/run \\
      --eval-data $work/features-eval --eval-every 50
  $python $root/tools/dflash-plot/dflash-plot $work/run -o $work/run/metrics.png
EOF
