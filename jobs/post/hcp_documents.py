#!/usr/bin/python3
"""Packed documents by layout: cp_attention results files run with data.partition = dcs, documents
and groups (scripts/hcp documents makes them), one row per file, beside the planner's prediction.

  hcp_documents.py [--bin DIR] [--plot OUT.png] F.h5 [F.h5 ...]

Per file: the CP size and layout, pad tokens, bytes per rank and step (max and mean over ranks,
measured by the communicator's counters) and the byte model's maximum from the driver's --dry-run
(the planner's source, jobs/post/hcp_plan.py), the imbalance (max / mean over ranks) of the work by
the placement's cost model and of the real tokens, as the run recorded them (/partition) and as the
dry run predicts them, the tensor memory of the heaviest rank (allocated in the step plus alive
before it) beside the memory model, and the step time (median over repeats of the slowest rank's
step, as hcp_post.py table and the figures read it). --plot draws bytes, work imbalance and step
time by CP size, one bar per layout (the step's bar the median, its whisker the fastest and slowest
repeat).
Exit 1 when a rank's measured bytes differ from the model or the run's placement (pads, work,
groups) from the dry run's; 2 on a file that is not a cp_attention THD run.
"""
import argparse
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hcp_figures  # noqa: E402  (the step time as every post-processing command reads it)
import hcp_plan  # noqa: E402  (driver_dry_run: the drivers' own models)


def imbalance(v):
    v = np.asarray(v, dtype=float)
    return float(v.max() * len(v) / v.sum()) if v.sum() > 0 else 1.0


def split_over(group):
    """The split documents by the ranks each runs over: "2x4 1x8" (two over 4 ranks, one over 8)."""
    g = [int(x) for x in group if int(x) > 1]
    return " ".join(f"{g.count(n)}x{n}" for n in sorted(set(g))) or "none"


def deck_name(command_line):
    """The --deck file a run was given (its base name), or "" for the built-in deck."""
    words = command_line.split()
    return os.path.basename(words[words.index("--deck") + 1]) if "--deck" in words[:-1] else ""


def row(path, bindir):
    with h5py.File(path, "r") as f:
        cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
        if cfg.get("driver") != "cp_attention" or cfg.get("format") != "thd" or "partition" not in f:
            raise ValueError(f"{path}: not a cp_attention THD run with /partition")
        cp = int(cfg["cp_size"])
        strat = str(cfg["strategy"]).split(",")[0]
        part = {k: f["partition"][k][()] for k in f["partition"]}
        sent = np.zeros(cp)
        if "comm" in f and strat in f["comm"]:
            for op, g in f["comm"][strat].items():
                if op not in ("barrier", "all_reduce"):
                    sent += g["bytes_sent"][()]
        mem = f["memory"][strat]
        held = mem["step_tensor_bytes"][()] + mem["live_tensor_bytes"][()]
        heavy = int(np.argmax(held))
        steps = np.asarray(hcp_figures._step(f, strat), dtype=float)  # as hcp_post.py table and the figures
        step = float(np.median(steps))
        out = {"file": os.path.basename(path), "cp": cp, "partition": cfg["partition"], "strategy": strat,
               "pads": int(part["pad_tokens"][0]), "sent": sent, "work": imbalance(part["work"]),
               "tokens": imbalance(part["tokens"]), "mem": float(held[heavy]),
               "mem_model": float(mem["model_bytes"][()][heavy]), "step_ms": step,
               "step_lo": float(steps.min()), "step_hi": float(steps.max()), "backend": str(cfg.get("backend", "")), "deck": deck_name(str(cfg.get("command_line", ""))),
               "group": [int(x) for x in part["group"]] if "group" in part else None}
    sets = ["run.check=off", "run.memory_gib=1e6", "run.device=host", f"parallel.cp_inner={int(cfg.get('cp_inner', 1))}"]
    dry = hcp_plan.driver_dry_run(bindir, cfg["deck_resolved"], sets, cp, "cp_attention")["bytes"]
    out["model"] = np.asarray(dry["layers"]["*"][strat], dtype=float)
    pl = dry["placement"]
    out["plan_pads"], out["plan_work"], out["plan_tokens"] = pl["pad_tokens"], imbalance(pl["work"]), imbalance(pl["tokens"])
    out["plan_group"] = [int(x) for x in pl["group"]]
    out["ok"] = (np.array_equal(out["sent"], out["model"]) and out["plan_pads"] == out["pads"]
                 and abs(out["plan_work"] - out["work"]) < 1e-6 * out["work"]
                 and (out["group"] is None or out["group"] == out["plan_group"]))
    return out


