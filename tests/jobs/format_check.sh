#!/usr/bin/env bash
# The C++/CUDA sources tracked by git against .clang-format, in check mode: lists the files that
# clang-format would change (clang-format -i FILE fixes one). Formatting differs between
# clang-format versions; the house style is checked with the version .clang-format names (14), the
# one scripts/setup.sh installs (Debian 12's clang-format). Another version, or none, fails the
# check: it is never skipped.
# Usage: format_check.sh REPO
set -uo pipefail
cd "$1" || exit 2
fmt=$(command -v clang-format-14 || command -v clang-format) || { echo "no clang-format (scripts/setup.sh installs it)"; exit 1; }
major=$("$fmt" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
[ "$major" = 14 ] || { echo "clang-format $major: the style is checked with 14 (scripts/setup.sh installs it)"; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f")
done
if [ "${#bad[@]}" -gt 0 ]; then
  printf 'not formatted (clang-format -i): %s\n' "${bad[@]}"
  echo "RESULT format_check FAIL ${#bad[@]} of ${#files[@]} files"
  exit 1
fi
echo "RESULT format_check PASS ${#files[@]} files"
