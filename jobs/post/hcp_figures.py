"""What a CP study trades, against the CP size, one line per strategy (hcp_post.py plot-scaling,
plot-memory, plot-bytes and study):

  time per step     the median over repeats of the slowest rank's step; the bar spans the fastest
                    and slowest repeat; dotted: the ideal t(cp0) cp0 / cp from the run of fewest ranks
  memory per rank   tensors a rank holds in the step (alive before it + allocated in it), the largest
                    rank; the bar spans the smallest and largest rank; dashed: the memory model
                    (largest rank); dotted: the ideal 1/cp from the run of fewest ranks
  bytes per rank    payload sent per rank and timed step (all ops but barriers), the largest rank;
                    the bar spans the ranks
"""
import h5py
import numpy as np


def _config(f):
    c = f["config"].attrs if "config" in f else {}
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in c.items()}


def _step(f, strat):
    """[repeat] of the slowest rank's step (ms) of `strat`, or None."""
    g = f.get(f"timings/{strat}")
    if not isinstance(g, h5py.Group):
        return None
    for key in ("step", "train/step"):
        if key in g:
            v = np.asarray(g[key][()], dtype=np.float64)
            return v.max(axis=0) if v.ndim == 2 else v
    if "forward" in g and "backward" in g:
        v = np.asarray(g["forward"][()], dtype=np.float64) + np.asarray(g["backward"][()], dtype=np.float64)
        return v.max(axis=0) if v.ndim == 2 else v
    return None


def points(files):
    """One dict per (file, strategy): cp, step repeats (ms), memory per rank and its model (MiB, per
    rank), MB sent per rank and step."""
    out = []
    for path in files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            cp = int(cfg.get("cp_size", 1))
            rpn, cores = int(cfg.get("ranks_per_node", 0)), int(cfg.get("node_cores", 0))
            over = bool(rpn and cores and rpn > cores)  # ranks shared cores: the time is not CP's
            strategies = sorted(set(f["timings"]) if "timings" in f else set())
            for strat in strategies:
                if not isinstance(f["timings"][strat], h5py.Group):
                    continue
                p = {"cp": cp, "strategy": strat, "step": _step(f, strat), "mem": None, "model": None, "sent": None,
                     "over": over}
                mem = f.get(f"memory/{strat}")
                if isinstance(mem, h5py.Group) and "step_tensor_bytes" in mem and "live_tensor_bytes" in mem:
                    p["mem"] = (mem["step_tensor_bytes"][()] + mem["live_tensor_bytes"][()]) / 2**20
                    if "model_bytes" in mem:
                        p["model"] = mem["model_bytes"][()] / 2**20
                comm = f.get(f"comm/{strat}")
                if isinstance(comm, h5py.Group):
                    per_rank = [np.asarray(g["bytes_sent"][()], dtype=np.float64) for op, g in comm.items() if op != "barrier"]
                    p["sent"] = sum(per_rank) / 1e6 if per_rank else np.zeros(cp)
                out.append(p)
    return out


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def figure(lines, out, title, ylabel, ylog):
    """lines: {strategy: {"pts": [(cp, y, lo, hi)], "model": [(cp, y)], "ideal": bool}}."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (strat, ln) in enumerate(lines.items()):  # in the caller's order
        color = f"C{i % 10}"
        pts = sorted(ln["pts"])
        cps = np.array([p[0] for p in pts], dtype=float)
        y = np.array([p[1] for p in pts])
        err = np.array([[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]])
        ax.errorbar(cps, y, yerr=err, marker="o", capsize=3, color=color, label=strat)
        if ln.get("model"):
            m = sorted(ln["model"])
            ax.plot([q[0] for q in m], [q[1] for q in m], "--", color=color, alpha=0.7, label=f"{strat} model")
        if ln.get("ideal") and len(pts) > 1 and y[0] > 0:
            ax.plot(cps, y[0] * cps[0] / cps, ":", color=color, alpha=0.7)
        over = [p for p in pts if p[0] in ln.get("over", ())]
        if over:  # hollow: ranks shared a node's cores
            ax.plot([p[0] for p in over], [p[1] for p in over], "o", markersize=11, markerfacecolor="white",
                    markeredgecolor=color, zorder=3)
    if any(ln.get("ideal") for ln in lines.values()):
        ax.plot([], [], "k:", alpha=0.7, label="ideal 1/cp (from the fewest ranks)")
    if any(ln.get("over") for ln in lines.values()):
        ax.plot([], [], "o", color="k", markerfacecolor="white", label="more ranks than cores: core sharing, not CP")
    ax.set_xscale("log", base=2)
    if ylog:
        ax.set_yscale("log")
    ax.set_xlabel("CP size (ranks)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_time(files, out, title):
    lines = {}
    for p in points(files):
        s = p["step"]
        if s is None or not s.size:
            continue
        ln = lines.setdefault(p["strategy"], {"pts": [], "ideal": True, "over": set()})
        ln["pts"].append((p["cp"], float(np.median(s)), float(s.min()), float(s.max())))
        if p["over"]:
            ln["over"].add(p["cp"])
    if lines:
        figure(dict(sorted(lines.items())), out, title, "time per step (ms)\nmedian of the slowest rank; bar: repeats", ylog=True)
    return lines


def plot_memory(files, out, title):
    lines = {}
    for p in points(files):
        m = p["mem"]
        if m is None or not np.size(m):
            continue
        ln = lines.setdefault(p["strategy"], {"pts": [], "model": [], "ideal": True})
        ln["pts"].append((p["cp"], float(m.max()), float(m.min()), float(m.max())))
        if p["model"] is not None:
            ln["model"].append((p["cp"], float(np.max(p["model"]))))
    if lines:
        figure(dict(sorted(lines.items())), out, title, "tensor memory per rank (MiB)\nlargest rank; bar: smallest to largest", ylog=True)
    return lines


def plot_bytes(files, out, title):
    lines = {}
    for p in points(files):
        b = p["sent"]
        if b is None or not np.size(b):
            continue
        lines.setdefault(p["strategy"], {"pts": []})["pts"].append((p["cp"], float(b.max()), float(b.min()), float(b.max())))
    if lines:
        figure(dict(sorted(lines.items())), out, title, "MB sent per rank and step\nlargest rank; bar: smallest to largest", ylog=False)
    return lines
