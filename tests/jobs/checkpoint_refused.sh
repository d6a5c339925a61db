#!/usr/bin/env bash
# A checkpoint proves itself: a changed value fails its checksum, a key that changes the run must
# keep the checkpoint's value, a checkpoint past train.steps is refused: exit 2, the dataset or key
# named, before any step. Changing train.steps or the rank count is allowed.
# Usage: checkpoint_refused.sh WORKDIR TRAIN_HYBRID MPIRUN [ARGS...]
set -uo pipefail
work="$1"; bin="$2"; shift 2
ef="$(dirname "$0")/../expect_fail.sh"; py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work"
common=(--set train.steps=4 --set data.dtype=fp32 --set train.warmup=1)
"$@" -n 2 "$bin" "${common[@]}" --set train.stop_after=2 --set "train.checkpoint=$work/ck.h5" --out "$work/part.h5" \
  > "$work/part.log" 2>&1 || { echo "the checkpointing run failed"; cat "$work/part.log"; exit 1; }
cp "$work/ck.h5" "$work/damaged.h5"
$py - "$work/damaged.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    g = f["/checkpoint/adam_m"]
    d = g[sorted(g.keys())[0]]
    v = d[...]; v.flat[0] = v.flat[0] * 1.5 + 1e-3; d[...] = v
PY
fail=0
expect() { "$ef" "$@" > "$work/expect.log" 2>&1 || { echo "FAILED: $1"; tail -5 "$work/expect.log"; fail=1; }; grep "^expect_fail" "$work/expect.log"; }
expect "error: .*damaged.h5' is damaged: dataset /checkpoint/adam_m/.* fails its checksum" \
  "$@" -n 2 "$bin" "${common[@]}" --set "train.resume=$work/damaged.h5" --out "$work/never.h5"
expect "error: --set data.seed=7: train.resume: key 'data.seed' = 7 but checkpoint .* was written with 1" \
  "$@" -n 2 "$bin" "${common[@]}" --set data.seed=7 --set "train.resume=$work/ck.h5" --out "$work/never.h5"
expect "error: .*key 'data.dtype' = \"fp64\" but checkpoint .* was written with \"fp32\"" \
  "$@" -n 2 "$bin" "${common[@]}" --set data.dtype=fp64 --set "train.resume=$work/ck.h5" --out "$work/never.h5"
expect "error: --set train.steps=2: train.resume: checkpoint .* is at step 2, not before train.steps = 2" \
  "$@" -n 2 "$bin" "${common[@]}" --set train.steps=2 --set "train.resume=$work/ck.h5" --out "$work/never.h5"
[ ! -e "$work/never.h5" ] || { echo "a refused resume wrote a results file"; fail=1; }
# Allowed: more steps, another rank count.
"$@" -n 1 "$bin" "${common[@]}" --set train.steps=5 --set "train.resume=$work/ck.h5" --out "$work/resumed.h5" \
  > "$work/resumed.log" 2>&1 || { echo "resume with train.steps=5 at np 1 failed"; tail -5 "$work/resumed.log"; fail=1; }
[ "$fail" -eq 0 ] && echo "RESULT checkpoint_refused PASS"
