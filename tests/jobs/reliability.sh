#!/usr/bin/env bash
# What a run promises on failure, replayed one class at a time; each asserts the exit code, the
# message and the files left behind.
#
#   reliability.sh CLASS WORKDIR BINDIR MPIRUN [MPIRUN ARGS...]
#
# CLASS is one of
#   huge        sizes that cannot fit: refused from the estimate within 5 s of a driver's start,
#               exit 2, no file; their --dry-run answers as fast, and --ranks is bounded
#   nan         a non-finite loss stops training: exit 3, the step named, no results file
#   checkpoint  damaged or mismatched checkpoints refused before any step (exit 2, key or dataset
#               named), also a dataset removed with its checksum and a replica turned on at resume
#   kill9       kill -9 of one rank: every rank gone in < 30 s, no finished-looking results file
#   sigterm     SIGTERM while the results file is being written: non-zero exit, no .tmp-* left
#   race        SIGTERM to one rank the moment the file is opened, 20 tries with the default writer
#               (collective where HDF5 has MPI-IO), 10 with run.hdf5_io=gather: nothing left
#   fulldisk    a full file system (a 64 KiB tmpfs; needs root, else skipped with exit 77): exit 3,
#               "No space left on device" with the file and dataset named, nothing left
#   unwritable  --out or train.checkpoint in a missing, read-only or non-folder place, --deck a
#               folder: exit 2 up front
#   nonfinite   nan, inf and -inf in every float key of every driver (enumerated from --help-deck),
#               by --set and by a deck line: exit 2 naming the key and "finite", before any work
#   deck        --deck /dev/zero, a binary deck, a float beyond a double, --deck without a value,
#               run.save naming nothing the driver writes: exit 2 within 5 s of a driver's start,
#               the input named
#   post        hcp_post.py on damaged and unfinished files (an attribute removed, a pass flipped,
#               /config's cp_size changed, one byte of data flipped: every command checks
#               /checksums): one error line, exit 2
#   plant       a planted fault (run.plant_fault) always fails: a plant in a case that does not run,
#               or in the only case of a cross check, is refused up front (exit 2); the move fails
#               bf16's tolerance too (exit 1, FAIL); a cross check of one case reports UNCHECKED
# BINDIR holds the drivers. Prints "RESULT reliability CLASS PASS" when every assertion holds.
set -uo pipefail
class="$1"; work="$2"; bin="$3"; shift 3
mpirun=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
post="$here/../../jobs/post/hcp_post.py"
rm -rf "$work"; mkdir -p "$work"
fail=0
declare -A by_exit=()  # cases run through expect, by exit status

# expect RC REGEX CMD...: CMD exits with RC, its output matches REGEX, it took SECONDS (printed).
expect() {
  local want="$1" regex="$2"; shift 2
  local t0 t1 out rc
  t0=$(date +%s.%N)
  out=$("$@" 2>&1); rc=$?
  t1=$(date +%s.%N)
  elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "exit $rc in ${elapsed} s: $(grep -m1 -E "error|RESULT" <<<"$out")"
  by_exit[$rc]=$(( ${by_exit[$rc]:-0} + 1 ))
  if [ "$rc" -ne "$want" ]; then echo "FAILED: exit $rc, expected $want"; echo "$out" | tail -5; fail=1; return 1; fi
  if ! grep -Eq -- "$regex" <<<"$out"; then echo "FAILED: output does not match /$regex/"; echo "$out" | tail -5; fail=1; return 1; fi
  if grep -q "Traceback" <<<"$out"; then echo "FAILED: a Python traceback"; fail=1; return 1; fi
  return 0
}
# nothing_left DIR: no results file and no .tmp-* in DIR.
nothing_left() {
  local left
  left=$(ls "$1" | grep -E "\.h5($|\.tmp-)" || true)
  [ -z "$left" ] || { echo "FAILED: left behind in $1: $left"; fail=1; }
}
# under SECONDS: the last expect took less than SECONDS beyond what starting a driver costs on this
# machine (two ranks under the launcher refusing a --deck without a value: no deck, no sizes), so
# the bound measures the refusal, not a slow host's process start.
startup=""
under() {
  if [ -z "$startup" ]; then
    local t0 t1
    t0=$(date +%s.%N)
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --deck > /dev/null 2>&1
    t1=$(date +%s.%N)
    startup=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "starting two ranks that refuse at once takes ${startup} s here"
  fi
  awk -v e="$elapsed" -v s="$startup" -v l="$1" 'BEGIN { exit !(e < s + l) }' \
    || { echo "FAILED: took ${elapsed} s (limit $1 s beyond the ${startup} s start)"; fail=1; }
}

