#!/usr/bin/env bash
# CP ranks sharing one GPU through CUDA IPC: the communicator and CP tests on GPU ranks at np 1, 2
# and 4 (IPC against host arithmetic, and device CP over IPC against the host CP code over MPI), a
# training run at np 2 against its cp=1 replica, then the Nano-width M*E step
# (inputs/hybrid_nano_blocks.toml) at np 1 and $HCP_NPS for every attention strategy and both
# Mamba CP strategies, and at np 2 host-staged (run.comm=mpi) beside it; again under NVIDIA MPS when
# it is at hand (HCP_MPS=0: not). Prints each step's median (slowest rank) and its ratio to np 1
# (at np 1 the communicator is NCCL), then the Mamba2 layer alone (cp_mamba, both Mamba CP
# strategies) at the same np with its phases.
# Usage: scripts/gpu_shared.sh   (HCP_BUILD_DIR default build-gpu, HCP_CMAKE_ARGS, HCP_JOBS, HCP_LEN
# default 8192, HCP_NPS default "2 4"; results and logs in $HCP_LOG_DIR, default $build/gpu-shared)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup shared
len="${HCP_LEN:-8192}"
nps="${HCP_NPS:-2 4}"
gpu_build "$out" test_cuda_comm test_cuda_cp cp_hybrid cp_mamba train_hybrid
rc=0
ctest --test-dir "$build" -R "test_cuda_(comm|cp)" --output-on-failure > "$out/ctest.log" 2>&1 \
  && grep -E "tests passed|Total Test" "$out/ctest.log" || { tail -60 "$out/ctest.log"; echo "FAIL: GPU tests"; rc=1; }
mpirun -n 2 "$build/drivers/train_hybrid" --set run.device=cuda --set train.steps=12 --out "$out/train_np2.h5" \
  > "$out/train_np2.txt" 2>&1 && tail -2 "$out/train_np2.txt" || { tail -20 "$out/train_np2.txt"; echo "FAIL: train_hybrid np 2"; rc=1; }
strategies=$("$build/drivers/cp_hybrid" --list-strategies | tr "\n" " ")  # the attention strategies, as rows name them
hyb=("$build/drivers/cp_hybrid" --deck inputs/hybrid_nano_blocks.toml --set run.device=cuda --set data.seqlen="$len"
     --set parallel.attention=all --set run.save=timings,memory)
step() {  # name np extra...: one run; prints "name np strategy step_ms" rows into $out/steps.txt
  local name="$1" np="$2"
  shift 2
  if mpirun -n "$np" "${hyb[@]}" "$@" --out "$out/${name}_np$np.h5" > "$out/${name}_np$np.txt" 2>&1; then
    awk -v n="$name" -v p="$np" -v names="$strategies" 'BEGIN {split(names, a, " "); for (i in a) known[a[i]] = 1}
      ($1 in known) {print n, p, $1, $3}' "$out/${name}_np$np.txt" >> "$out/steps.txt"
  else
    tail -20 "$out/${name}_np$np.txt"
    echo "FAIL: $name np $np"
    rc=1
  fi
}
: > "$out/steps.txt"
# The Mamba2 layer alone at Nano width (BSHD, one row of $len tokens, bf16), both Mamba CP
# strategies in one run: each phase's median on the slowest rank, into $out/mamba_phases.txt.
mam=("$build/drivers/cp_mamba" --set run.device=cuda --set data.dtype=bf16 --set data.format=bshd --set data.batch=1
     --set data.seqlen="$len" --set mamba.hidden=2688 --set mamba.heads=64 --set mamba.head_dim=64
     --set mamba.n_groups=8 --set mamba.d_state=128 --set mamba.chunk=128 --set parallel.mamba_cp=all
     --set run.check=off --set run.repeats=5 --set run.save=timings)
mamba_layer() {  # label np
  local f="$out/${1}_mamba_np$2"
  if mpirun -n "$2" "${mam[@]}" --out "$f.h5" > "$f.txt" 2>&1; then
    grep -E "^  (hidden_parallel|state_passing) |phases" "$f.txt" | sed "s/^/$1 np $2: /" >> "$out/mamba_phases.txt"
  else
    tail -20 "$f.txt"
    echo "FAIL: cp_mamba $1 np $2"
    rc=1
  fi
}
: > "$out/mamba_phases.txt"
runs() {  # label: every configuration once
  local label="$1"
  for mcp in hidden_parallel state_passing; do
    for np in 1 $nps; do step "${label}_$mcp" "$np" --set parallel.mamba_cp="$mcp"; done
  done
  for np in 1 $nps; do mamba_layer "$label" "$np"; done
}
runs timesliced
step staged_hidden_parallel 2 --set parallel.mamba_cp=hidden_parallel --set run.comm=mpi
# The same under NVIDIA MPS (the ranks' kernels share the GPU at once instead of taking turns in
# time slices), when its control daemon is at hand; it is stopped again at the end.
if [ "${HCP_MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY="$out/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    ctest --test-dir "$build" -R "test_cuda_(comm|cp)_np[24]" --output-on-failure > "$out/ctest_mps.log" 2>&1 \
      && echo "MPS: $(grep -E "tests passed" "$out/ctest_mps.log")" || { tail -40 "$out/ctest_mps.log"; echo "FAIL: GPU tests under MPS"; rc=1; }
    runs mps
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS: the control daemon did not start"
  fi
fi
echo "# Nano-width M*E step, L $len, one GPU: run np strategy step_ms ratio_to_np1 (same run's np 1)"
awk '{split($1, a, "_"); m=$1; sub(/^(timesliced|mps|staged)_/, "", m); k=m " " $3} $2==1 {one[$1 " " $3]=$4}
     {rows[NR]=$0; ms[NR]=$4; nm[NR]=$1; st[NR]=$3; mk[NR]=m}
     END {for (i=1;i<=NR;i++) {b=one[nm[i] " " st[i]]; if (!b) b=one["timesliced_" mk[i] " " st[i]];
          printf "%-30s %s %-9s %9.2f %6.2f\n", nm[i], substr(rows[i], length(nm[i])+2, 1), st[i], ms[i], b ? ms[i]/b : 0}}' "$out/steps.txt"
echo "# Mamba2 layer alone, L $len (cp_mamba): fwd_ms bwd_ms per strategy, then its phases"
cat "$out/mamba_phases.txt"
echo "RESULT gpu_shared $([ $rc = 0 ] && echo DONE || echo FAIL) out=$out"
exit $rc
