# Sourced by the A/B scripts of bench/ab (two trees' builds side by side on
# the GPU machine) for what they share; runs nothing itself. The checks that
# judge one tree are scripts/device/device-check's suites.

# device_start DEFAULT_LOG_DIR: every A/B script's start. D is .device
# (scripts/device-prepare.sh's), O the log directory ($OUT, else the default;
# made), then the card's line.
device_start() {
  D=.device
  O=${OUT:-$1}
  mkdir -p "$O"
  gpu_info
}

# gpu_info: the card, its clock and temperature (the first line of a log, so
# that a number is read against the machine that gave it).
gpu_info() {
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
}

# run_gpu_test BINARY LOG_DIR [SECONDS [LINES]]: runs one GoogleTest binary
# into LOG_DIR/NAME.txt within SECONDS (240), prints "NAME rc=RC" with its
# PASSED / FAILED / SKIPPED summary lines, then up to LINES (8) lines of
# failures and relative errors. Returns the binary's exit status.
run_gpu_test() {
  local bin=$1 dir=$2 seconds=${3:-240} lines=${4:-8} name rc
  name=$(basename "$bin")
  timeout "$seconds" "$bin" > "$dir/$name.txt" 2>&1
  rc=$?
  echo "$name rc=$rc $(grep -a -E '^\[  (PASSED|FAILED|SKIPPED) ' "$dir/$name.txt" | tr '\n' ' ')"
  grep -a -E 'FAILED \]|Failure|rel err' "$dir/$name.txt" | head -n "$lines"
  return $rc
}
