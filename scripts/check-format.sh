#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source differs from clang-format-22's layout
# (.clang-format at the root; TableGen is not formatted). Every machine
# formats alike because scripts/setup.sh installs the same clang-format.
# Usage: scripts/check-format.sh [--fix]   (--fix rewrites the files)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
format=${CLANG_FORMAT:-}
for candidate in clang-format-22 /usr/lib/llvm-22/bin/clang-format; do
  [[ -n $format ]] && break
  command -v "$candidate" >/dev/null && format=$candidate
done
if [[ -z $format ]]; then
  echo "check-format: error: clang-format-22 not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | grep -v '^test/.*/Inputs/')
if [[ ${1:-} == --fix ]]; then
  "$format" -i "${files[@]}"
  exit 0
fi
if ! "$format" --dry-run --Werror "${files[@]}" 2> /tmp/check-format.$$; then
  grep -E '^[^ ]+:[0-9]+:[0-9]+: error' /tmp/check-format.$$ | cut -d: -f1 | sort -u \
    | sed 's/^/check-format: needs formatting: /' >&2
  rm -f /tmp/check-format.$$
  echo "check-format: run scripts/check-format.sh --fix" >&2
  exit 1
fi
rm -f /tmp/check-format.$$
echo "check-format: ${#files[@]} files formatted"
