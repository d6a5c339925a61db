#!/usr/bin/env bash
# Long-context runs on host ranks, every strategy checked against the first (run.check = "cross",
# no rank holds the global problem), then the table of what CP trades (hcp_post.py scale):
#   cp_attention  16 384 tokens, GQA 8:2 heads of 64, fp32, np 1 2 4 8
#   cp_mamba     131 072 tokens, built-in layer, fp32, both Mamba CP strategies, np 1 2 4 8
#   cp_hybrid     32 768 tokens, inputs/hybrid_nano_like.toml, fp32, np 2 4 8
# Usage: jobs/bench/long_context_cpu.sh [OUTDIR]  (default results/long_context). One rank per core,
# pinned, where the ranks fit on the cores; oversubscribed (unpinned) beyond. Variables: HCP_BUILD_DIR,
# HCP_NPS (rank counts, default "1 2 4 8"; cp_hybrid skips 1), HCP_ONLY (one driver).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${HCP_BUILD_DIR:-$root/build}"
out="${1:-$root/results/long_context}"
mkdir -p "$out"
cores=$(nproc)
common=(--quiet --set data.format=bshd --set data.batch=1 --set data.dtype=fp32 --set run.check=cross)
run() {  # driver np tag args...
  local drv=$1 np=$2 tag=$3
  shift 3
  [ -n "${HCP_ONLY:-}" ] && [ "$HCP_ONLY" != "$drv" ] && return 0
  local bind=(--bind-to none)
  [ "$np" -le "$cores" ] && bind=(--bind-to core --map-by core)
  local f="$out/${tag}_np${np}.h5"
  local t0=$SECONDS
  mpirun -n "$np" "${bind[@]}" "$build/drivers/$drv" "${common[@]}" --out "$f" "$@" | grep -E "^RESULT"
  echo "#   $drv np $np: $((SECONDS - t0)) s wall"
}
for np in ${HCP_NPS:-1 2 4 8}; do
  run cp_attention "$np" attention_16k --set data.seqlen=16384 --set attention.heads=8 --set attention.kv_heads=2 \
    --set attention.head_dim=64 --set parallel.attention=all --set run.warmup=1 --set run.repeats=1
  run cp_mamba "$np" mamba_128k --set data.seqlen=131072 --set parallel.mamba_cp=all --set run.warmup=1 --set run.repeats=1
  [ "$np" -ge 2 ] && run cp_hybrid "$np" hybrid_32k --deck "$root/inputs/hybrid_nano_like.toml" --set data.seqlen=32768 \
    --set parallel.attention=all --set run.warmup=0 --set run.repeats=1
done
/usr/bin/python3 "$root/jobs/post/hcp_post.py" scale "$out"/*.h5
