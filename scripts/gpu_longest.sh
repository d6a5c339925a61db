#!/usr/bin/env bash
# The longest sequence whose training step fits in one GPU's memory, ours and PyTorch's, for the
# Nano-width M*E stack (inputs/hybrid_nano_blocks.toml, one BSHD row, bf16, cp = 1). Ours: the
# memory model (`cp_hybrid --dry-run` on this GPU, its free memory as the limit) at each length of
# HCP_LONGEST_LENS, then one step at the longest it admits (run.warmup 1, run.repeats 1), which must
# run; PyTorch: `anchors.py --only longest` over the same lengths (one step each until one runs out
# of memory). Usage: scripts/gpu_longest.sh [mamba_ssm source dir]   (HCP_BUILD_DIR default build-gpu,
# HCP_CMAKE_ARGS, HCP_JOBS, HCP_LONGEST_LENS default "131072 163840 196608 229376 262144"; results
# and logs in $HCP_LOG_DIR, default $build/gpu-longest).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup longest
lens="${HCP_LONGEST_LENS:-131072 163840 196608 229376 262144}"
gpu_build "$out" cp_hybrid
hyb=(mpirun -n 1 "$build/drivers/cp_hybrid" --deck inputs/hybrid_nano_blocks.toml --set run.device=cuda
     --set parallel.attention=p2p --set run.save=timings,memory --quiet)
admitted=0
echo "# ours, by the memory model: L  estimate_GiB  limit_GiB  fits"
for L in $lens; do
  "${hyb[@]}" --set data.seqlen="$L" --dry-run > "$out/dry_l$L.txt" 2>&1 || { tail -5 "$out/dry_l$L.txt"; exit 1; }
  line=$(grep '^MEMORY ' "$out/dry_l$L.txt" | sed 's/^MEMORY //')
  fits=$(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); print(m["every_rank"]/2**30, m["limit"]/2**30, m["fits"])' "$line")
  echo "$L $fits"
  case "$fits" in *True) admitted=$L ;; esac
done
rc=0
if [ "$admitted" -gt 0 ]; then
  if "${hyb[@]}" --set data.seqlen="$admitted" --set run.warmup=1 --set run.repeats=1 \
      --out "$out/mxe_l$admitted.h5" > "$out/run_l$admitted.txt" 2>&1; then
    echo "ours: the step ran at $admitted tokens ($out/mxe_l$admitted.h5)"
  else
    echo "ours: the step at $admitted tokens, admitted by the memory model, FAILED"
    tail -20 "$out/run_l$admitted.txt"
    rc=1
  fi
else
  echo "ours: the memory model admits none of: $lens"
fi
python3 jobs/bench/anchors.py --only longest --longest-lens "${lens// /,}" ${1:+--mamba-path "$1"} \
  --out "$out/anchors_longest.json" > "$out/anchors_longest.txt" 2>&1 || { tail -20 "$out/anchors_longest.txt"; rc=1; }
grep longest "$out/anchors_longest.txt" | sed 's/^/PyTorch: /'
exit $rc
