#!/usr/bin/env bash
# The main job on the bundled default: sets up and builds dflashc, compiles
# specs/tiny.toml into a trainer (build/tiny-trainer/train, built with nvcc),
# prints its summary; where a GPU is present, trains it for a few steps on
# synthetic data with live progress.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
spec=${1:-$root/specs/tiny.toml}
steps=${DFLASH_RUN_STEPS:-20}
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${DFLASH_BUILD_DIR:-$root/build}
out=$build/$(basename "$spec" .toml)-trainer

"$build/bin/dflashc" "$spec" --summary -o "$out"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  rm -rf "$out/run"
  "$out/train" --data synthetic --steps "$steps" --out "$out/run"
  echo "run: trained $steps steps; metrics in $out/run/metrics.jsonl, drafter in $out/run/final"
else
  echo "run: no GPU on this machine: the trainer is built ($out/train); stopping before training"
fi
