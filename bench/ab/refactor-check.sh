#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (built on the CPU machine): the
# trainers of two commits side by side, to show that a restructuring changed
# no behaviour (bench/RESULTS.md "Restructuring check", "Packed rows",
# "Acceptance length in the step", "Per-position accuracy"). .device/bin holds train-tiny-old/-new and train-q8-old/-new
# (qwen3-8b-b16) and the GPU test binaries; .device/tiny is a dflash-synth
# problem. Prints a table; logs go to $OUT.
#   tiny: the same files, seed and steps: losses and final parameters must
#         be bit-identical (cmp of the JSONL losses and model.safetensors).
#   q8:   median step time of each over the same synthetic steps, old, new,
#         old again (the machines drift within minutes).
# Environment: Q8_STEPS (default 20), GPU_TESTS (default all six),
# GPU_TEST_TIMEOUT (seconds per test binary, default 240: AttentionGpuTest
# needs about 150).
set -u
D=.device
O=${OUT:-/tmp/dflash-refactor}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0
results=()
record() { results+=("$(printf "%-30s %s" "$1" "$2")"); echo "${results[-1]}" | tee -a "$O/table.txt"; }

tiny() {
  local which=$1; shift
  timeout 60 "$D/bin/train-tiny-$which" --target "$D/tiny/target" \
    --data "$D/tiny/data" --init "$D/tiny/init" --steps 30 \
    --out "/tmp/tiny-$which" --log "$O/tiny-$which.jsonl" "$@" \
    2> "$O/tiny-$which.err"
}
tiny old; rc_old=$?
tiny new; rc_new=$?
record "tiny rc old/new" "$rc_old / $rc_new"
# The step's numbers as written (timing fields differ between any two runs).
losses() { python3 scripts/device/measurements.py fields "$1" step loss acc grad_norm lr; }
losses "$O/tiny-old.jsonl" > "$O/tiny-old.losses"
losses "$O/tiny-new.jsonl" > "$O/tiny-new.losses"
cmp -s "$O/tiny-old.losses" "$O/tiny-new.losses" && same=identical || same=DIFFERENT
record "tiny losses (30 steps)" "$same ($(wc -l < "$O/tiny-new.losses") lines, last: $(tail -1 "$O/tiny-new.losses"))"
cmp -s /tmp/tiny-old/final/model.safetensors /tmp/tiny-new/final/model.safetensors \
  && same=identical || same=DIFFERENT
record "tiny final parameters" "$same"

q8() {
  local which=$1 tag=$2
  timeout 90 "$D/bin/train-q8-$which" --data synthetic --rows 16 \
    --steps "${Q8_STEPS:-20}" --out "/tmp/q8-$tag" --log "$O/q8-$tag.jsonl" \
    2> "$O/q8-$tag.err"
  local rc=$?
  rm -rf "/tmp/q8-$tag"
  echo "rc=$rc $(python3 scripts/device/measurements.py steps "$O" "q8-$tag" 2>&1)"
}
record "qwen3-8b old" "$(q8 old old1)"
record "qwen3-8b new" "$(q8 new new1)"
record "qwen3-8b old (again)" "$(q8 old old2)"
grep -ihE "GiB" "$O/q8-new1.err" | head -2 > "$O/q8-memory.txt"
record "qwen3-8b new memory" "$(tr '\n' ' ' < "$O/q8-memory.txt")"

for t in ${GPU_TESTS:-AttentionGpuTest DenseGpuTest LmHeadGpuTest AdamWGpuTest RuntimeTrainerTest GeneratedStepThreadsTest}; do
  timeout "${GPU_TEST_TIMEOUT:-240}" "$D/bin/$t" > "$O/$t.log" 2>&1
  rc=$?
  record "$t" "rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' "$O/$t.log" | tr '\n' ' ')"
done

echo
echo "==== dflashc refactor check ===="
printf '%s\n' "${results[@]}"