# results_open PID...: one of the processes has the results file open.
results_open() {
  local p
  for p in "$@"; do
    ls -l "/proc/$p/fd" 2> /dev/null | grep -q -- "-> $work/run\.h5\.tmp-" && return 0
  done
  return 1
}
# start_long DRIVER [ARGS...]: a run that writes its reference results, then times for a long while.
start_long() {
  local driver="$1"; shift
  "${mpirun[@]}" -n 2 "$bin/$driver" --set run.repeats=100000 "$@" --out "$work/run.h5" > "$work/log.txt" 2>&1 &
  job=$!
  for _ in $(seq 1 300); do results_open $(pgrep -P $job) && return 0; sleep 0.1; done
  echo "FAILED: no results file was started"; kill -9 $job; cat "$work/log.txt"; exit 1
}

case "$class" in
huge)
  out="$work/never.h5"
  expect 2 "^error: --set data.seqlen=1000000000000: data.seqlen.*: a rank of this run needs about .* GiB" \
    "${mpirun[@]}" -n 2 "$bin/cp_mamba" --set data.format=bshd --set data.seqlen=1000000000000 --out "$out" && under 5
  expect 2 "^error: --set data.seq_lens=1000000000000: data.seqlen.*: a rank of this run needs about .* GiB" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --set data.seq_lens=1000000000000 --out "$out" && under 5
  expect 2 "^error: --set data.seqlen=4294967296: data.seqlen.*: a rank of this run needs about .* GiB" \
    "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set data.format=bshd --set data.seqlen=4294967296 --out "$out" && under 5
  expect 2 "^error: --set data.max_len=1000000000000: data.seqs_per_step, data.max_len.*: a rank of this run needs about" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set data.max_len=1000000000000 --out "$out" && under 5
  expect 2 "^error: --set data.[a-z]*=4000000000*: data.seqlen.*: these sizes give a tensor size that overflows 64 bits" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --set data.format=bshd --set data.batch=4000000000000 \
    --set data.seqlen=4000000000 --out "$out" && under 5
  # A dry run is arithmetic: the same refusals as fast, nothing laid out for sizes that cannot fit.
  expect 2 "^error: --set data.[a-z]*=4000000000*: data.seqlen.*: these sizes give a tensor size that overflows 64 bits" \
    "$bin/cp_attention" --dry-run --set data.format=bshd --set data.batch=4000000000000 --set data.seqlen=4000000000 \
    && under 5
  expect 0 '"fits":false' "$bin/cp_hybrid" --dry-run --set data.format=bshd --set data.seqlen=4294967296 && under 5
  expect 2 "^error: command line: --ranks: Value 16777216 not in range 1 to 65536" \
    "$bin/cp_attention" --dry-run --ranks 16777216 && under 5
  # run.memory_check = "warn" runs a refused size; the allocation that fails (address space capped
  # at 6 GB) names the tensor, and the error opens with the --set that gave the sizes: exit 3.
  expect 3 "\] error: --set data.seq_lens=10000000: data.seqlen.*: host allocation of [0-9]+ bytes failed \(a fp64 tensor of shape \[10000000,8,32\]\) \(run.memory_check = \"warn\" ran sizes" \
    bash -c 'ulimit -v 6000000 && exec "$@"' sh "$bin/cp_attention" --set run.memory_check=warn \
    --set data.seq_lens=10000000 --out "$out"
  nothing_left "$work" ;;
