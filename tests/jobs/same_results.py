#!/usr/bin/python3
"""Two results files of one deck written two ways (run.hdf5_io collective and gather) hold the same
results: every dataset under /activations and /gradients bit for bit (values, shape, type, chunk
shape), every attribute of /summary and /stats, the per-rank bytes and calls of /comm, the same set
of timing datasets (their values are measurements), and /config hdf5_io names the mode each used.
Usage: same_results.py COLLECTIVE.h5 GATHER.h5; prints RESULT same_results PASS|FAIL."""
import sys

import h5py
import numpy as np


def walk(f):
    out = {}
    f.visititems(lambda n, o: out.__setitem__("/" + n, o))
    return out


def main(a_path, b_path):
    a, b = h5py.File(a_path, "r"), h5py.File(b_path, "r")
    oa, ob = walk(a), walk(b)
    bad = []
    if set(oa) != set(ob):
        bad.append(f"objects differ: {sorted(set(oa) ^ set(ob))[:5]}")
    n_data = n_attr = 0
    for name in sorted(set(oa) & set(ob)):
        x, y = oa[name], ob[name]
        if isinstance(x, h5py.Dataset) and name.startswith(("/activations", "/gradients")):
            n_data += 1
            vx, vy = x[()], y[()]
            if x.dtype != y.dtype or vx.shape != vy.shape or vx.tobytes() != vy.tobytes():
                bad.append(f"{name}: values differ")
            if x.chunks != y.chunks:
                bad.append(f"{name}: chunks {x.chunks} vs {y.chunks}")
        if name.startswith(("/summary", "/stats")):
            for k in set(x.attrs) | set(y.attrs):
                n_attr += 1
                if k not in x.attrs or k not in y.attrs or np.asarray(x.attrs[k]).tobytes() != np.asarray(y.attrs[k]).tobytes():
                    bad.append(f"{name} attribute {k} differs")
        if isinstance(x, h5py.Dataset) and name.startswith("/comm") and not name.endswith("/seconds"):
            if x[()].tobytes() != y[()].tobytes():
                bad.append(f"{name}: differs")
    mode_a, mode_b = str(a["config"].attrs["hdf5_io"]), str(b["config"].attrs["hdf5_io"])
    if not mode_a.startswith("collective") or not mode_b.startswith("gather"):
        bad.append(f"/config hdf5_io: '{mode_a}' and '{mode_b}'")
    if n_data == 0:
        bad.append("no tensors to compare")
    for line in bad[:20]:
        print("  " + line)
    print(f"# {n_data} datasets and {n_attr} summary/stats attributes compared")
    print(f"RESULT same_results {'PASS' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
