#!/usr/bin/env bash
# The online target on GPUs of its own (2 to 4 GPUs): device-check's suite
# online-split (scripts/device/suites/online-split.toml).
exec "$(dirname "$0")/device/device-check" online-split "$@"
