#!/usr/bin/env bash
# expect_fail.sh REGEX CMD...: passes when CMD exits non-zero and its output matches REGEX.
regex="$1"; shift
out=$("$@" 2>&1); rc=$?
echo "$out"
if [ "$rc" -eq 0 ]; then echo "expect_fail: command succeeded, expected a failure"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "expect_fail: output does not match /$regex/"; exit 1; fi
echo "expect_fail: exit $rc and the expected message"