nan)
  expect 3 "\[rank 0\] error: .*step 2: the loss is nan \(not finite\)" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set train.lr=1e12 --set train.min_lr=1e12 --set train.clip=0 \
    --set train.warmup=0 --set train.steps=6 --out "$work/never.h5"
  nothing_left "$work" ;;
checkpoint)
  common=(--set train.steps=4 --set data.dtype=fp32 --set train.warmup=1)
  "${mpirun[@]}" -n 2 "$bin/train_hybrid" "${common[@]}" --set train.stop_after=2 --set "train.checkpoint=$work/ck.h5" \
    --out "$work/part.h5" > "$work/part.log" 2>&1 || { echo "FAILED: the checkpointing run"; cat "$work/part.log"; exit 1; }
  cp "$work/ck.h5" "$work/damaged.h5"
  $py - "$work/damaged.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    g = f["/checkpoint/adam_m"]
    d = g[sorted(g.keys())[0]]
    v = d[...]; v.flat[0] = v.flat[0] * 1.5 + 1e-3; d[...] = v
PY
  resume() { "${mpirun[@]}" -n 2 "$bin/train_hybrid" "${common[@]}" "$@" --out "$work/never.h5"; }
  expect 2 "^error: .*damaged.h5' is damaged: dataset /checkpoint/adam_m/.* fails its checksum" \
    resume --set "train.resume=$work/damaged.h5"
  expect 2 "^error: --set data.seed=7: train.resume: key 'data.seed' = 7 but checkpoint .* was written with 1" \
    resume --set data.seed=7 --set "train.resume=$work/ck.h5"
  expect 2 "^error: .*key 'data.dtype' = \"fp64\" but checkpoint .* was written with \"fp32\"" \
    resume --set data.dtype=fp64 --set "train.resume=$work/ck.h5"
  expect 2 "^error: --set train.steps=2: train.resume: checkpoint .* is at step 2, not before train.steps = 2" \
    resume --set train.steps=2 --set "train.resume=$work/ck.h5"
  # Tampering that keeps the checksums consistent: a dataset removed together with its line.
  cp "$work/ck.h5" "$work/tampered.h5"
  $py - "$work/tampered.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    g = f["/checkpoint/adam_v"]
    name = sorted(g.keys())[0]
    del g[name]
    a = f["/checkpoint"].attrs["checksums"]
    text = a.decode() if isinstance(a, bytes) else a
    f["/checkpoint"].attrs["checksums"] = "\n".join(l for l in text.splitlines() if not l.startswith("/checkpoint/adam_v/" + name + " "))
PY
  expect 2 "^error: .*tampered.h5' is damaged: dataset /checkpoint/adam_v/.* that the resume reads is missing" \
    resume --set "train.resume=$work/tampered.h5"
  # A checkpoint written without the replica, resumed with it.
  "${mpirun[@]}" -n 2 "$bin/train_hybrid" "${common[@]}" --set train.reference=false --set train.stop_after=2 \
    --set "train.checkpoint=$work/noref.h5" --out "$work/noref_run.h5" > "$work/noref.log" 2>&1 \
    || { echo "FAILED: the run without the replica"; cat "$work/noref.log"; exit 1; }
  expect 2 "^error: .*train.resume: train.reference = true, but checkpoint .*noref.h5' holds no /checkpoint/loss_reference" \
    resume --set "train.resume=$work/noref.h5"
  [ ! -e "$work/never.h5" ] || { echo "FAILED: a refused resume wrote a results file"; fail=1; }
  # Allowed: more steps, another rank count.
  expect 0 "RESULT train_hybrid PASS" "${mpirun[@]}" -n 1 "$bin/train_hybrid" "${common[@]}" --set train.steps=5 \
    --set "train.resume=$work/ck.h5" --out "$work/resumed.h5" ;;
