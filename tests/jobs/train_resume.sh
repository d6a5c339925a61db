#!/usr/bin/env bash
# Checkpoint + resume reproduce the uninterrupted run bit for bit, the same deck twice gives
# identical results, and a checkpoint resumes at other rank counts and EP sizes. Usage: train_resume.sh <mpirun and its options...> <train_hybrid> <work dir>
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
# A checkpoint holds every parameter and moment whole (the experts' written by their owners), so it
# loads at another rank count and EP size: fp64, written at np 2 (ep 2), resumed at np 1 and at np 4
# (ep 4 and ep 2), the uninterrupted np 2 curve and final parameters within rounding.
f64=(--set train.steps=8 --set data.dtype=fp64 --set train.warmup=2)
"${mpirun[@]}" -n 2 "$bin" "${f64[@]}" --out "$dir/f64.h5" | tail -1
"${mpirun[@]}" -n 2 "$bin" "${f64[@]}" --set train.stop_after=3 --set "train.checkpoint=$dir/ck64.h5" --out "$dir/part64.h5" | tail -1
for run in "1 0" "4 0" "4 2"; do
  set -- $run
  "${mpirun[@]}" -n "$1" "$bin" "${f64[@]}" --set parallel.ep="$2" --set "train.resume=$dir/ck64.h5" \
    --out "$dir/f64_np$1_ep$2.h5" | tail -1
  h5diff -p 1e-12 "$dir/f64.h5" "$dir/f64_np$1_ep$2.h5" /train/loss || { echo "FAIL: loss resumed at np $1 ep $2"; exit 1; }
  h5diff -d 1e-13 "$dir/f64.h5" "$dir/f64_np$1_ep$2.h5" /params || { echo "FAIL: params resumed at np $1 ep $2"; exit 1; }
done
echo "RESULT train_resume PASS"
