#!/usr/bin/env bash
# Nsight Compute counters for chosen bench_kernels ops (anchor suite, bf16, one timed call each):
# speed of light, compute and memory workload, occupancy, launch statistics, one text file per op.
# Usage: scripts/gpu_profile.sh OP:KERNEL_REGEX [OP:KERNEL_REGEX ...]
#   OP is a bench.only filter (a substring of the op name), KERNEL_REGEX the kernels to profile
#   (e.g. attention_fwd_b2h16l8192d128:fwd_k  grouped_gemm:gemm_tma_k). Needs bench_kernels built in
#   $HCP_BUILD_DIR (default build-gpu, e.g. by scripts/gpu_bench.sh); writes $HCP_LOG_DIR/ncu_<op>.txt.
#   Clocks are left alone (--clock-control none).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup profile
command -v ncu >/dev/null || { echo "gpu_profile: ncu (Nsight Compute) not found"; exit 1; }
[ -x "$build/drivers/bench_kernels" ] || { echo "gpu_profile: $build/drivers/bench_kernels not built"; exit 1; }
rc=0
for spec in "$@"; do
  op="${spec%%:*}" kre="${spec#*:}"
  ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats -k "regex:$kre" -c 2 \
    "$build/drivers/bench_kernels" --set bench.device=cuda --set bench.suite=anchors --set bench.dtype=bf16 \
    --set bench.only="$op" --set bench.warmup=0 --set bench.repeats=1 > "$out/ncu_$op.txt" 2>&1 \
    && echo "ncu $op ($kre): $out/ncu_$op.txt" || { echo "ncu $op: FAILED"; tail -5 "$out/ncu_$op.txt"; rc=1; }
done
exit $rc