kill9)
  start_long cp_attention
  ranks=$(pgrep -P $job)
  victim=$(echo "$ranks" | tail -1)
  [ -n "$victim" ] || { echo "FAILED: no rank processes under mpirun"; kill -9 $job; exit 1; }
  t0=$(date +%s.%N)
  kill -9 "$victim"
  for _ in $(seq 1 300); do
    alive=0; for r in $ranks $job; do kill -0 "$r" 2> /dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break; sleep 0.1
  done
  wait $job; rc=$?
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "kill -9 of one rank: mpirun exit $rc, every rank gone after ${elapsed} s"
  [ "$alive" -eq 0 ] || { echo "FAILED: ranks still alive after 30 s"; kill -9 $ranks 2> /dev/null; fail=1; }
  [ "$rc" -ne 0 ] || { echo "FAILED: mpirun exited 0"; fail=1; }
  [ ! -e "$work/run.h5" ] || { echo "FAILED: a finished-looking results file exists"; fail=1; }
  # An unfinished .tmp-* may remain after a SIGKILL of rank 0; the post-processor refuses it.
  for t in "$work"/run.h5.tmp-*; do
    [ -e "$t" ] && expect 2 "is an unfinished results file" $py "$post" summary "$t"
  done ;;
sigterm)
  start_long cp_attention
  sleep 0.5
  kill -TERM $job
  wait $job; rc=$?
  echo "SIGTERM: mpirun exit $rc"
  [ "$rc" -ne 0 ] || { echo "FAILED: a terminated run exited 0"; fail=1; }
  nothing_left "$work" ;;
race)
  # tests/jobs/sigterm_race.py says how the moment is caught.
  "$here/sigterm_race.py" "$work/auto" "$bin/cp_attention" 20 auto "${mpirun[@]}" || fail=1
  "$here/sigterm_race.py" "$work/gather" "$bin/cp_attention" 10 gather "${mpirun[@]}" || fail=1 ;;
fulldisk)
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: mounting a small tmpfs needs root"; exit 77; }
  mkdir -p "$work/full"
  mount -t tmpfs -o size=64k tmpfs "$work/full" 2> "$work/mount.log" || { echo "SKIP: cannot mount a tmpfs: $(cat "$work/mount.log")"; exit 77; }
  trap 'umount "$work/full"' EXIT
  expect 3 "error: cannot write dataset /.* to results file '$work/full/run.h5': No space left on device" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --out "$work/full/run.h5"
  nothing_left "$work/full" ;;
unwritable)
  expect 2 "^error: --out /nonexistent/x.h5: folder '/nonexistent' does not exist" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --out /nonexistent/x.h5 && under 5
  expect 2 "^error: --out $work: is a directory" "${mpirun[@]}" -n 2 "$bin/train_hybrid" --out "$work" && under 5
  expect 2 "^error: --deck $work: deck file '$work' is a directory" "${mpirun[@]}" -n 2 "$bin/cp_mamba" --deck "$work"
  expect 2 "^error: .*train.checkpoint = \"/nonexistent/ck.h5\": folder '/nonexistent' does not exist" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set train.checkpoint_every=1 --set train.checkpoint=/nonexistent/ck.h5 \
    --out "$work/never.h5" && under 5
  expect 2 "^error: .*train.checkpoint = \"$work\": is a directory" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set train.stop_after=1 --set "train.checkpoint=$work" --out "$work/never.h5"
  mkdir -p "$work/ro"
  if [ "$(id -u)" -eq 0 ]; then  # root writes through file modes: a read-only mount instead
    mount -t tmpfs -o ro,size=64k tmpfs "$work/ro" 2> /dev/null && trap 'umount "$work/ro"' EXIT || rmdir "$work/ro"
  else
    chmod 555 "$work/ro"
  fi
  if [ -d "$work/ro" ]; then
    expect 2 "^error: --out $work/ro/x.h5: folder '$work/ro' is not writable" \
      "${mpirun[@]}" -n 2 "$bin/cp_attention" --out "$work/ro/x.h5" && under 5
    expect 2 "^error: .*train.checkpoint = \"$work/ro/ck.h5\": folder '$work/ro' is not writable" \
      "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set train.checkpoint_every=2 --set "train.checkpoint=$work/ro/ck.h5" \
      --out "$work/never.h5" && under 5
  else
    echo "read-only folder: not checked (no read-only mount as root here)"
  fi ;;