def plot(rows, path):
    """Bytes per rank (max), work max/mean and step time by CP size, a bar per layout."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cps = sorted({r["cp"] for r in rows})
    layouts = [p for p in ("dcs", "documents", "groups") if any(r["partition"] == p for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    w = 0.8 / max(len(layouts), 1)
    panels = [("MiB sent per rank and step (max over ranks)", lambda r: r["sent"].max() / 2**20, None),
              ("work max / mean over ranks", lambda r: r["work"], None),
              ("step ms (median; whisker: min-max of repeats)", lambda r: r["step_ms"],
               lambda r: (r["step_ms"] - r["step_lo"], r["step_hi"] - r["step_ms"]))]
    for ax, (title, val, err) in zip(axes, panels):
        for i, lay in enumerate(layouts):
            sel = {r["cp"]: r for r in rows if r["partition"] == lay}
            xs = [k + (i - (len(layouts) - 1) / 2) * w for k, c in enumerate(cps) if c in sel]
            ys = [val(sel[c]) for c in cps if c in sel]
            yerr = None
            if err:
                lo_hi = [err(sel[c]) for c in cps if c in sel]
                yerr = np.array(lo_hi).T
            ax.bar(xs, ys, w, yerr=yerr, capsize=3, label=lay)
        ax.set_xticks(range(len(cps)), [f"cp {c}" for c in cps])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[1].axhline(1.1, color="k", lw=0.8, ls="--", label="1.1 (balanced)")
    axes[1].set_ylim(0.9, max(1.2, max(r["work"] for r in rows) * 1.05))
    axes[0].set_ylabel("MiB")
    axes[2].set_ylabel("ms")
    axes[1].legend(fontsize=8)
    decks = sorted({r["deck"] for r in rows if r["deck"]}) or ["built-in deck"]
    fig.suptitle(f"Packed documents by layout: cp_attention, {', '.join(decks)}, {rows[0]['backend']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=hcp_plan.DEFAULT_BIN, help="directory of the driver binaries (for --dry-run)")
    ap.add_argument("--plot", help="write the figure here (PNG)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    try:
        rows = [row(p, a.bin) for p in a.files]
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mib = 1 / 2**20
    print("| cp | layout | split over (docs x ranks) | pad tokens | MiB sent / rank, max (mean) | model max "
          "| work max/mean (planner) | tokens max/mean (planner) | memory MiB, heaviest rank (model) | step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = {"dcs": 0, "documents": 1, "groups": 2}
    for r in sorted(rows, key=lambda r: (r["cp"], order.get(r["partition"], 3))):
        print(f"| {r['cp']} | {r['partition']} | {split_over(r['plan_group'])} | {r['pads']} "
              f"| {r['sent'].max() * mib:.2f} ({r['sent'].mean() * mib:.2f}) "
              f"| {r['model'].max() * mib:.2f} | {r['work']:.3f} ({r['plan_work']:.3f}) | {r['tokens']:.3f} ({r['plan_tokens']:.3f}) "
              f"| {r['mem'] * mib:.1f} ({r['mem_model'] * mib:.1f}) | {r['step_ms']:.0f} |")
    if a.plot:
        plot(rows, a.plot)
    bad = [r["file"] for r in rows if not r["ok"]]
    print(f"RESULT documents {'EXACT' if not bad else 'DIFFERS ' + ','.join(bad)} "
          f"(bytes of every rank = model; placement = planner's) {len(rows) - len(bad)}/{len(rows)}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
