#!/usr/bin/env bash
# Online training against offline training: device-check's suite
# online-train (scripts/device/suites/online-train.toml).
exec "$(dirname "$0")/device/device-check" online-train "$@"
