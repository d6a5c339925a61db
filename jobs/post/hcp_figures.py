"""What a CP study trades, against the CP size, one line per strategy (hcp_post.py plot-scaling,
plot-memory, plot-bytes and study):

  time per step     the median over repeats of the slowest rank's step; the bar spans the fastest
                    and slowest repeat; dotted: the ideal t(cp0) cp0 / cp from the run of fewest ranks
                    (weak scaling, tokens growing with cp: the ideal is t(cp0), flat)
  memory per rank   tensors a rank holds in the step (alive before it + allocated in it), the largest
                    rank; the bar spans the smallest and largest rank; dashed: the memory model
                    (largest rank); dotted: the ideal 1/cp from the run of fewest ranks (weak: flat)
  bytes per rank    payload sent per rank and timed step (all ops but barriers, MiB), the largest
                    rank; the bar spans the ranks; dashed: the driver's byte model (cp_attention and
                    cp_mamba runs, read from its --dry-run) plus the run's parameter all-reduce
"""
import textwrap

import h5py
import numpy as np


def _config(f):
    c = f["config"].attrs if "config" in f else {}
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in c.items()}


def deck_of(cfg):
    """The run's resolved deck (a dict) from its /config."""
    import tomllib
    return tomllib.loads(cfg["deck_resolved"]) if cfg.get("deck_resolved") else {}


def real_tokens(cfg):
    """The real tokens of a run's deck (THD pads each sequence to 2 cp, so /config tokens, the padded
    total, differ with cp)."""
    data = deck_of(cfg).get("data", {})
    if data.get("format") == "bshd":
        real = int(data.get("batch", 1)) * int(data.get("seqlen", 0))
    else:
        lens = data.get("seq_lens", "0")
        lens = lens if isinstance(lens, list) else str(lens).replace(",", " ").split()
        real = sum(int(x) for x in lens)
    return real or int(cfg.get("tokens", 0) or 0)


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
    rank), MiB sent per rank and step."""
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
                     "over": over, "tokens": real_tokens(cfg), "layout": str(cfg.get("partition", ""))}
                mem = f.get(f"memory/{strat}")
                if isinstance(mem, h5py.Group) and "step_tensor_bytes" in mem and "live_tensor_bytes" in mem:
                    p["mem"] = (mem["step_tensor_bytes"][()] + mem["live_tensor_bytes"][()]) / 2**20
                    if "model_bytes" in mem:
                        p["model"] = mem["model_bytes"][()] / 2**20
                comm = f.get(f"comm/{strat}")
                if isinstance(comm, h5py.Group):
                    per_rank = [np.asarray(g["bytes_sent"][()], dtype=np.float64) for op, g in comm.items() if op != "barrier"]
                    p["sent"] = sum(per_rank) / 2**20 if per_rank else np.zeros(cp)
                    p["sent_params"] = (np.asarray(comm["all_reduce"]["bytes_sent"][()], dtype=np.float64) / 2**20
                                        if "all_reduce" in comm else np.zeros(cp))
                    p["cfg"] = cfg
                out.append(p)
    return with_lines(cp1_for_every_strategy(out))


def with_lines(pts):
    """Each point's line: its strategy, and its token layout (data.partition) where the files hold
    more than one, so that dcs and documents runs of one strategy are two lines, not one zig-zag."""
    several = len({p["layout"] for p in pts}) > 1
    return [dict(p, line=f"{p['strategy']} ({p['layout'] or '-'})" if several else p["strategy"]) for p in pts]


def cp1_for_every_strategy(pts):
    """At cp=1 every strategy is the same computation, which a study runs once: that run is the
    cp=1 point of each strategy seen at larger cp (a strategy's own cp=1 run, where there is one, stays)."""
    cp1 = [p for p in pts if p["cp"] == 1]
    wider = {(p["strategy"], p["layout"]) for p in pts if p["cp"] > 1}
    if not cp1 or not wider:
        return pts
    have = {(p["strategy"], p["layout"]) for p in cp1}
    out = [p for p in pts if p["cp"] > 1 or (p["strategy"], p["layout"]) in wider]
    out += [dict(cp1[0], strategy=s, layout=lay) for s, lay in sorted(wider - have)]
    return out


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def ideal_of(pts):
    """'flat' when the tokens grow with cp at a fixed number per rank (weak scaling), else '1/cp'."""
    tokens = {p["tokens"] for p in pts}
    per_rank = {p["tokens"] / p["cp"] for p in pts if p["cp"] > 0}
    return "flat" if len(tokens) > 1 and len(per_rank) == 1 else "1/cp"


def figure(lines, out, title, ylabel, ylog, model_label="model",
           hollow_label="more ranks than cores: core sharing, not CP"):
    """lines: {strategy: {"pts": [(cp, y, lo, hi)], "model": [(cp, y)], "ideal": None | "1/cp" | "flat"}}.
    Model lines are dashed in their strategy's colour, named once in the legend (`model_label`);
    points at the cps of a line's "over" set are hollow, named once (`hollow_label`)."""
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
            ax.plot([q[0] for q in m], [q[1] for q in m], "--x", color=color, alpha=0.7, markersize=8)
        if ln.get("ideal") and len(pts) > 1 and y[0] > 0:
            ax.plot(cps, y[0] * (np.ones_like(cps) if ln["ideal"] == "flat" else cps[0] / cps), ":", color=color, alpha=0.7)
        over = [p for p in pts if p[0] in ln.get("over", ())]
        if over:  # hollow: ranks shared a node's cores
            ax.plot([p[0] for p in over], [p[1] for p in over], "o", markersize=11, markerfacecolor="white",
                    markeredgecolor=color, zorder=3)
    if any(ln.get("model") for ln in lines.values()):
        ax.plot([], [], "k--x", alpha=0.7, label=f"dashed, x: {model_label}")
    ideal = {ln.get("ideal") for ln in lines.values()} - {None}
    if ideal:
        ax.plot([], [], "k:", alpha=0.7, label="ideal: flat (weak scaling)" if ideal == {"flat"} else "ideal 1/cp (from the fewest ranks)")
    if any(ln.get("over") for ln in lines.values()):
        ax.plot([], [], "o", color="k", markerfacecolor="white", label=hollow_label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
    if ylog:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.LogFormatter(labelOnlyBase=False))  # within a decade only
    ax.set_xlabel("CP size (ranks)")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 64), fontsize=11 if len(title) <= 64 else 10)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_time(files, out, title):
    lines = {}
    pts = points(files)
    ideal = ideal_of(pts)
    for p in pts:
        s = p["step"]
        if s is None or not s.size:
            continue
        ln = lines.setdefault(p["line"], {"pts": [], "ideal": ideal, "over": set()})
        ln["pts"].append((p["cp"], float(np.median(s)), float(s.min()), float(s.max())))
        if p["over"]:
            ln["over"].add(p["cp"])
    if lines:
        figure(dict(sorted(lines.items())), out, title, "time per step (ms)\nmedian of the slowest rank; bar: repeats", ylog=True)
    return lines


