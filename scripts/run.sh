#!/usr/bin/env bash
# The main job on the bundled default: sets up, builds, compiles
# specs/tiny.toml and prints its graph and summary; where a GPU is present,
# it then trains the drafter for a few steps on synthetic data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
spec=${1:-$root/specs/tiny.toml}
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
bin=${DFLASH_BUILD_DIR:-$root/build}/bin

"$bin/dflashc" "$spec" --emit=graph --summary

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "run: a GPU is present, but the trainer is not built yet (issue: lowering to CUDA)"
else
  echo "run: no GPU on this machine: stopping after compilation"
fi
