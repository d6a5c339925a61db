#!/usr/bin/env bash
# SIGTERM to a run that has its results file open: every rank ends, the exit is non-zero and no
# `<out>.tmp-<pid>` is left. Usage: sigterm_leaves_no_tmp.sh WORKDIR DRIVER MPIRUN [ARGS...]
set -uo pipefail
work="$1"; driver="$2"; shift 2
rm -rf "$work"; mkdir -p "$work"
# Enough repeats that the run is still going when the signal comes.
"$@" -n 2 "$driver" --set run.repeats=100000 --set run.check=false --out "$work/run.h5" > "$work/log.txt" 2>&1 &
pid=$!
for _ in $(seq 1 300); do ls "$work"/run.h5.tmp-* > /dev/null 2>&1 && break; sleep 0.1; done
ls "$work"/run.h5.tmp-* > /dev/null 2>&1 || { echo "no .tmp file appeared"; kill -9 $pid; cat "$work/log.txt"; exit 1; }
sleep 0.5
kill -TERM $pid
t0=$(date +%s)
wait $pid; rc=$?
echo "exit $rc after $(( $(date +%s) - t0 )) s"
[ "$rc" -ne 0 ] || { echo "a terminated run exited 0"; exit 1; }
left=$(ls "$work" | grep -c "tmp-" || true)
[ "$left" -eq 0 ] || { echo "left behind: $(ls "$work")"; exit 1; }
[ ! -e "$work/run.h5" ] || { echo "a finished-looking file exists"; exit 1; }
echo "RESULT sigterm PASS"
