#!/usr/bin/python3
"""Blocks and steps of the hybrid model against the same blocks in PyTorch: cp_hybrid results
files (cp = 1, BSHD, phases per block kind) beside jobs/bench/anchors.py --only blocks (the same
blocks as a PyTorch user writes them, timed on the same GPU); train_hybrid files (cp = 1, BSHD)
beside its --only train loop of the same pattern.

  hcp_blocks.py --anchors A.json F.h5 [F.h5 ...]

Per file and strategy: each block kind of the pattern (ours: the median of its fwd/<kind> and
bwd/<kind> phases over repeats, divided by the blocks of that kind), and the whole step against the
PyTorch stack of the same pattern when anchors.py timed it (block_stack_<pattern>_l<L>); ratio = ours
/ PyTorch, forward + backward (below 1: faster). Memory: our tensors allocated in the step (max over
ranks; the phase holding its high-water) beside PyTorch's max_memory_allocated above what was
allocated before its step (both count the gradients the step makes) and what one PyTorch forward
leaves allocated for its backward. A training
run gives one row: the median of its step times (every step) against anchors.py's training loop
(train_<pattern>_l<L>, L = rows per step x max_len).
Exit 2 on a file that is not a cp = 1 BSHD cp_hybrid or train_hybrid run.
"""
import argparse
import json
import os
import sys
import tomllib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hcp_post  # noqa: E402  (the results files' readers)

ANCHOR = {"M": ["mamba"], "*": ["attention_cudnn", "attention_flash"], "E": ["moe"], "-": []}
KIND = {"M": "Mamba2", "*": "attention", "E": "MoE", "-": "MLP"}


def high_water_phase(mem):
    """The phase holding the step's tensor high-water on rank 0, as the driver recorded it (None in
    files written before it was)."""
    v = mem.attrs.get("high_water_phase")
    return v.decode() if isinstance(v, bytes) else v


def rows_of(path, anc):
    with h5py.File(path, "r") as f:
        cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
        deck = tomllib.loads(cfg["deck_resolved"])
        if cfg["driver"] not in ("cp_hybrid", "train_hybrid") or int(cfg["cp_size"]) != 1 or deck["data"]["format"] != "bshd":
            raise ValueError(f"{path}: hcp_blocks takes cp = 1 BSHD cp_hybrid or train_hybrid runs")
        pat = deck["model"]["pattern"]
        if cfg["driver"] == "train_hybrid":
            L = deck["data"]["seqs_per_step"] * deck["data"]["max_len"]
            step = hcp_post._timings(f)["train"]["step"]
            a = anc.get(f"train_{pat}_l{L}", {})
            return [(L, "train", f"training step {pat}", None, step, None, a.get("median_ms"), None, a.get("peak_mib"),
                     None, None)]
        L = deck["data"]["batch"] * deck["data"]["seqlen"]
        mem = {s: float(np.max(f["memory"][s]["step_tensor_bytes"][()])) / 2**20
               for s in f.get("memory", {}) if "step_tensor_bytes" in f["memory"][s]}
        where = {s: high_water_phase(f["memory"][s]) for s in mem}
        timings = hcp_post._timings(f)
    out = []
    for strat, ph in timings.items():
        if "step" not in ph:
            continue
        for k in "M*E-":
            n = pat.count(k)
            if n == 0 or f"fwd/{k}" not in ph:
                continue
            fwd, fb = ph[f"fwd/{k}"] / n, (ph[f"fwd/{k}"] + ph.get(f"bwd/{k}", 0.0)) / n
            names = ANCHOR[k] or [None]
            for a in names:
                af = anc.get(f"block_{a}_l{L}/fwd", {}).get("median_ms") if a else None
                ab = anc.get(f"block_{a}_l{L}/fwdbwd", {}).get("median_ms") if a else None
                sv = anc.get(f"block_{a}_l{L}/fwdbwd", {}).get("saved_mib") if a else None
                out.append((L, strat, f"{KIND[k]} block" + (f" vs {a}" if a else ""), fwd, fb, af, ab, None, None, None,
                            sv))
        st = anc.get(f"block_stack_{pat}_l{L}/fwdbwd", {})
        sf = anc.get(f"block_stack_{pat}_l{L}/fwd", {}).get("median_ms")
        out.append((L, strat, f"step {pat}", None, ph["step"], sf, st.get("median_ms"), mem.get(strat), st.get("peak_mib"),
                    where.get(strat), st.get("saved_mib")))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchors", required=True, help="jobs/bench/anchors.py --only blocks[,train] output (JSON)")
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    try:
        with open(a.anchors) as fh:
            anc = json.load(fh)
        rows = [r for path in a.files for r in rows_of(path, anc)]
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        print(f"error: hcp_blocks: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    fmt = lambda v, w=9, d=2: f"{v:{w}.{d}f}" if v is not None else f"{'-':>{w}}"
    print(f"# {anc.get('_device', '?')}, torch {anc.get('_torch', '?')}; ms; ratio = ours / PyTorch, forward+backward")
    print(f"# {'L':>6} {'strategy':<9} {'block':<34} {'ours fwd':>9} {'ours f+b':>9} {'torch fwd':>9} {'torch f+b':>9} "
          f"{'ratio':>6} {'ours MiB':>9} {'torch MiB':>9}  {'ours high-water in':<18} {'torch fwd saves MiB':>19}")
    for L, strat, name, f, fb, af, ab, mm, am, where, saved in rows:
        ratio = f"{fb / ab:6.2f}" if (fb and ab) else f"{'-':>6}"
        print(f"  {L:>6} {strat:<9} {name:<34} {fmt(f)} {fmt(fb)} {fmt(af)} {fmt(ab)} {ratio} {fmt(mm, 9, 0)} {fmt(am, 9, 0)}"
              f"  {where or '-':<18} {fmt(saved, 19, 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
