#!/usr/bin/env bash
# Held-out evaluation against the CPU reference: device-check's suite eval
# (scripts/device/suites/eval.toml).
exec "$(dirname "$0")/device/device-check" eval "$@"
