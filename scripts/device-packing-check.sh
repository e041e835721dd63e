#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (scripts/device-prepare.sh, then
# test/oracle/pack_rows.py .device/tiny/data .device/tiny/packed 40 90 and
# dflash-reference --precision storage on those rows into
# .device/ref/tiny-packed-{losses.jsonl,params}): the tiny trainer on packed
# rows (SEMANTICS.md section 9) against the CPU reference on the same files,
# 10 steps, losses and final parameters within the tolerances that
# scripts/device-validate.sh uses for unpacked rows. Logs go to $OUT.
set -u
D=.device
O=${OUT:-/tmp/dflash-packing}
mkdir -p "$O"
rm -rf /tmp/tiny-packed
timeout 120 "$D/bin/train-tiny" --target "$D/tiny/target" --data "$D/tiny/packed" \
  --init "$D/tiny/init" --steps 10 --out /tmp/tiny-packed \
  --log "$O/tiny-packed.jsonl" 2> "$O/tiny-packed.err"
echo "tiny on packed rows: rc=$?"
python3 scripts/compare-runs.py --losses "$O/tiny-packed.jsonl" \
  "$D/ref/tiny-packed-losses.jsonl" --steps 10 --loss-tol 2e-2 \
  --params /tmp/tiny-packed/final/model.safetensors \
  "$D/ref/tiny-packed-params/model.safetensors" --param-tol 5e-2 \
  > "$O/tiny-packed-parity.txt" 2>&1
echo "packed parity: rc=$? $(grep -E 'worst' "$O/tiny-packed-parity.txt" | tr '\n' ' ')"
