#!/usr/bin/python3
"""parallel.attention as a list, one strategy per attention layer: cp_hybrid on a pattern with three
attention layers at np 4 (cp_inner 2), the list p2p, a2a+p2p, allgather against the unpadded cp=1
problem (the driver's check), /config/attention_layers naming each layer's strategy, and each
layer really running its own strategy: per op and rank, the list's bytes are a third of the sum of
the three uniform runs' (each uniform run has three layers of its strategy; the other blocks send
the same in every run). train_hybrid with a list trains in lock step with its cp=1 replica.
Usage: per_layer_attention.py BINDIR MPIRUN...   Prints each check and RESULT per_layer_attention PASS|FAIL."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from checklist import check, finish

bindir, mpirun = sys.argv[1], sys.argv[2:]
tmp = tempfile.mkdtemp()
LIST = ["p2p", "a2a+p2p", "allgather"]
MODEL = ["--set", "model.pattern=M*E*-*", "--set", "parallel.cp_inner=2", "--set", "run.repeats=1"]


def run(driver, np_, args, name):
    out = os.path.join(tmp, name + ".h5")
    r = subprocess.run(mpirun + ["-n", str(np_), f"{bindir}/{driver}", "--quiet", "--out", out] + args,
                       capture_output=True, text=True)
    ok = r.returncode == 0 and f"RESULT {driver} PASS" in r.stdout
    check(ok, f"{driver} {name}: exit {r.returncode}, PASS against cp=1" + ("" if ok else f": {r.stdout[-600:]}{r.stderr[-600:]}"))
    return out if ok else None


def comm(path):
    with h5py.File(path, "r") as f:
        return {s: {op: g["bytes_sent"][()] for op, g in f["comm"][s].items()} for s in f["comm"]}, \
            dict(f["config"].attrs)


listed = run("cp_hybrid", 4, MODEL + ["--set", "parallel.attention=[" + ",".join(LIST) + "]"], "list")
uniform = run("cp_hybrid", 4, MODEL + ["--set", "parallel.attention=all"], "uniform")
if listed and uniform:
    (lc, cfg), (uc, _) = comm(listed), comm(uniform)
    name = ",".join(LIST)
    check(cfg.get("attention_layers") == name, f"/config/attention_layers = {cfg.get('attention_layers')!r}")
    check(list(lc) == [name], f"one case, named by the list: {list(lc)}")
    ops = set(lc.get(name, {})) | set().union(*(uc[s].keys() for s in LIST if s in uc))
    for op in sorted(ops):
        got = lc.get(name, {}).get(op, np.zeros(4, dtype=np.int64))
        parts = [uc[s].get(op, np.zeros(4, dtype=np.int64)) for s in LIST]
        check(np.array_equal(3 * got, sum(parts)), f"{op}: 3 x list bytes {list(3 * got)} = sum of the uniform runs' "
              f"{list(sum(parts))}")
    check("ring_post" in lc.get(name, {}) and "all_gather" in lc.get(name, {}),
          "the list's step has the ring's sends and the all-gather's")

train = run("train_hybrid", 2, ["--set", "model.pattern=M*E*", "--set", "train.steps=4", "--set",
                                "parallel.attention=[a2a,p2p]"], "train")
if train:
    with h5py.File(train, "r") as f:
        check(f["config"].attrs.get("attention_layers") == "a2a,p2p",
              f"train_hybrid /config/attention_layers = {f['config'].attrs.get('attention_layers')!r}")

finish("per_layer_attention")
