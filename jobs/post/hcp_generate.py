#!/usr/bin/python3
"""CP inference: cp_generate results files, one row per file and attention strategy.

  hcp_generate.py [--plot OUT.png] F.h5 [F.h5 ...]

Per row: the CP size, the prompt tokens (and sequences), the strategies, the prefill time (median
over repeats of the slowest rank), the bytes a rank sent in the prefill (max over ranks), the
hand-off a rank holds (Mamba2 windows and states plus attention KV shards, max over ranks), the
cached attention tokens per rank (max / mean), the decode time per generated token and the bytes a
rank sends per token (max over ranks), and the tensor memory of the heaviest rank beside the memory
model. With run.check = reference, the worst logits error against teacher forcing and whether the ids
equal cp = 1's. --plot draws prefill time and bytes against cp, and decode time per token against
prompt length (one line per cp), each with its spread over repeats.
Exit 2 on a file that is not a finished cp_generate run.
"""
import argparse
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hcp_files  # noqa: E402  (finished, undamaged files only)


def _s(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _ms(f, case, phase):
    """Median, fastest and slowest repeat of a phase, each repeat's time its slowest rank's."""
    per_repeat = np.atleast_2d(np.asarray(f["timings"][case][phase][()], dtype=float)).max(axis=0)  # [ranks, repeats]
    return float(np.median(per_repeat)), float(per_repeat.min()), float(per_repeat.max())


def rows_of(path):
    hcp_files.verify(path)
    out = []
    with h5py.File(path, "r") as f:
        cfg = {k: _s(v) for k, v in f["config"].attrs.items()}
        if cfg.get("driver") != "cp_generate" or "generate" not in f:
            raise ValueError(f"{path}: not a cp_generate run")
        lens = np.asarray(f["generate/prompt_lengths"][()], dtype=np.int64)
        new = int(cfg["new_tokens"])
        for case in f["generate"]:
            g = f["generate"][case]
            if not isinstance(g, h5py.Group) or case == "reference":
                continue
            pre = _ms(f, case, "prefill")
            dec = _ms(f, case, "decode")
            steps = max(new - 1, 1)
            mem = f["memory"][case]
            heavy = np.asarray(mem["step_tensor_bytes"][()]) + np.asarray(mem["live_tensor_bytes"][()])
            kv = np.asarray(g["kv_tokens"][()], dtype=float)
            r = {"file": os.path.basename(path), "cp": int(cfg["cp_size"]), "tokens": int(lens.sum()),
                 "seqs": len(lens), "case": case, "mamba_cp": cfg.get("mamba_cp", ""), "backend": cfg.get("backend", ""),
                 "dtype": cfg.get("dtype", ""), "prefill": pre, "decode": tuple(v / steps for v in dec),
                 "handoff_ms": _ms(f, case, "handoff")[0],
                 "prefill_sent": float(np.max(g["prefill_bytes"][()])),
                 "decode_sent": float(np.max(g["decode_bytes_per_token"][()])),
                 "handoff": float(np.max(np.asarray(g["handoff_mamba_bytes"][()]) + np.asarray(g["handoff_kv_bytes"][()]))),
                 "mamba": float(np.max(g["handoff_mamba_bytes"][()])), "kv": float(np.max(g["handoff_kv_bytes"][()])),
                 "kv_tokens": (float(kv.max()), float(kv.mean())), "mem": float(heavy.max()),
                 "mem_model": float(np.max(mem["model_bytes"][()])), "err": None, "ids": None}
            if "logits_err" in g:
                r["err"] = float(np.max(g["logits_err"][()]))
                r["ids"] = bool(np.array_equal(g["ids"][()], f["generate/reference/ids"][()]))
            out.append(r)
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    cases = sorted({(r["case"], r["mamba_cp"]) for r in rows})
    # prefill scaling at the prompt length run at the most CP sizes (the longest of those)
    top = max({r["tokens"] for r in rows}, key=lambda t: (len({r["cp"] for r in rows if r["tokens"] == t}), t))
    for case, mc in cases:  # prefill scaling: the longest prompt, by cp
        sel = sorted((r for r in rows if (r["case"], r["mamba_cp"]) == (case, mc) and r["tokens"] == top),
                     key=lambda r: r["cp"])
        if not sel:
            continue
        cps = [r["cp"] for r in sel]
        med = np.array([r["prefill"][0] for r in sel]) / 1e3
        lo = med - np.array([r["prefill"][1] for r in sel]) / 1e3
        hi = np.array([r["prefill"][2] for r in sel]) / 1e3 - med
        axes[0].errorbar(cps, med, yerr=[lo, hi], marker="o", capsize=3, label=f"{case}, {mc}")
        axes[0].plot(cps, med[0] * cps[0] / np.array(cps), ls=":", color="gray")
        sent = [(r["cp"], r["prefill_sent"] / 2**20) for r in sel if r["cp"] > 1]  # cp 1 sends nothing
        if sent:
            axes[1].plot(*zip(*sent), marker="o", label=f"prefill sent, {case}")
        axes[1].plot(cps, [r["handoff"] / 2**20 for r in sel], marker="s", ls="--", label=f"hand-off held, {case}")
    for cp in sorted({r["cp"] for r in rows}):  # decode cost against prompt length
        sel = sorted((r for r in rows if r["cp"] == cp), key=lambda r: r["tokens"])
        if len({r["tokens"] for r in sel}) < 2:
            continue
        med = np.array([r["decode"][0] for r in sel])
        axes[2].errorbar([r["tokens"] for r in sel], med,
                         yerr=[med - [r["decode"][1] for r in sel], [r["decode"][2] for r in sel] - med],
                         marker="o", capsize=3, label=f"cp {cp}")
    axes[0].set(xscale="log", yscale="log", xlabel="CP ranks", ylabel="s",
                title=f"prefill, {top} tokens\n(median, whisker min-max; dotted: 1/cp)")
    axes[1].set(xscale="log", yscale="log", xlabel="CP ranks", ylabel="MiB per rank (max over ranks)",
                title=f"prefill, {top} tokens\nbytes sent and hand-off held")
    axes[2].set(xscale="log", xlabel="prompt tokens", ylabel="ms per generated token",
                title="decode step per token against prompt length\n(median, whisker min-max)")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        ax.set_xticks(sorted({r["cp"] for r in rows}) if ax is not axes[2] else sorted({r["tokens"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.suptitle(f"cp_generate: CP prefill, hand-off and decode ({rows[0]['dtype']}, {rows[0]['backend']} ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plot", help="write the figure here (PNG)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    try:
        rows = [r for p in a.files for r in rows_of(p)]
    except (ValueError, KeyError, OSError, hcp_files.Damaged) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mib = 1 / 2**20
    print("| cp | prompt tokens (seqs) | attention / mamba | prefill ms | prefill MiB sent / rank | hand-off MiB / rank "
          "(Mamba2 + KV) | KV tokens / rank max (mean) | decode ms / token | decode KiB / token / rank "
          "| memory MiB (model) | logits err | ids |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["tokens"], r["cp"], r["case"])):
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        ids = "-" if r["ids"] is None else ("same" if r["ids"] else "DIFFER")
        print(f"| {r['cp']} | {r['tokens']} ({r['seqs']}) | {r['case']} / {r['mamba_cp']} | {r['prefill'][0]:.0f} "
              f"| {r['prefill_sent'] * mib:.2f} | {r['handoff'] * mib:.2f} ({r['mamba'] * mib:.2f} + {r['kv'] * mib:.2f}) "
              f"| {r['kv_tokens'][0]:.0f} ({r['kv_tokens'][1]:.0f}) | {r['decode'][0]:.2f} | {r['decode_sent'] / 1024:.2f} "
              f"| {r['mem'] * mib:.1f} ({r['mem_model'] * mib:.1f}) "
              f"| {err} | {ids} |")
    if a.plot:
        plot(rows, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
