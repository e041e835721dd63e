#!/usr/bin/env bash
# The CPU reference's side of test/Oracle/dflash2-torch.test: writes into OUT
# what test/Oracle/Inputs/dflash2_torch.py checks, for the cases named (all
# by default). Runs where dflash-synth and dflash-reference are (PATH, else
# the checkout's build/bin); PYTHON (with numpy and torch) redraws the
# initial checkpoint.
#   dflash2_prepare.sh OUT PYTHON [CASE...]
# Always: OUT/synth (4 synthetic rows of specs/tiny-dflash2.toml, seed 3,
# their target and initial checkpoint), OUT/perturbed (its norms,
# convolutions and selector redrawn) and OUT/trained (40 steps on from
# there, exported: the checkpoint every case starts from). Cases:
#   topk inject covered stop   OUT/CASE.safetensors, the fp64 step dump
#       (--dump-step) with the defaults, selector_gold = "inject",
#       selector_denominator = "covered", selector_stop_gradient = true
#   ramp warm                  the same with alpha_t at step 0 of 4 in the
#       ramp (alpha 1.5 over 3 steps: 0.5) and in the warm-up (0)
#   unary                      the defaults with a unary transform:
#       output_multiplier = 1.5, final_logit_softcapping = 4.0
#   walk                       OUT/walk.jsonl and OUT/walk.line: the serving
#       walk of held-out rows 1-3 (the shard's rows 1-3) in fp64
# A step dump is 27 MB: to check on another machine with its own torch,
# prepare the cases that fit what can be carried, then run there e.g.
#   PYTHON test/Oracle/Inputs/dflash2_torch.py step OUT/topk.safetensors --alpha-t 1
#   PYTHON test/Oracle/Inputs/dflash2_torch.py export OUT/trained
#   PYTHON test/Oracle/Inputs/dflash2_torch.py walk OUT/trained OUT/synth/target \
#       OUT/synth/data/shard-00000.safetensors 1 OUT/walk.jsonl --line OUT/walk.line
set -euo pipefail
if (($# < 2)); then
  echo "usage: dflash2_prepare.sh OUT PYTHON [topk|inject|covered|stop|ramp|warm|unary|walk ...]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=$1
python=$2
shift 2
cases=("$@")
((${#cases[@]})) || cases=(topk inject covered stop ramp warm unary walk)
for c in "${cases[@]}"; do
  case $c in
    topk | inject | covered | stop | ramp | warm | unary | walk) ;;
    *) echo "dflash2_prepare: unknown case '$c'" >&2; exit 2 ;;
  esac
done
tool() {
  if command -v "$1" >/dev/null; then command -v "$1"; else echo "$root/build/bin/$1"; fi
}
synth=$(tool dflash-synth)
reference=$(tool dflash-reference)
spec=$root/specs/tiny-dflash2.toml

mkdir -p "$out"
"$synth" "$spec" "$out/synth" --rows 4 --seed 3
"$python" "$here/dflash2_torch.py" perturb "$out/synth/init" "$out/perturbed" --seed 5
"$reference" "$spec" --steps 40 --target "$out/synth/target" --data "$out/synth/data" \
  --init "$out/perturbed" --save "$out/trained" > "$out/trained.jsonl"

# The spec with the line matching ANCHOR (a sed pattern of a whole line)
# replaced by these lines.
replace() {
  local name=$1 anchor=$2
  shift 2
  local lines
  lines=$(printf '%s\\n' "$@")
  sed "s/^${anchor}\$/${lines%\\n}/" "$spec" > "$out/$name.toml"
  local line
  for line in "$@"; do
    grep -qxF "$line" "$out/$name.toml" || { echo "dflash2_prepare: cannot derive $name.toml" >&2; exit 1; }
  done
}
# The spec with `selector_alpha = 1.0` replaced by these lines.
derive() {
  local name=$1
  shift
  replace "$name" 'selector_alpha = 1.0' "$@"
}
dump() {
  local name=$1
  shift
  "$reference" "$out/$name.toml" --steps 1 "$@" --target "$out/synth/target" \
    --data "$out/synth/data" --init "$out/trained" --precision exact \
    --dump-step "$out/$name.safetensors" > "$out/$name.jsonl"
}
for c in "${cases[@]}"; do
  case $c in
    topk) derive topk 'selector_alpha = 1.0' && dump topk ;;
    inject) derive inject 'selector_alpha = 1.0' 'selector_gold = "inject"' && dump inject ;;
    covered) derive covered 'selector_alpha = 1.0' 'selector_denominator = "covered"' && dump covered ;;
    stop) derive stop 'selector_alpha = 1.0' 'selector_stop_gradient = true' && dump stop ;;
    ramp) derive ramp 'selector_alpha = 1.5' 'selector_ramp_ratio = 0.75' && dump ramp --total-steps 4 ;;
    warm)
      derive warm 'selector_alpha = 1.0' 'selector_warmup_ratio = 0.25' 'selector_ramp_ratio = 0.5'
      dump warm --total-steps 4 ;;
    unary)
      replace unary '\[drafter.dflash2\]' '[drafter.dflash2]' 'output_multiplier = 1.5' \
        'final_logit_softcapping = 4.0' && dump unary ;;
    walk)
      "$reference" "$spec" --data synthetic --seed 3 --rows 1 --steps 0 --init "$out/trained" \
        --eval-rows 3 --eval-serving-rows 3 --eval-serving-dump "$out/walk.jsonl" \
        --precision exact > "$out/walk.line" ;;
  esac
done
echo "dflash2_prepare: $out: ${cases[*]}"
