#!/usr/bin/env bash
# Submits small strong- and weak-scaling studies to a real (local, single-node) Slurm with
# `sbatch --wait` and checks the HDF5 files, the table, the summary and the plots they produced.
# Starts the daemons when none answers. Usage: slurm_study.sh <repo> <build dir>
set -euo pipefail
root="$1"; build="$2"
if [ "$(id -u)" -ne 0 ] && ! sinfo -h >/dev/null 2>&1; then echo "SKIP: no Slurm and not root"; exit 77; fi
# Daemons that cannot start here (no packages, a sandbox without the needed system calls) are an
# environment problem, reported as a skip with the reason; a job or a check that fails is a failure.
if ! start_log=$("$root/jobs/slurm/start_local_slurm.sh" 2>&1); then
  echo "SKIP: could not start a local Slurm: $start_log" | tail -3
  exit 77
fi
out="$build/slurm_study"
rm -rf "$out"; mkdir -p "$out"
export HCP_ROOT="$root" HCP_BUILD_DIR="$build" HCP_SRUN_ARGS="--overcommit"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
# Submitted from a folder of its own with the header's --output: the log must end up in the study's
# results folder, not where sbatch ran.
run_study() {  # name, then variables
  local name="$1"; shift
  mkdir -p "$out/submit_$name"
  (cd "$out/submit_$name" && env "$@" HCP_OUTDIR="$out/$name" sbatch --wait -n 4 -O -t 10 --export=ALL \
    "$root/jobs/slurm/cp_scaling.sbatch" > "$out/$name.id") || true
  local id log
  id=$(grep -o "[0-9]*$" "$out/$name.id")
  log="$out/$name/hcp-scaling-$id.out"
  [ -f "$log" ] && [ -z "$(ls "$out/submit_$name")" ] \
    || { ls "$out/submit_$name" "$out/$name"; cat "$out/submit_$name"/* 2> /dev/null; echo "FAIL: job $name: no log in $out/$name"; exit 1; }
  cp "$log" "$out/$name.out"
  grep -q "RESULT cp_scaling DONE" "$out/$name.out" || { cat "$out/$name.out"; echo "FAIL: job $name"; exit 1; }
}
# Both jobs at once (sbatch --wait polls with a growing interval; two in sequence would wait twice).
run_study strong HCP_DRIVER=cp_hybrid HCP_MODE=strong HCP_CP_SIZES="1 2 4" HCP_TOKENS=64 HCP_STRATEGIES="p2p a2a" \
  HCP_EXTRA="--set run.repeats=1 --set run.warmup=0" &
p1=$!
run_study weak HCP_DRIVER=cp_mamba HCP_MODE=weak HCP_CP_SIZES="1 2 4" HCP_TOKENS=32 \
  HCP_EXTRA="--set run.repeats=1 --set run.warmup=0" &
p2=$!
# More ranks than the allocation's CPUs without --overcommit: refused (exit 2) before any run, where
# srun would wait for CPUs forever.
env HCP_DRIVER=cp_mamba HCP_CP_SIZES="1 4" HCP_SRUN_ARGS="" HCP_OUTDIR="$out/refused" sbatch --wait -n 4 -O -t 10 \
  --export=ALL --output="$out/refused.out" "$root/jobs/slurm/cp_scaling.sbatch" >/dev/null 2>&1 &
p3=$!
wait $p1 || exit 1
wait $p2 || exit 1
rc=0; wait $p3 || rc=$?
cpus=$(grep -o "the allocation has [0-9]*" "$out/refused.out" | grep -o "[0-9]*$" || true)
if [ -n "$cpus" ] && [ "$cpus" -lt 4 ]; then
  [ "$rc" -eq 2 ] && grep -q "^error: HCP_CP_SIZES: cp=4 needs 4 CPUs" "$out/refused.out" && [ ! -d "$out/refused" ] ||
    { cat "$out/refused.out"; echo "FAIL: cp=4 on $cpus CPUs without --overcommit was not refused with exit 2 (exit $rc)"; exit 1; }
  echo "cp=4 on an allocation of $cpus CPUs without --overcommit: refused, exit 2"
else
  echo "note: the allocation had 4 CPUs or more; the refusal was not exercised"
fi
# cp=1 runs once per study (every strategy's cp=1 point): 1 + 2 strategies x (cp 2, 4).
n_strong=$(ls "$out"/strong/*.h5 | wc -l); n_weak=$(ls "$out"/weak/*.h5 | wc -l)
[ "$n_strong" -eq 5 ] && [ "$n_weak" -eq 5 ] || { echo "FAIL: expected 5 + 5 files, got $n_strong + $n_weak"; exit 1; }
for f in "$out"/strong/*.h5 "$out"/weak/*.h5; do h5dump -a /config/driver "$f" >/dev/null || { echo "FAIL: unreadable $f"; exit 1; }; done
for d in strong weak; do  # hcp_post.py study made these from the directory
  for png in scaling memory bytes errors $([ "$d" = strong ] && echo breakdown); do
    [ "$(head -c 4 "$out/$d/$png.png" | od -An -c | tr -d ' ')" = "211PNG" ] || { echo "FAIL: $d/$png.png is not a PNG"; exit 1; }
  done
  grep -q "^file,cp,strategy,step_ms" "$out/$d/timings.csv" || { echo "FAIL: $d/timings.csv"; exit 1; }
  grep -q "RESULT summary PASS" "$out/$d/study.txt" || { echo "FAIL: summary of $d"; exit 1; }
done
# Weak scaling: the cp=4 run had 4x the tokens of cp=1 (a BSHD row of 128); a study keeps its
# measurements, not its tensors.
/usr/bin/python3 - "$out/weak/cp_mamba_weak_cp4_state_passing.h5" <<'PY'
import sys, h5py, tomllib
f = h5py.File(sys.argv[1], "r")
text = f["config"].attrs["deck_resolved"]
deck = tomllib.loads(text.decode() if isinstance(text, bytes) else text)
assert deck["data"]["seqlen"] == 128, deck["data"]
assert "activations" not in f and "gradients" not in f and "timings" in f and "summary" in f, list(f)
PY
echo "RESULT slurm_study PASS ($n_strong + $n_weak files)"
