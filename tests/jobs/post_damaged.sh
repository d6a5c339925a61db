#!/usr/bin/env bash
# hcp_post.py on damaged and unfinished files: one `error:` line and exit 2, no traceback.
# Usage: post_damaged.sh FILE.h5 WORKDIR
set -uo pipefail
src="$1"; work="$2"; py=/usr/bin/python3
post="$(dirname "$0")/../../jobs/post/hcp_post.py"
rm -rf "$work"; mkdir -p "$work"
cp "$src" "$work/damaged.h5"
$py - "$work/damaged.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    names = []
    f["summary"].visititems(lambda n, o: names.append(n) if "max_rel" in o.attrs else None)
    del f["summary"][names[0]].attrs["max_rel"]
PY
check() {  # check WHAT REGEX CMD...: exit 2, the message, no traceback
  local what="$1" regex="$2"; shift 2
  out=$("$@" 2>&1); rc=$?
  echo "$what: exit $rc: $out" | head -3
  [ "$rc" -eq 2 ] || { echo "$what: exit $rc, expected 2"; exit 1; }
  grep -qE "$regex" <<<"$out" || { echo "$what: message does not match /$regex/"; exit 1; }
  ! grep -q "Traceback" <<<"$out" || { echo "$what: a Python traceback"; exit 1; }
}
check damaged "^error: summary: a results file is damaged" $py "$post" summary "$work/damaged.h5"
cp "$src" "$work/run.h5.tmp-1234"
check unfinished "^error: .*is an unfinished results file" $py "$post" summary "$work/run.h5.tmp-1234"
echo "RESULT post_damaged PASS"
