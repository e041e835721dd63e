#!/usr/bin/env bash
# Sets up, builds and runs every test through ctest. GPU tests report skipped
# on a machine without a GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${DFLASH_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${DFLASH_JOBS:-2}"
