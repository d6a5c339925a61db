#!/usr/bin/env bash
# clang-tidy's readability-function-size (the thresholds of .clang-tidy: 120 lines, 200 statements,
# nesting 5) over the project's C++ sources (src, drivers, kernels; CUDA sources aside), against
# tests/jobs/function_size_allow.txt, the functions known to exceed it. Fails on a function over
# the limit that the list does not name, and on a listed function that is now within it (a split
# function leaves the list). clang-tidy 14 is what scripts/setup.sh installs; without it, or
# without the build's compile_commands.json, the check fails (it is never skipped).
# Usage: function_size.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1" build="$2"
allow="$src/tests/jobs/function_size_allow.txt"
tidy=$(command -v clang-tidy-14 || command -v clang-tidy) || { echo "no clang-tidy (scripts/setup.sh installs it)"; exit 1; }
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json"; exit 1; }
cd "$src" || exit 1
mapfile -t files < <(git ls-files 'src/*.cpp' 'drivers/*.cpp' 'kernels/*.cpp')
found=$(printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet \
          --checks='-*,readability-function-size' 2>/dev/null \
        | sed -n "s|^$src/\([^:]*\):[0-9]*:[0-9]*: warning: function '\([^']*\)' exceeds.*|\1 \2|p" | sort -u)
listed=$(grep -v '^#' "$allow" | sed '/^$/d' | sort -u)
new=$(comm -23 <(echo "$found") <(echo "$listed") | sed '/^$/d')
stale=$(comm -13 <(echo "$found") <(echo "$listed") | sed '/^$/d')
echo "functions over the size limit: $(echo "$found" | sed '/^$/d' | wc -l) (listed: $(echo "$listed" | wc -l))"
[ -z "$new" ] || printf 'over the limit, not listed (split it): %s\n' "$new"
[ -z "$stale" ] || printf 'listed, now within the limit (remove it from %s): %s\n' "${allow#$src/}" "$stale"
[ -z "$new" ] && [ -z "$stale" ] && echo "RESULT function_size PASS" || { echo "RESULT function_size FAIL"; exit 1; }
