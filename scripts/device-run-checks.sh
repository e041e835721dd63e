#!/usr/bin/env bash
# Bad rows met mid-run and one run per output directory: device-check's
# suite run-checks (scripts/device/suites/run-checks.toml).
exec "$(dirname "$0")/device/device-check" run-checks "$@"
