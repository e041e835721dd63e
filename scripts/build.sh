#!/usr/bin/env bash
# Configures and builds dflashc into build/ (or $DFLASH_BUILD_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLASH_BUILD_DIR:-$root/build}
export PATH=/usr/local/cuda/bin:$PATH

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    -DMLIR_LINK_MLIR_DYLIB=ON \
    -DDFLASH_WERROR=ON
fi
# About 1.5 GB per compile job: two jobs fit a 2-core, 24 GB machine.
jobs=${DFLASH_JOBS:-$(( $(nproc) < 4 ? 2 : $(nproc) ))}
cmake --build "$build" -j "$jobs"
