#!/usr/bin/env bash
# Data parallel and ZeRO-1 (two GPUs; the one-GPU checks on any machine):
# device-check's suites runtime-tests (RuntimeTrainerTest's two-GPU cases)
# and data-parallel (scripts/device/suites/data-parallel.toml).
exec "$(dirname "$0")/device/device-check" runtime-tests data-parallel "$@"
