#!/usr/bin/python3
"""A result checked from its file alone (run.save = inputs): cp_attention's outputs are recomputed
with numpy from /inputs (q, k, v, cu_seqlens) and the deck in /config, and compared with every
strategy's /activations/<strategy>/out; cp_mamba's and cp_hybrid's /inputs are checked for what a
reader needs (inputs of the real tokens, every parameter at its full shape). A file written with
run.save = auto holds no /inputs.

Usage: inputs_check.py ATTENTION.h5 MAMBA.h5 HYBRID.h5 AUTO.h5      prints RESULT inputs_check PASS"""
import sys
import tomllib

import h5py
import numpy as np

att, mamba, hybrid, auto = sys.argv[1:5]
fail = []


def deck(f):
    v = f["config"].attrs["deck_resolved"]
    return tomllib.loads(v.decode() if isinstance(v, bytes) else v)


def attention(q, k, v, cu, causal):
    """Softmax attention per sequence, GQA (query head h reads K/V head h // (H / Hkv))."""
    T, H, D = q.shape
    rep = H // k.shape[1]
    out = np.zeros_like(q)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        for h in range(H):
            sc = q[a:b, h] @ k[a:b, h // rep].T / np.sqrt(D)
            if causal:
                sc = np.where(np.tril(np.ones((b - a, b - a), dtype=bool)), sc, -np.inf)
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[a:b, h] = (sc / sc.sum(axis=1, keepdims=True)) @ v[a:b, h // rep]
    return out


with h5py.File(att, "r") as f:
    d = deck(f)
    q, k, v = (f[f"inputs/{n}"][()] for n in ("q", "k", "v"))
    cu = f["inputs/cu_seqlens"][()]
    want = attention(q, k, v, cu, bool(d["attention"]["causal"]))
    strategies = [s for s in f["activations"] if s != "reference"]
    for s in strategies:
        got = f[f"activations/{s}/out"][()]
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"cp_attention {s}: out from /inputs by numpy, max rel error {err:.2e}")
        if not err <= 1e-10:
            fail.append(f"cp_attention {s} out differs from numpy on /inputs by {err:.2e}")
    if not strategies:
        fail.append("cp_attention: no strategy's /activations")

with h5py.File(mamba, "r") as f:
    d, T = deck(f), f["inputs/x"].shape[0]
    if f["inputs/x"].shape != (int(f["inputs/cu_seqlens"][-1]), d["mamba"]["hidden"]):
        fail.append(f"cp_mamba /inputs/x has shape {f['inputs/x'].shape}")
    if f["inputs/dout"].shape != f["inputs/x"].shape:
        fail.append("cp_mamba /inputs/dout is not the shape of /inputs/x")
    params = sorted(f["inputs/params"])
    strat = next(s for s in f["gradients"] if s != "reference")
    grads = sorted(n for n in f[f"gradients/{strat}"] if n != "input")
    if params != grads or any(f[f"inputs/params/{n}"].shape != f[f"gradients/{strat}/{n}"].shape for n in params):
        fail.append(f"cp_mamba parameters {params} are not those with gradients {grads}, at their shapes")
    print(f"cp_mamba: /inputs x, dout [{T} tokens], {len(params)} parameters")

with h5py.File(hybrid, "r") as f:
    d = deck(f)
    n = int(f["inputs/cu_seqlens"][-1])
    ids, labels = f["inputs/tokens"][()], f["inputs/labels"][()]
    if ids.shape != (n,) or labels.shape != (n,) or ids.min() < 0 or ids.max() >= d["model"]["vocab"]:
        fail.append("cp_hybrid /inputs/tokens or labels: wrong shape or ids outside the vocabulary")
    for name, g in f["gradients/reference"].items():
        if name == "logits":
            continue
        if f"inputs/params/{name}" not in f or f[f"inputs/params/{name}"].shape != g.shape:
            fail.append(f"cp_hybrid /inputs/params/{name} missing or not the shape of its gradient")
    print(f"cp_hybrid: /inputs tokens, labels [{n} tokens], {len(f['inputs/params'])} parameters")

with h5py.File(auto, "r") as f:
    if "inputs" in f:
        fail.append("run.save = auto kept /inputs")

for m in fail:
    print("FAIL:", m)
print(f"RESULT inputs_check {'FAIL' if fail else 'PASS'}")
sys.exit(1 if fail else 0)
