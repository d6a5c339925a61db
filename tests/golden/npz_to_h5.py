#!/usr/bin/env python3
"""Convert the .npz written by make_golden.py (where the GPU machine lacks h5py) into golden.h5."""
import sys
import h5py
import numpy as np

src, dst = sys.argv[1], sys.argv[2]
z = np.load(src)
with h5py.File(dst, "w") as f:
    f.attrs["generator"] = "tests/golden/make_golden.py, " + str(z["__generator__"])
    for k in z.files:
        if k != "__generator__":
            f.create_dataset(k.replace("__", "/"), data=z[k].astype(np.float64))
print(f"wrote {dst}")
