#!/usr/bin/python3
"""Routed experts are split over the EP group: cp_hybrid at np 4 with parallel.ep = 1, 2 and 4 (each
run checked against cp=1: outputs and every gradient) and at np 1. Every rank's routed-expert bytes
(/memory/parameters/expert_bytes) are exactly 1/ep of the np 1 run's, and its parameter bytes fall by
exactly what the experts save; the whole expert gradients in the files agree across EP sizes.
Usage: expert_memory.py BINDIR MPIRUN...   Prints the table and RESULT expert_memory PASS|FAIL."""
import subprocess
import sys
import tempfile

import h5py
import numpy as np

bindir, mpirun = sys.argv[1], sys.argv[2:]
runs = [(1, 0), (4, 1), (4, 2), (4, 4)]
bad, got = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for np_, ep in runs:
        path = f"{tmp}/np{np_}_ep{ep}.h5"
        out = subprocess.run(mpirun + ["-n", str(np_), f"{bindir}/cp_hybrid", "--quiet", "--set", "run.repeats=1",
                                       "--set", "parallel.attention=p2p", "--set", f"parallel.ep={ep}", "--out", path],
                             capture_output=True, text=True)
        if out.returncode != 0 or "RESULT cp_hybrid PASS" not in out.stdout:
            print(out.stdout[-2000:], out.stderr[-2000:])
            bad.append(f"np {np_} ep {ep}: the run failed")
            continue
        with h5py.File(path) as f:
            got[(np_, ep)] = (f["/memory/parameters/expert_bytes"][:], f["/memory/parameters/bytes"][:],
                              {k: f[f"/gradients/p2p/{k}"][:] for k in f["/gradients/p2p"] if k.endswith(("W1", "W2"))})
if (1, 0) in got:
    e1, b1, g1 = got[(1, 0)]
    print(f"# {'np':>3} {'ep':>3} {'expert MiB/rank':>16} {'params MiB/rank':>16} {'ep*expert/expert(np1)':>22}")
    for (np_, ep), (e, b, g) in sorted(got.items()):
        eff = ep or np_
        print(f"  {np_:>3} {eff:>3} {e.max() / 2**20:>16.4f} {b.max() / 2**20:>16.4f} {eff * e.max() / e1[0]:>22.3f}")
        if not (np.all(e * eff == e1[0]) and np.all(b1[0] - b == e1[0] - e)):
            bad.append(f"np {np_} ep {eff}: expert bytes {e.tolist()} are not 1/{eff} of {e1[0]:.0f}")
        for k, v in g1.items():
            err = np.max(np.abs(g[k] - v)) / max(np.max(np.abs(v)), 1e-300)
            if not err <= 1e-10:
                bad.append(f"np {np_} ep {eff}: gradient {k} differs from np 1 by {err:.2e}")
for b in bad:
    print("FAIL:", b)
print("RESULT expert_memory", "FAIL" if bad or len(got) != len(runs) else "PASS")
