#!/usr/bin/env bash
# Runs on the GPU machine over .device/ (bin/train-tiny built from this tree,
# bin/dflash-synth): the run-level checks of one tiny trainer that need a
# GPU. Logs go to $OUT; a table is printed last.
#   bad rows: 64 rows with NaN features in 3 of them train through two
#             epochs with finite losses, skipping and naming exactly those 3;
#             with --max-bad-rows 2 the run stops at the third, naming it.
#   one run per directory: a second train into a live run's --out is
#             refused at once; the first ends with all its metrics.
set -u
D=.device
O=${OUT:-/tmp/dflash-run-checks}
mkdir -p "$O"
train=$D/bin/train-tiny
results=()
record() { results+=("$(printf '%-34s %s' "$1" "$2")"); echo "${results[-1]}"; }

W=/tmp/run-checks
rm -rf "$W" && mkdir -p "$W"
"$D/bin/dflash-synth" specs/tiny.toml "$W/p" --rows 64 > /dev/null
python3 scripts/poison-rows.py "$W/p/data" "$W/p/bad" 5 30 61 > "$O/poisoned.txt"

# Two epochs: 64 rows, 2 per step.
timeout 120 "$train" --target "$W/p/target" --data "$W/p/bad" --init "$W/p/init" \
  --steps 64 --out "$W/br" --log "$O/bad-rows.jsonl" 2> "$O/bad-rows.err"
rc=$?
python3 - "$O/bad-rows.jsonl" "$O/bad-rows.err" "$O/poisoned.txt" "$rc" > "$O/bad-rows.txt" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
err = open(sys.argv[2]).read()
poisoned = [l.strip() for l in open(sys.argv[3]) if l.strip()]
finite = all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows)
named = [p for p in poisoned if p + ":" in err]
print("rc=%s steps %d all finite %s skipped_rows %s; %d of %d poisoned rows named; %s" % (
    sys.argv[4], len(rows), finite, rows[-1]["skipped_rows"] if rows else None,
    len(named), len(poisoned),
    "PASS" if sys.argv[4] == "0" and len(rows) == 64 and finite and rows[-1]["skipped_rows"] == 3
    and len(named) == 3 and "skipped 3 rows" in err else "FAIL"))
PY
record "bad rows, 2 epochs" "$(cat "$O/bad-rows.txt")"

timeout 120 "$train" --target "$W/p/target" --data "$W/p/bad" --init "$W/p/init" \
  --steps 64 --max-bad-rows 2 --out "$W/br2" --log "$O/bad-rows-2.jsonl" 2> "$O/bad-rows-2.err"
rc=$?
third=$(grep -o "train: error: .*(row 3 with non-finite features; at most 2 are skipped" "$O/bad-rows-2.err" | head -1)
named=0
while read -r p; do [[ -n $p && $third == *"$p:"* ]] && named=1; done < "$O/poisoned.txt"
record "bad rows, --max-bad-rows 2" "rc=$rc $([[ $rc == 1 && $named == 1 ]] && echo PASS || echo FAIL): ${third:0:160}"

# One run per directory: B starts while A runs.
"$train" --data synthetic --steps 400 --out "$W/lock" --log "$O/lock-a.jsonl" 2> "$O/lock-a.err" &
a=$!
sleep 3
timeout 60 "$train" --data synthetic --steps 5 --seed 9 --out "$W/lock" 2> "$O/lock-b.err"
rc_b=$?
wait $a
rc_a=$?
lines=$(grep -c '^{' "$O/lock-a.jsonl")
record "second run into a live run's --out" "A rc=$rc_a with $lines metrics lines; B rc=$rc_b: $(head -c 160 "$O/lock-b.err")"

echo
echo "==== dflashc run checks ===="
printf '%s\n' "${results[@]}"
