#!/usr/bin/env bash
# Checkpoint + resume reproduce the uninterrupted run bit for bit, and the same deck twice gives
# identical results. Usage: train_resume.sh <mpirun and its options...> <train_hybrid> <work dir>
set -euo pipefail
args=("$@"); n=${#args[@]}
dir="${args[n-1]}"; bin="${args[n-2]}"; mpirun=("${args[@]:0:n-2}")
rm -rf "$dir"; mkdir -p "$dir"
common=(--set train.steps=8 --set data.dtype=fp32 --set train.warmup=2)
run() { "${mpirun[@]}" -n 2 "$bin" "${common[@]}" "$@" | tail -1; }
run --out "$dir/full.h5"
run --out "$dir/full_again.h5"
run --set train.stop_after=3 --set "train.checkpoint=$dir/ck.h5" --out "$dir/part.h5"
run --set "train.resume=$dir/ck.h5" --out "$dir/resumed.h5"
for f in full_again resumed; do
  h5diff "$dir/full.h5" "$dir/$f.h5" /train/loss || { echo "FAIL: /train/loss of $f differs"; exit 1; }
  h5diff "$dir/full.h5" "$dir/$f.h5" /params || { echo "FAIL: /params of $f differ"; exit 1; }
done
echo "RESULT train_resume PASS"
