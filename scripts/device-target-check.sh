#!/usr/bin/env bash
# The online target's CPU graph against transformers: device-check's suite
# target-oracle (scripts/device/suites/target-oracle.toml).
#   scripts/device-target-check.sh --prepare   here: its inputs into .device/target
#   scripts/device-target-check.sh             on the GPU machine
if [[ ${1:-} == --prepare ]]; then
  exec "$(dirname "$0")/device-prepare.sh" --items target-oracle
fi
exec "$(dirname "$0")/device/device-check" target-oracle "$@"