nonfinite)
  # Every float key of every driver, from its --help-deck; each value by --set, one per driver by
  # a deck line. Single-process runs: the refusal comes from the deck, before MPI work.
  cases=0
  for drv in cp_attention cp_mamba cp_hybrid train_hybrid; do
    keys=$("$bin/$drv" --help-deck 2>/dev/null | sed -n 's/^  \([a-z_.0-9]*\) (a number,.*/\1/p')
    [ -n "$keys" ] || { echo "FAILED: $drv --help-deck lists no float key"; fail=1; continue; }
    for k in $keys; do
      for v in nan inf -inf; do
        cases=$((cases + 1))
        expect 2 "^error: --set $k=$v: key '$k' = -?(nan|inf).* must be a finite number" \
          "$bin/$drv" --set "$k=$v" --out "$work/never.h5" > "$work/case.log" || cat "$work/case.log"
      done
    done
    k=$(head -1 <<<"$keys")
    printf '[%s]\n%s = nan\n' "${k%%.*}" "${k#*.}" > "$work/$drv.toml"
    cases=$((cases + 1))
    expect 2 "^error: $work/$drv.toml:2: key '$k' = nan must be a finite number" \
      "$bin/$drv" --deck "$work/$drv.toml" --out "$work/never.h5"
  done
  echo "non-finite float settings refused: $cases cases"
  nothing_left "$work" ;;
deck)
  # Messages open with the input that gave the value, never a source location.
  expect 2 "^error: --set model.pattern=MXZ: key 'model.pattern' = \"MXZ\": 'X' is not a block" \
    "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set model.pattern=MXZ --out "$work/never.h5" && under 5
  expect 2 "^error: --set model.pattern=: key 'model.pattern' must name at least one block" \
    "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set model.pattern= --out "$work/never.h5" && under 5
  for r in /nonexistent/ck.h5 "$work"; do
    expect 2 "^error: --set train.resume=$r: train.resume: cannot read checkpoint file '$r'" \
      "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set "train.resume=$r" --out "$work/never.h5" && under 5
  done
  expect 2 "^error: --set parallel.attention=a2a\+p2p: a2a\+p2p attention needs parallel.cp_inner \(3\) to divide" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set parallel.attention=a2a+p2p --set parallel.cp_inner=3 \
    --out "$work/never.h5" && under 5
  printf '[run]\nrepeats = 1\n' > "$work/not_a_checkpoint.toml"
  expect 2 "^error: --set train.resume=.*not_a_checkpoint.toml: train.resume: .* is not a train_hybrid checkpoint" \
    "${mpirun[@]}" -n 2 "$bin/train_hybrid" --set "train.resume=$work/not_a_checkpoint.toml" --out "$work/never.h5"
  expect 2 "^error: --deck /dev/zero: deck file '/dev/zero' is larger than 1 MiB" \
    "${mpirun[@]}" -n 2 "$bin/cp_mamba" --deck /dev/zero --out "$work/never.h5" && under 5
  printf '[run]\nrepeats = 1\0\0\n' > "$work/binary.toml"
  expect 2 "^error: --deck $work/binary.toml: .* holds NUL bytes" \
    "${mpirun[@]}" -n 2 "$bin/cp_mamba" --deck "$work/binary.toml" --out "$work/never.h5" && under 5
  expect 2 "^error: --set attention.rope_theta=1e999: key 'attention.rope_theta' = 1e999 is outside the range of a double" \
    "$bin/cp_hybrid" --set attention.rope_theta=1e999 --out "$work/never.h5"
  # run.save: a name that names nothing the driver writes (a typo of a class, an unknown tensor) is
  # refused up front; one that names a tensor keeps just it (and the run does not trip on the
  # summary it left out).
  expect 2 "^error: --set run.save=timing: key 'run.save': item 'timing' names no tensor this run writes" \
    "${mpirun[@]}" -n 2 "$bin/cp_mamba" --set run.save=timing --out "$work/never.h5" && under 5
  expect 2 "^error: --set run.save=summary,no_such_tensor: key 'run.save': item 'no_such_tensor' names no tensor" \
    "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set run.save=summary,no_such_tensor --out "$work/never.h5" && under 5
  expect 0 "RESULT cp_hybrid PASS" "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set run.save=L00.A_log --set run.repeats=1 \
    --out "$work/one.h5"
  $py -c 'import h5py, sys; f = h5py.File(sys.argv[1]); n = []; f.visititems(lambda k, o: n.append(k) if isinstance(o, h5py.Dataset) and k.split("/")[0] in ("activations", "gradients") else None); print("kept:", n); sys.exit(0 if n and all(k.endswith("/L00.A_log") for k in n) else 1)' \
    "$work/one.h5" || { echo "FAILED: run.save=L00.A_log kept other tensors"; fail=1; }
  rm -f "$work/one.h5"
  expect 2 "^error: command line: --deck needs a value \(got '--set'\)" "$bin/cp_hybrid" --deck --set run.repeats=1
  expect 2 "^error: command line: --deck needs a value \(it is the last word\)" "$bin/cp_hybrid" --deck
  nothing_left "$work" ;;
