#!/usr/bin/env bash
# The hybrid model's blocks, stacks and a training run at Nemotron-3-Nano width on one GPU, beside
# the same blocks and a training loop of them in PyTorch timed on that GPU (jobs/bench/anchors.py
# --only blocks,train), then the table of jobs/post/hcp_blocks.py. Usage: scripts/gpu_blocks.sh [mamba_ssm source dir]
# (HCP_BUILD_DIR default build-gpu, HCP_CMAKE_ARGS, HCP_JOBS, HCP_LENS default "8192 32768";
# results and logs to $HCP_LOG_DIR, default $build/gpu-blocks).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup blocks
lens="${HCP_LENS:-8192 32768}"
gpu_build "$out" cp_hybrid train_hybrid
hyb=(mpirun -n 1 "$build/drivers/cp_hybrid" --deck inputs/hybrid_nano_blocks.toml --set run.device=cuda
     --set parallel.attention=p2p --set run.save=timings,memory --quiet)
files=()
for L in $lens; do
  "${hyb[@]}" --set data.seqlen="$L" --out "$out/mxe_l$L.h5" > "$out/mxe_l$L.txt" 2>&1 || { tail -20 "$out/mxe_l$L.txt"; exit 1; }
  files+=("$out/mxe_l$L.h5")
done
first=${lens%% *}
"${hyb[@]}" --set data.seqlen="$first" --set model.pattern='MEMEM*EMEMEM*' --set run.repeats=3 \
  --out "$out/nano13_l$first.h5" > "$out/nano13.txt" 2>&1 || { tail -20 "$out/nano13.txt"; exit 1; }
files+=("$out/nano13_l$first.h5")
mpirun -n 1 "$build/drivers/train_hybrid" --deck inputs/train_nano_width.toml --set run.device=cuda \
  --out "$out/train.h5" > "$out/train.txt" 2>&1 || { tail -20 "$out/train.txt"; exit 1; }
tail -3 "$out/train.txt"
files+=("$out/train.h5")
python3 jobs/bench/anchors.py --only blocks,train --block-lens "${lens// /,}" --warmup 3 --repeats 10 ${1:+--mamba-path "$1"} \
  --out "$out/anchors_blocks.json" > "$out/anchors_blocks.txt" 2>&1 || { tail -20 "$out/anchors_blocks.txt"; exit 1; }
python3 jobs/post/hcp_blocks.py --anchors "$out/anchors_blocks.json" "${files[@]}" | tee "$out/blocks.txt"
