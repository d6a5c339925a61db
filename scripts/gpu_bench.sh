#!/usr/bin/env bash
# GPU benchmarks against the anchors: bench_kernels on the anchor
# shapes (bf16) and jobs/bench/anchors.py on the same shapes, in one run on one GPU, then the ratio
# table. Usage: scripts/gpu_bench.sh [mamba_ssm source dir]   (HCP_BUILD_DIR default build-gpu,
# HCP_CMAKE_ARGS, HCP_JOBS; results and logs to $HCP_LOG_DIR, default $build/gpu-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup bench
gpu_build "$out" bench_kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
mpirun -n 1 "$build/drivers/bench_kernels" --set bench.device=cuda --set bench.suite=anchors --set bench.dtype=bf16 \
  --set bench.warmup=2 --set bench.repeats="${HCP_REPEATS:-5}" --out "$out/bench_anchors.h5" 2>&1 | tee "$out/bench_anchors.txt"
python3 jobs/bench/anchors.py --out "$out/anchors.json" --repeats 20 ${1:+--mamba-path "$1"} 2>&1 | tee "$out/anchors.txt"
