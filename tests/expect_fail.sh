#!/usr/bin/env bash
# expect_fail.sh [--rc N] [--absent PATH] REGEX CMD...: passes when CMD exits with status N (default 2,
# the drivers' code for bad input; 3 is a run-time failure on one rank) and its output matches REGEX.
# With --absent, PATH is removed first and must not exist afterwards (a refused run writes no file,
# not even a partial one).
want=2
absent=""
if [ "$1" = "--rc" ]; then want="$2"; shift 2; fi
if [ "$1" = "--absent" ]; then absent="$2"; shift 2; rm -f -- "$absent"; fi
regex="$1"; shift
out=$("$@" 2>&1); rc=$?
echo "$out"
if [ "$rc" -eq 0 ]; then echo "expect_fail: command succeeded, expected a failure"; exit 1; fi
if [ "$rc" -ne "$want" ]; then echo "expect_fail: exit $rc, expected $want"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "expect_fail: output does not match /$regex/"; exit 1; fi
if [ -n "$absent" ] && [ -e "$absent" ]; then echo "expect_fail: '$absent' exists after a refused run"; exit 1; fi
echo "expect_fail: exit $rc and the expected message${absent:+, no file $absent}"
