#!/usr/bin/env bash
# hcp_post.py compare must fail, naming the tensor, when one element of one tensor of a copy of a
# results file is changed (and pass on the unchanged copy). Usage: compare_detects.sh FILE.h5 WORKDIR
set -euo pipefail
src="$1"; work="$2"; py=/usr/bin/python3
post="$(dirname "$0")/../../jobs/post/hcp_post.py"
mkdir -p "$work"; cp "$src" "$work/a.h5"; cp "$src" "$work/b.h5"
$py "$post" compare "$work/a.h5" "$work/b.h5" --rtol 0 --atol 0 | grep -q "RESULT compare PASS" || { echo "unchanged copy did not pass"; exit 1; }
# A different result, not a damaged file: the manifest line of the changed tensor is renewed.
$py - "$work/b.h5" "$(dirname "$post")" <<'PY'
import sys, h5py, numpy as np
sys.path.insert(0, sys.argv[2])
from hcp_files import _checksum
with h5py.File(sys.argv[1], "r+") as f:
    d = f["/gradients/p2p/logits"]
    v = d[...]; v.flat[3] += 1e-3 * (abs(v).max() + 1); d[...] = v
    text = bytes(f["checksums"][()]).decode()
    lines = [l if not l.startswith("/gradients/p2p/logits ") else "/gradients/p2p/logits " + _checksum(d[()])
             for l in text.split("\n")]
    f["checksums"][...] = np.frombuffer("\n".join(lines).encode(), dtype=np.uint8)
PY
set +e
out=$($py "$post" compare "$work/a.h5" "$work/b.h5" --rtol 1e-12); rc=$?
set -e
echo "$out" | grep -E "FAIL|RESULT"
[ $rc -eq 1 ] || { echo "compare exited $rc, expected 1"; exit 1; }
echo "$out" | grep -qE "/gradients/p2p/logits +[0-9.e+-]+ +[0-9.e+-]+ +FAIL" || { echo "the changed tensor is not named"; exit 1; }
echo "RESULT compare_detects PASS"
