#!/usr/bin/env bash
# Side-by-side timings of kernel variants that environment variables select (the earlier or the
# alternative code path of a kernel): bench_kernels on the anchor shapes (bf16, one GPU) for the ops
# whose name contains OP, once as built and once per VAR (set to 1), all in one run on one machine.
# Usage: scripts/gpu_variants.sh OP VAR...     e.g.
#   scripts/gpu_variants.sh attention_bwd HCP_ATTN_BWD_FUSED_DQ HCP_ATTN_BWD_MASK_ALL HCP_ATTN_MMA_SYNC
#   scripts/gpu_variants.sh attention_fwd HCP_ATTN_FWD_TWO_BLOCKS HCP_ATTN_FWD_NO_TURNS HCP_ATTN_FWD_STAGES3
#   scripts/gpu_variants.sh gemm HCP_GEMM_WG HCP_GEMM_TMA_CLUSTER
# (HCP_BUILD_DIR default build-gpu, built with bench_kernels; HCP_REPEATS default 5; output to stdout
# and, per variant, $HCP_LOG_DIR/variant_<name>.{txt,h5}, default $build/gpu-variants.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
op="$1"; shift
build="${HCP_BUILD_DIR:-build-gpu}"
out="${HCP_LOG_DIR:-$build/gpu-variants}"
bench="$build/drivers/bench_kernels"
[ -x "$bench" ] || { echo "gpu_variants: $bench not built (cmake --build $build --target bench_kernels)" >&2; exit 1; }
for v in "$@"; do
  [[ "$v" =~ ^HCP_[A-Z0-9_]+$ ]] || { echo "gpu_variants: '$v' is not an HCP_* environment variable name" >&2; exit 2; }
done
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for v in default "$@"; do
  echo "# variant: $v"
  env_set=()
  [ "$v" = default ] || env_set=("$v=1")
  env "${env_set[@]}" mpirun -n 1 "$bench" --set bench.device=cuda --set bench.suite=anchors --set bench.dtype=bf16 \
    --set bench.warmup=2 --set bench.repeats="${HCP_REPEATS:-5}" --set bench.only="$op" --out "$out/variant_$v.h5" \
    > "$out/variant_$v.txt" 2>&1 || { tail -20 "$out/variant_$v.txt"; echo "FAIL: variant $v"; exit 1; }
  grep -E "^  " "$out/variant_$v.txt"
done
