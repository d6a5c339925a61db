#!/usr/bin/python3
"""SIGTERM to one rank the moment the results file is opened: TRIES runs of DRIVER at np 2 with
run.hdf5_io=IO, the signal to the first and the last rank process in turn; nothing named race.h5*
may be left (neither the temporary results file nor what MPI-IO makes beside it while opening).

The ranks are found before the file is opened and their open files (/proc/<pid>/fd) are polled
without a pause, so the signal lands within microseconds of the create: the moment when a rank
still opening the file, or MPI-IO's lock test beside it, could outlive another rank's handler.

Usage: sigterm_race.py WORKDIR DRIVER TRIES IO MPIRUN...
Exits 1 when a try left a file, 2 when a run never opened its file."""
import os
import signal
import subprocess
import sys
import time

work, binary, tries, io = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
mpirun = sys.argv[5:]
work = os.path.realpath(work)
os.makedirs(work, exist_ok=True)


def open_result(pid):
    """Whether `pid` has the results file open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(work + "/race.h5.tmp-"):
            return True
    return False


left = 0
for t in range(tries):
    out = os.path.join(work, "race.h5")
    job = subprocess.Popen(mpirun + ["-n", "2", binary, "--set", "run.repeats=100000", "--set",
                                     f"run.hdf5_io={io}", "--out", out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks, opened = [], False
    t0 = time.time()
    while len(ranks) < 2 and time.time() - t0 < 20:
        r = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True)
        ranks = sorted(int(x) for x in r.stdout.split())
    while ranks and not opened and time.time() - t0 < 60:
        opened = any(open_result(p) for p in ranks)
    if not opened:
        job.kill()
        job.wait()
        print(f"try {t}: no results file was opened within 60 s")
        sys.exit(2)
    os.kill(ranks[t % 2], signal.SIGTERM)
    job.wait()
    stale = [n for n in os.listdir(work) if n.startswith("race.h5")]
    if stale:
        left += 1
        print(f"try {t}: SIGTERM to process {t % 2} left {' '.join(stale)}")
        for n in stale:
            os.remove(os.path.join(work, n))
print(f"SIGTERM the moment the file is opened (run.hdf5_io={io}): {left} of {tries} tries left a file")
sys.exit(1 if left else 0)
