#!/usr/bin/env bash
# The GPU tests, the tiny trainer against dflash-reference (graph = eager,
# resumed = straight), the qwen3-8b step beside torch.compile and both
# exports through transformers: device-check's suites kernel-tests,
# runtime-tests, tiny and step (scripts/device/suites/). Kept under this
# name for the README; options go to device-check (--dry-run).
exec "$(dirname "$0")/device/device-check" kernel-tests runtime-tests tiny step "$@"
