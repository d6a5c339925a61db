#!/usr/bin/python3
"""/comm holds one timed step's traffic: for cp_attention (every strategy) and cp_mamba (both) at
np 2, a run with run.repeats = 1 and one with run.repeats = 3 write the same integer bytes_sent and
calls per op and rank; the timing bookkeeping (the barrier before each step, the reductions of the
timings) is not among the ops; every step moved the same bytes (steps_equal); and cp_attention's
bytes per step equal the strategy's byte model that the driver prints.
Usage: comm_per_step.py BINDIR MPIRUN...   Prints each check and RESULT comm_per_step PASS|FAIL."""
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from checklist import check, finish

bindir, mpirun = sys.argv[1], sys.argv[2:]
tmp = tempfile.mkdtemp()


def comm_of(driver, args, repeats):
    out = os.path.join(tmp, f"{driver}_{repeats}.h5")
    cmd = mpirun + ["-n", "2", f"{bindir}/{driver}", "--quiet", "--out", out, "--set", f"run.repeats={repeats}",
                    "--set", "run.warmup=1", "--set", "run.check=off"] + args
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"{driver} repeats={repeats}: exit {r.returncode}: {r.stderr[-400:]}")
        return {}, r.stdout
    got = {}
    with h5py.File(out, "r") as f:
        for strat in f["comm"]:
            for op, g in f["comm"][strat].items():
                got[(strat, op)] = (g["bytes_sent"][()], g["calls"][()], g.attrs["steps"], g.attrs["steps_equal"])
    return got, r.stdout


for driver, args in [("cp_attention", ["--set", "data.format=bshd", "--set", "data.batch=1", "--set", "data.seqlen=256"]),
                     ("cp_mamba", ["--set", "data.format=bshd", "--set", "data.batch=1", "--set", "data.seqlen=256",
                                   "--set", "parallel.mamba_cp=all"])]:
    one, _ = comm_of(driver, args, 1)
    three, text = comm_of(driver, args, 3)
    if not one or not three:
        continue
    check(set(one) == set(three), f"{driver}: the same ops at repeats 1 and 3: {sorted(one)}")
    check(not any(op == "barrier" for _, op in one), f"{driver}: no barrier among the step's ops")
    for key in sorted(set(one) & set(three)):
        b1, c1, s1, e1 = one[key]
        b3, c3, s3, e3 = three[key]
        check(b1.dtype.kind == "i" and c1.dtype.kind == "i", f"{driver} {key}: integer bytes_sent and calls")
        check(np.array_equal(b1, b3) and np.array_equal(c1, c3),
              f"{driver} {key}: per step at repeats 1 and 3: bytes {list(b1)} / {list(b3)}, calls {list(c1)} / {list(c3)}")
        check(s1 == 1 and s3 == 3 and e1 == 1 and e3 == 1, f"{driver} {key}: steps attribute 1 / 3, steps_equal")
    if driver == "cp_attention":
        with h5py.File(os.path.join(tmp, "cp_attention_3.h5"), "r") as f:
            for strat in f["comm"]:
                per_rank = sum(g["bytes_sent"][()] for g in f["comm"][strat].values())
                m = re.search(rf"^\s+{re.escape(strat)}\s.*$", text, re.M)
                cols = m.group(0).split() if m else []
                # the table's bytes/rank and model_bytes columns (max over ranks)
                check(len(cols) > 7 and int(cols[6]) == int(per_rank.max()) == int(cols[7]),
                      f"cp_attention {strat}: /comm per step {int(per_rank.max())} = the printed bytes/rank and model")

finish("comm_per_step")
