#!/usr/bin/env bash
# The attention backward's kernel forms side by side on one GPU: build, the attention kernel tests
# (every form against the host kernels, bitwise repeats), compute-sanitizer memcheck and racecheck on
# them, bench_kernels on the attention anchor shapes with bench.variant = all, PyTorch SDPA (FA2 and
# cuDNN) on the same shapes, the ratio table, and Nsight Compute's speed-of-light sections of the dK/dV
# kernels at one shape.
# Usage: scripts/gpu_attention.sh   (HCP_BUILD_DIR default build-gpu, HCP_CMAKE_ARGS, HCP_JOBS,
# HCP_REPEATS (default 5), HCP_BENCH_ONLY (default attention), HCP_NCU_SHAPE (bench op, default
# attention_bwd_b1h32g2l8192d128; empty: no Nsight Compute); results and logs to $HCP_LOG_DIR, default
# $build/gpu-attention).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup attention
gpu_build "$out" test_cuda_kernels bench_kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
rc=0
filter='*ttention*:*BitwiseRepeatable*'
"$build/tests/test_cuda_kernels" --gtest_filter="$filter" > "$out/test_attention.log" 2>&1 \
  && echo "attention kernel tests: $(grep -c '^\[       OK \]' "$out/test_attention.log") passed" \
  || { echo "attention kernel tests: FAILED"; grep -E "FAILED|Failure|error" "$out/test_attention.log" | head -20; rc=1; }
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test_cuda_kernels" \
      --gtest_filter='*AttentionForwardBackwardSegmentsGqa*' > "$out/sanitizer_$tool.log" 2>&1 \
      && echo "compute-sanitizer $tool: clean" || { echo "compute-sanitizer $tool: FAILED"; tail -15 "$out/sanitizer_$tool.log"; rc=1; }
  done
fi
mpirun -n 1 "$build/drivers/bench_kernels" --set bench.device=cuda --set bench.suite=anchors --set bench.dtype=bf16 \
  --set bench.only="${HCP_BENCH_ONLY:-attention}" --set bench.variant=all --set bench.warmup=2 \
  --set bench.repeats="${HCP_REPEATS:-5}" --out "$out/bench_attention.h5" > "$out/bench_attention.txt" 2>&1 \
  || { echo "bench_kernels: FAILED"; tail -20 "$out/bench_attention.txt"; exit 1; }
python3 jobs/bench/anchors.py --only attention --out "$out/anchors_attention.json" --repeats 10 \
  > "$out/anchors_attention.txt" 2>&1 || { echo "anchors.py: FAILED"; tail -20 "$out/anchors_attention.txt"; rc=1; }
python3 jobs/post/hcp_post.py anchors --anchors "$out/anchors_attention.json" "$out/bench_attention.h5" \
  | tee "$out/table_attention.txt" || rc=1
shape="${HCP_NCU_SHAPE-attention_bwd_b1h32g2l8192d128}"
if [ -n "$shape" ] && command -v ncu >/dev/null; then
  ncu --clock-control none --kernel-name regex:'dkv_k|dq_k' --section SpeedOfLight --section Occupancy \
    "$build/drivers/bench_kernels" --set bench.device=cuda --set bench.suite=anchors --set bench.dtype=bf16 \
    --set bench.only="$shape" --set bench.variant=all --set bench.warmup=0 --set bench.repeats=1 \
    > "$out/ncu_attention_bwd.txt" 2>&1 || { echo "ncu: FAILED"; tail -5 "$out/ncu_attention_bwd.txt"; }
fi
exit $rc
