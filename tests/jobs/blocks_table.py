#!/usr/bin/python3
"""jobs/post/hcp_blocks.py joins cp_hybrid phases with anchors.py's blocks: a cp = 1 run of M*E-
and a cp = 1 train_hybrid run of it, an anchors file whose every block, the stack and the training
loop take exactly twice our time, so every ratio must read 0.50 and every block kind (the MLP
without an anchor), the step and the training step must appear; a cp = 2 file is refused with
exit 2.
Usage: blocks_table.py BINDIR MPIRUN...   Prints RESULT blocks_table PASS|FAIL."""
import json
import os
import re
import subprocess
import sys
import tempfile

import h5py

here = os.path.dirname(os.path.abspath(__file__))
post = os.path.join(here, "..", "..", "jobs", "post")
sys.path.insert(0, post)
import hcp_post  # noqa: E402

bindir, mpirun = sys.argv[1], sys.argv[2:]
bad = []
with tempfile.TemporaryDirectory() as tmp:
    common = ["--quiet", "--set", "data.format=bshd", "--set", "data.batch=1", "--set", "data.seqlen=64",
              "--set", "model.pattern=M*E-", "--set", "parallel.attention=p2p", "--set", "run.check=off",
              "--set", "run.repeats=3"]
    for n in (1, 2):
        r = subprocess.run(mpirun + ["-n", str(n), f"{bindir}/cp_hybrid"] + common + ["--out", f"{tmp}/np{n}.h5"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-1500:], r.stderr[-1500:])
            bad.append(f"cp_hybrid np {n} failed")
    train = ["--set", "data.format=bshd", "--set", "data.seqs_per_step=1", "--set", "data.max_len=64", "--set",
             "model.pattern=M*E-", "--set", "train.steps=3", "--set", "train.reference=false", "--out", f"{tmp}/train.h5"]
    r = subprocess.run(mpirun + ["-n", "1", f"{bindir}/train_hybrid"] + train, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-1500:], r.stderr[-1500:])
        bad.append("train_hybrid failed")
    if not bad:
        with h5py.File(f"{tmp}/np1.h5", "r") as f:
            ph = hcp_post._timings(f)["p2p"]
        L, anc = 64, {"_device": "test", "_torch": "test"}
        for k, names in (("M", ["mamba"]), ("*", ["attention_cudnn", "attention_flash"]), ("E", ["moe"])):
            for a in names:
                anc[f"block_{a}_l{L}/fwd"] = {"median_ms": 2 * ph[f"fwd/{k}"]}
                anc[f"block_{a}_l{L}/fwdbwd"] = {"median_ms": 2 * (ph[f"fwd/{k}"] + ph[f"bwd/{k}"])}
        anc[f"block_stack_M*E-_l{L}/fwdbwd"] = {"median_ms": 2 * ph["step"], "peak_mib": 1.0, "saved_mib": 7.0}
        with h5py.File(f"{tmp}/np1.h5", "r") as f:  # the phase of the step's high-water, read here
            pk = {}
            f["memory/p2p/phase_peak_bytes"].visititems(
                lambda n, d: pk.__setitem__(n, float(d[0])) if isinstance(d, h5py.Dataset) else None)
            top = max(pk, key=pk.get)
            if abs(pk[top] - float(f["memory/p2p/step_tensor_bytes"][0])) > 0.5:
                bad.append(f"the largest phase high-water {pk[top]} is not the step's {f['memory/p2p/step_tensor_bytes'][0]}")
        with h5py.File(f"{tmp}/train.h5", "r") as f:
            anc[f"train_M*E-_l{L}"] = {"median_ms": 2 * hcp_post._timings(f)["train"]["step"], "peak_mib": 1.0}
        with open(f"{tmp}/a.json", "w") as fh:
            json.dump(anc, fh)
        tool = [sys.executable, os.path.join(post, "hcp_blocks.py"), "--anchors", f"{tmp}/a.json"]
        r = subprocess.run(tool + [f"{tmp}/np1.h5", f"{tmp}/train.h5"], capture_output=True, text=True)
        print(r.stdout, end="")
        rows = [l for l in r.stdout.splitlines() if not l.startswith("#")]
        want = ["Mamba2 block vs mamba", "attention block vs attention_cudnn", "attention block vs attention_flash",
                "MoE block vs moe", "MLP block", "step M*E-", "training step M*E-"]
        for w in want:
            match = [l for l in rows if w in l]
            if not match:
                bad.append(f"no row '{w}'")
            elif w != "MLP block" and not re.search(r" 0\.50 ", match[0]):
                bad.append(f"row '{w}' does not read ratio 0.50: {match[0]}")
            elif w == "step M*E-" and not re.search(rf" {re.escape(top)} +7$", match[0]):
                bad.append(f"row '{w}' does not name the high-water phase {top} and PyTorch's saved 7 MiB: {match[0]}")
        r2 = subprocess.run(tool + [f"{tmp}/np2.h5"], capture_output=True, text=True)
        if r2.returncode != 2 or "cp = 1 BSHD cp_hybrid" not in r2.stderr:
            bad.append(f"a cp = 2 file gave exit {r2.returncode}: {r2.stderr.strip()}")
for b in bad:
    print("FAIL:", b)
print("RESULT blocks_table", "FAIL" if bad else "PASS")
