#!/usr/bin/env bash
# Packed rows against the CPU reference: device-check's suite packing
# (scripts/device/suites/packing.toml).
exec "$(dirname "$0")/device/device-check" packing "$@"
