#!/usr/bin/env bash
# The qwen3-8b-b16 step beside torch.compile, and on two GPUs where there
# are two: device-check's suites step and scaling (scripts/device/suites/).
exec "$(dirname "$0")/device/device-check" step scaling "$@"