post)
  "${mpirun[@]}" -n 2 "$bin/cp_attention" --set run.repeats=1 --out "$work/good.h5" > "$work/good.log" 2>&1 \
    || { echo "FAILED: the run that makes a results file"; cat "$work/good.log"; exit 1; }
  cp "$work/good.h5" "$work/damaged.h5"
  $py - "$work/damaged.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    names = []
    f["summary"].visititems(lambda n, o: names.append(n) if "max_rel" in o.attrs else None)
    del f["summary"][names[0]].attrs["max_rel"]
PY
  expect 2 "^error: '.*damaged.h5' is damaged: /summary/.*@max_rel listed in /checksums is missing" \
    $py "$post" summary "$work/damaged.h5"
  # A pass attribute turned to a fail, and one flipped byte in a dataset's data: damaged, for every
  # command that reads results files (not a failed run, not a silent wrong figure).
  cp "$work/good.h5" "$work/flipped_pass.h5"
  cp "$work/good.h5" "$work/flipped_byte.h5"
  $py - "$work/flipped_pass.h5" "$work/flipped_byte.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    names = []
    f["summary"].visititems(lambda n, o: names.append(n) if "pass" in o.attrs else None)
    f["summary"][names[0]].attrs["pass"] = 0.0
with h5py.File(sys.argv[2], "r") as f:
    names = []
    f["timings"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    offset = f["timings"][names[0]].id.get_offset()
with open(sys.argv[2], "r+b") as raw:
    raw.seek(offset + 6)
    b = raw.read(1)
    raw.seek(offset + 6)
    raw.write(bytes([b[0] ^ 0x10]))
PY
  # /config's numbers are covered too: cp_size set to 0 is a damaged file, not cp = 0 (nor a
  # division by zero).
  cp "$work/good.h5" "$work/cp0.h5"
  $py -c "import sys, h5py; f = h5py.File(sys.argv[1], 'r+'); f['config'].attrs['cp_size'] = 0.0; f.close()" \
    "$work/cp0.h5"
  for cmd in summary table scale "plot-scaling --out $work/s.png" "plot-errors --out $work/e.png"; do
    # shellcheck disable=SC2086
    expect 2 "^error: '.*cp0.h5' is damaged: attribute /config@cp_size fails its checksum" \
      $py "$post" $cmd "$work/cp0.h5"
    # shellcheck disable=SC2086
    expect 2 "^error: '.*flipped_pass.h5' is damaged: attribute /summary/.*@pass fails its checksum" \
      $py "$post" $cmd "$work/flipped_pass.h5"
    # shellcheck disable=SC2086
    expect 2 "^error: '.*flipped_byte.h5' is damaged: dataset /timings/.* fails its checksum" \
      $py "$post" $cmd "$work/flipped_byte.h5"
  done
  expect 2 "^error: '.*flipped_byte.h5' is damaged" $py "$post" compare "$work/good.h5" "$work/flipped_byte.h5"
  mkdir -p "$work/study" && cp "$work/flipped_byte.h5" "$work/study/"
  expect 2 "^error: '.*flipped_byte.h5' is damaged" $py "$post" study "$work/study"
  expect 0 "RESULT summary PASS" $py "$post" summary "$work/good.h5"
  # A reader that goes away (| head) is not a damaged file: exit 0, nothing on stderr.
  many=(); for _ in $(seq 1 200); do many+=("$work/good.h5"); done
  $py "$post" summary "${many[@]}" 2> "$work/pipe.err" | head -1 > /dev/null
  rc=${PIPESTATUS[0]}
  echo "summary | head -1: exit $rc, stderr: $(head -c 200 "$work/pipe.err")"
  [ "$rc" -eq 0 ] && [ ! -s "$work/pipe.err" ] || { echo "FAILED: a closed pipe was reported"; fail=1; }
  expect 2 "^error: .*has no /train/loss" $py "$post" loss --out "$work/l.png" "$work/good.h5"
  cp "$work/good.h5" "$work/run.h5.tmp-1234"
  expect 2 "^error: .*is an unfinished results file" $py "$post" summary "$work/run.h5.tmp-1234"
  head -c 3000 "$work/good.h5" > "$work/truncated.h5"
  expect 2 "^error: " $py "$post" summary "$work/truncated.h5" ;;
plant)
  out="$work/never.h5"
  expect 2 "^error: --set run.plant_fault=a2a: .*names a case that does not run here \(parallel.attention runs p2p\)" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --set parallel.attention=p2p --set run.plant_fault=a2a --out "$out"
  for spec in "cp_attention parallel.attention=p2p p2p" "cp_mamba parallel.mamba_cp=state_passing state_passing" \
              "cp_hybrid parallel.attention=allgather allgather"; do
    read -r drv sel case <<<"$spec"
    expect 2 "^error: --set run.plant_fault=$case: .*run.check = \"cross\" needs two cases or more" \
      "${mpirun[@]}" -n 2 "$bin/$drv" --set run.check=cross --set "$sel" --set "run.plant_fault=$case" --out "$out"
    # Without a plant the same run compares nothing: UNCHECKED, as hcp_post.py summary says (exit 3 there).
    expect 0 "RESULT $drv UNCHECKED" \
      "${mpirun[@]}" -n 2 "$bin/$drv" --set run.check=cross --set "$sel" --set run.repeats=1 --out "$work/one_$drv.h5"
    expect 3 "RESULT summary NOTHING-TO-CHECK" $py "$post" summary "$work/one_$drv.h5"
  done
  [ ! -e "$out" ] || { echo "FAILED: a refused run left $out"; fail=1; }
  # bf16: the planted move exceeds bf16's tolerance (2e-2) in both error metrics.
  expect 1 "RESULT cp_attention FAIL" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --set run.check=cross --set run.plant_fault=a2a --set data.dtype=bf16 \
    --set run.repeats=1 --out "$work/bf16_attention.h5"
  expect 1 "RESULT cp_hybrid FAIL" \
    "${mpirun[@]}" -n 2 "$bin/cp_hybrid" --set run.check=cross --set run.plant_fault=allgather --set data.dtype=bf16 \
    --set run.repeats=1 --out "$work/bf16_hybrid.h5"
  expect 1 "RESULT cp_attention FAIL" \
    "${mpirun[@]}" -n 2 "$bin/cp_attention" --set run.plant_fault=a2a --set data.dtype=bf16 --set run.repeats=1 \
    --out "$work/bf16_reference.h5" ;;
*) echo "unknown class '$class'"; exit 2 ;;
esac
counts=""; for k in $(printf '%s\n' "${!by_exit[@]}" | sort -n); do counts+=" exit $k: ${by_exit[$k]}"; done
[ -z "$counts" ] || echo "cases by exit status:$counts"
[ "$fail" -eq 0 ] && echo "RESULT reliability $class PASS"
exit "$fail"
