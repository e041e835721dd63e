#!/usr/bin/env bash
# Installs what dflashc needs to build and test on Debian 12 (TOOLCHAIN.md).
# Idempotent: does nothing when every package is already installed.
set -euo pipefail

packages=(
  llvm-22-dev libmlir-22-dev mlir-22-tools   # MLIR/LLVM 22, mlir-tblgen, lit, FileCheck
  libtomlplusplus-dev                        # spec parser
  cmake ninja-build g++ libgtest-dev         # build and unit tests
  clang-format-22                            # the format check (scripts/check-format.sh)
  nlohmann-json3-dev libcli11-dev            # runtime JSON and the trainer's command line
  python3-torch python3-numpy                # independent PyTorch oracle of the step (CPU)
  python3-matplotlib                         # tools/dflash-plot (PNG of the metrics)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install packages" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA is not an apt package here: the machine image provides it.
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: error: nvcc not found; dflashc builds CUDA kernels and trainers and needs" >&2
  echo "setup: the CUDA toolkit (13.0) at /usr/local/cuda" >&2
  exit 1
fi
