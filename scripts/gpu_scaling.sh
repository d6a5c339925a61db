#!/usr/bin/env bash
# CP scaling study on one node with several GPUs (one MPI rank per GPU, NCCL): the GPU tests first
# (CUDA kernels, NCCL / staged communicators, CP on GPU ranks at np 1, 2, 4), then strong and weak
# scaling through jobs/slurm/cp_scaling.sbatch under mpirun for
#   cp_attention  every strategy, bf16, head_dim 128 (the tensor-core kernels), cp=1 check off
#   cp_mamba      hidden_parallel and state_passing (bf16 at Mamba2 sizes on GPUs, fp32 on CPU ranks)
#   cp_hybrid     every attention strategy (fp32, the nano-like deck)
# with CP sizes 1, 2, 4, 8 up to the GPUs present. Per run one HDF5 file; per study (hcp_post.py
# study) study.txt (step time, ring overlap, per-phase/per-layer times, summary), timings.csv and
# the scaling, breakdown and errors plots, in $HCP_LOG_DIR.
# Usage: scripts/gpu_scaling.sh            (HCP_BUILD_DIR default build-gpu, HCP_CMAKE_ARGS, HCP_JOBS,
#        HCP_LOG_DIR default $build/gpu-scaling; HCP_TOKENS_ATTN/HCP_TOKENS_MAMBA/HCP_TOKENS_HYBRID strong
#        totals, weak per-rank tokens = strong / 8)
#        HCP_DEVICE=host scripts/gpu_scaling.sh   the same study on CPU ranks (small sizes; no GPU tests)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. scripts/gpu_build.sh
gpu_setup scaling
device="${HCP_DEVICE:-cuda}"
if [ "$device" = cuda ]; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "${ngpu:-0}" -ge 1 ] || { echo "gpu_scaling: no GPU (nvidia-smi -L lists none); HCP_DEVICE=host runs on CPU ranks"; exit 1; }
  ranks=$ngpu
  gpu_build "$out"
  ctest --test-dir "$build" -R test_cuda --output-on-failure > "$out/ctest_gpu.log" 2>&1 && tail -3 "$out/ctest_gpu.log" \
    || { tail -30 "$out/ctest_gpu.log"; echo "FAIL: GPU tests"; gpu_tests_failed=1; }
  extra_dev="--set run.device=cuda"
  t_attn="${HCP_TOKENS_ATTN:-131072}" t_mamba="${HCP_TOKENS_MAMBA:-32768}" t_hyb="${HCP_TOKENS_HYBRID:-16384}"
else
  ranks="${HCP_RANKS:-4}"
  [ -x "$build/drivers/cp_attention" ] || { echo "gpu_scaling: $build/drivers not built"; exit 1; }
  extra_dev=""
  t_attn="${HCP_TOKENS_ATTN:-512}" t_mamba="${HCP_TOKENS_MAMBA:-256}" t_hyb="${HCP_TOKENS_HYBRID:-256}"
fi
sizes=""
for c in 1 2 4 8; do [ "$c" -le "$ranks" ] && sizes="$sizes $c"; done
echo "# gpu_scaling: device=$device ranks=$ranks cp sizes:$sizes out=$out"
study() {  # driver mode tokens extra...
  local driver="$1" mode="$2" tokens="$3"; shift 3
  HCP_ROOT="$root" HCP_BUILD_DIR="$build" HCP_LAUNCH=mpirun SLURM_NTASKS="$ranks" HCP_DRIVER="$driver" HCP_MODE="$mode" \
    HCP_CP_SIZES="$sizes" HCP_TOKENS="$tokens" HCP_OUTDIR="$out/${driver}_$mode" \
    HCP_EXTRA="$extra_dev --set run.check=off --set run.warmup=1 --set run.repeats=3 $*" \
    bash jobs/slurm/cp_scaling.sbatch > "$out/${driver}_$mode.log" 2>&1 \
    && tail -1 "$out/${driver}_$mode.log" || { tail -20 "$out/${driver}_$mode.log"; echo "FAIL: $driver $mode"; return 1; }
}
rc=${gpu_tests_failed:-0}
attn_args="--set data.dtype=$([ "$device" = cuda ] && echo bf16 || echo fp32) --set attention.head_dim=$([ "$device" = cuda ] && echo 128 || echo 16)"
# On GPUs the Mamba layer at Mamba2 / Nemotron-H sizes in bf16 (the tensor-core SSD): head_dim 64,
# d_state 128, chunk 128, 32 heads in 8 groups.
mamba_args="--set data.dtype=fp32"
[ "$device" = cuda ] && mamba_args="--set data.dtype=bf16 --set mamba.hidden=1024 --set mamba.heads=32 --set mamba.head_dim=64 --set mamba.n_groups=8 --set mamba.d_state=128 --set mamba.chunk=128"
for mode in strong weak; do
  div=1; [ "$mode" = weak ] && div=8
  study cp_attention "$mode" $((t_attn / div)) $attn_args || rc=1
  study cp_mamba "$mode" $((t_mamba / div)) $mamba_args || rc=1
  study cp_hybrid "$mode" $((t_hyb / div)) --deck "$root/inputs/hybrid_nano_like.toml" --set data.dtype=fp32 || rc=1
done
echo "RESULT gpu_scaling $([ $rc = 0 ] && echo DONE || echo FAIL) out=$out"
exit $rc
