#!/usr/bin/env bash
# Checks that every C++ file follows .clang-format (Debian's clang-format, installed by setup.sh).
# Fix with: clang-format -i $(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/loom_format.$$; then
  head -40 /tmp/loom_format.$$ >&2
  rm -f /tmp/loom_format.$$
  echo "check_format: files differ from .clang-format; run: clang-format -i \$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')" >&2
  exit 1
fi
rm -f /tmp/loom_format.$$
echo "check_format: ${#files[@]} files follow .clang-format"