def plot_memory(files, out, title):
    lines = {}
    pts = points(files)
    ideal = ideal_of(pts)
    for p in pts:
        m = p["mem"]
        if m is None or not np.size(m):
            continue
        ln = lines.setdefault(p["line"], {"pts": [], "model": [], "ideal": ideal})
        ln["pts"].append((p["cp"], float(m.max()), float(m.min()), float(m.max())))
        if p["model"] is not None:
            ln["model"].append((p["cp"], float(np.max(p["model"]))))
    if lines:
        figure(dict(sorted(lines.items())), out, title, "tensor memory per rank (MiB)\nlargest rank; bar: smallest to largest", ylog=True,
               model_label="memory model (largest rank)")
    return lines


def byte_models(pts, bindir):
    """{(file's /config text, strategy): [MiB per rank]}: the driver's byte model of each cp_attention
    and cp_mamba run (hcp_plan.file_byte_model, from its --dry-run), plus the run's parameter
    all-reduce, which the model leaves out; empty where the drivers are not found."""
    import hcp_plan
    out, cache = {}, {}  # one dry run per deck and cp
    for p in pts:
        cfg = p.get("cfg")
        if cfg is None or p["cp"] < 2:
            continue
        key = cfg.get("deck_resolved", "") + str(cfg.get("cp_size")) + str(cfg.get("cp_inner"))
        if key not in cache:
            try:
                cache[key] = hcp_plan.file_byte_model(bindir or hcp_plan.DEFAULT_BIN, cfg)
            except (OSError, ValueError):
                cache[key] = None
        m = cache[key]
        if m and p["strategy"] in m:
            out[(key, p["strategy"])] = np.asarray(m[p["strategy"]], dtype=float) / 2**20 + p["sent_params"]
    return out


def plot_bytes(files, out, title, bindir=None):
    lines = {}
    pts = points(files)
    models = byte_models(pts, bindir)
    for p in pts:
        b = p["sent"]
        if b is None or not np.size(b):
            continue
        ln = lines.setdefault(p["line"], {"pts": [], "model": []})
        ln["pts"].append((p["cp"], float(b.max()), float(b.min()), float(b.max())))
        cfg = p.get("cfg") or {}
        key = (cfg.get("deck_resolved", "") + str(cfg.get("cp_size")) + str(cfg.get("cp_inner")), p["strategy"])
        if key in models:
            ln["model"].append((p["cp"], float(models[key].max())))
    if lines:
        figure(dict(sorted(lines.items())), out, title, "MiB sent per rank and step\nlargest rank; bar: smallest to largest",
               ylog=False, model_label="byte model")
    return lines
