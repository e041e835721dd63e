#!/usr/bin/env bash
# Fails when pyflakes finds a problem (an unused import or variable, an
# undefined name, an f-string without placeholders, ...) in a tracked Python
# file: every *.py, and the extension-less scripts under tools/, bench/ and
# scripts/ that start with a python shebang. flake8 runs only pyflakes'
# checks (F) and syntax errors (E9), so `# noqa: F401` marks a deliberate
# re-export; layout is not checked. lit configs get lit's `config` as a
# builtin. scripts/setup.sh installs flake8 (Debian 12: 5.0.4, pyflakes 2.5).
# Usage: scripts/check-python.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
flake8=${FLAKE8:-}
for candidate in flake8 /usr/bin/flake8; do
  [[ -n $flake8 ]] && break
  command -v "$candidate" >/dev/null && flake8=$candidate
done
if [[ -z $flake8 ]]; then
  echo "check-python: error: flake8 not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
# Tracked files that are there (a deletion not yet committed is skipped).
present() { while IFS= read -r file; do [[ -f $file ]] && echo "$file"; done; }
mapfile -t modules < <(git ls-files '*.py' | grep -v '/lit\.cfg\.py$' | present)
mapfile -t lit_configs < <(git ls-files 'lit.cfg.py' '*/lit.cfg.py' | present)
scripts=()
while IFS= read -r file; do
  head -n 1 "$file" | grep -q '^#!.*python' && scripts+=("$file")
done < <(git ls-files tools bench scripts | grep -v '/[^/]*\.[^/]*$' | present)
checks=(--select=F,E9 --format='%(path)s:%(row)d:%(col)d: %(text)s')
status=0
"$flake8" "${checks[@]}" "${modules[@]}" "${scripts[@]}" > /tmp/check-python.$$ || status=1
if ((${#lit_configs[@]})); then
  "$flake8" "${checks[@]}" --builtins=config "${lit_configs[@]}" >> /tmp/check-python.$$ || status=1
fi
if ((status)); then
  cat /tmp/check-python.$$ >&2
  cut -d: -f1 /tmp/check-python.$$ | sort -u | sed 's/^/check-python: fix: /' >&2
  rm -f /tmp/check-python.$$
  exit 1
fi
rm -f /tmp/check-python.$$
total=$((${#modules[@]} + ${#scripts[@]} + ${#lit_configs[@]}))
echo "check-python: ${total} files clean"
