#!/usr/bin/python3
"""Post-processing of hybridcp HDF5 result files (h5py, numpy, matplotlib).

  hcp_post.py compare A.h5 B.h5 [--rtol R] [--atol A] [--prefix /gradients ...] [--pair PA PB]
      tensor-by-tensor comparison of the datasets both files hold (max abs / max rel error,
      pass/fail against atol + rtol * max|B|); exit 1 if any fails or nothing is comparable.
      --pair compares A's datasets under PA with B's under PB instead (e.g. two strategies of
      one file: compare F.h5 F.h5 --pair /gradients/p2p /gradients/a2a). A tensor that one file does
      not keep (run.save) is compared by the statistics both files store for it (/stats: L2 norm,
      max |x|, mean, count; each within atol + rtol * B's value): a necessary check, not element-wise.
  hcp_post.py summary [--brief] F.h5 ...  the /summary entries (errors against cp=1) with pass/fail; exit 1 on a
      fail, 3 when no file holds any entry (nothing was checked: not a pass)
  hcp_post.py table [--csv|--json] F.h5 ...   timings: per file, strategy and phase, median over repeats of
      the slowest rank (as text, CSV or JSON)
  hcp_post.py plot-scaling --out S.png F.h5 ...   time per step against cp size, one line per strategy,
      the spread of the repeats and the ideal 1/cp line
  hcp_post.py plot-memory --out M.png F.h5 ...    tensor memory per rank against cp size: largest rank,
      the spread over ranks, the memory model, the ideal 1/cp line
  hcp_post.py plot-bytes --out B.png F.h5 ...     bytes sent per rank and step against cp size
  hcp_post.py plot-breakdown --out B.png F.h5 ...  stacked per-phase time per strategy (and cp)
  hcp_post.py plot-errors --out E.png F.h5 ...     worst error against cp=1 per strategy and cp, with tolerance
  hcp_post.py study DIR [--title T]   a study directory (e.g. a Slurm job's HCP_OUTDIR) in one command:
      the timing table, DIR/timings.csv, DIR/{scaling,memory,bytes,breakdown,errors}.png and the
      error summary of every finished *.h5 in DIR; exit as summary does. Runs are grouped by
      problem (driver, model, dtype, and tokens, or tokens per rank for a weak study); with several
      groups each gets its own table and files (timings-N.csv, scaling-N.png, ...). What is left
      out (unfinished files, other drivers' files) is named.
  hcp_post.py scale [--csv] F.h5 ...   what CP trades, per file and strategy: step time, tensor memory per
      rank (max over ranks; the memory model beside it; x cp against the file of fewest ranks: 1.00
      is the ideal 1/cp), bytes sent per rank and step, and the check (reference / cross / off)
  hcp_post.py loss --out L.png F.h5 [--min-drop X] training loss curve(s); exit 1 unless the loss fell by X
  hcp_post.py anchors --anchors A.json F.h5   bench_kernels (suite anchors) against jobs/bench/anchors.py of
      the same run: our time, anchor time, ratio (anchor time / ours: >= 1 means at least as fast),
      TFLOP/s or GB/s, and the fraction of the copy ceiling for memory-bound kernels
Exit 2, with one error line, on a file that cannot be read, is unfinished (<out>.tmp-<pid>) or is
damaged: every command first checks each file's /checksums (every numeric dataset and /summary
attribute, recorded by the run when the file was complete), then groups and attributes it needs.
"""
import argparse
import os
import sys
import textwrap

import h5py
import numpy as np

import hcp_figures
from hcp_files import unusable


def _datasets(f, prefixes):
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and any(("/" + name).startswith(p) for p in prefixes):
            out["/" + name] = obj

    f.visititems(visit)
    return out


_STATS = ("l2", "max_abs", "mean", "count", "nonfinite")


def _stats(f, prefixes):
    """{tensor path: {l2, max_abs, mean, count, nonfinite}} from /stats, for tensors under `prefixes`."""
    out = {}
    if "stats" not in f:
        return out

    def visit(name, obj):
        path = "/stats/" + name
        if isinstance(obj, h5py.Group) and "l2" in obj.attrs and any(path.startswith(p) for p in prefixes):
            out[path] = {k: float(obj.attrs[k]) for k in _STATS}

    f["stats"].visititems(visit)
    return out


def _compare_stats(n, x, y, a):
    """One tensor by its statistics: counts equal, no non-finite value, and L2 norm, max |x| and mean
    each within atol + rtol * (B's L2 norm or max |x|)."""
    if x["count"] != y["count"] or x["nonfinite"] > 0 or y["nonfinite"] > 0:
        print(f"  {n:<48} {'count/nonfinite':>21} {int(x['count'])}/{int(x['nonfinite'])} vs "
              f"{int(y['count'])}/{int(y['nonfinite'])} FAIL")
        return False
    errs = [abs(x["l2"] - y["l2"]) / max(y["l2"], 1e-300), abs(x["max_abs"] - y["max_abs"]) / max(y["max_abs"], 1e-300),
            abs(x["mean"] - y["mean"]) / max(y["max_abs"], 1e-300)]
    ok = (abs(x["l2"] - y["l2"]) <= a.atol + a.rtol * y["l2"]
          and abs(x["max_abs"] - y["max_abs"]) <= a.atol + a.rtol * y["max_abs"]
          and abs(x["mean"] - y["mean"]) <= a.atol + a.rtol * y["max_abs"])
    print(f"  {n:<48} {'(stats)':>10} {max(errs):10.3e} {'pass' if ok else 'FAIL':>6}")
    return ok


def cmd_compare(a):
    fa, fb = h5py.File(a.a, "r"), h5py.File(a.b, "r")
    if a.pair:
        pa, pb = (p.rstrip("/") + "/" for p in a.pair)
        da = {n[len(pa):]: d for n, d in _datasets(fa, [pa]).items()}
        db = {n[len(pb):]: d for n, d in _datasets(fb, [pb]).items()}
        sa = {n[len("/stats" + pa):]: v for n, v in _stats(fa, ["/stats" + pa]).items()}
        sb = {n[len("/stats" + pb):]: v for n, v in _stats(fb, ["/stats" + pb]).items()}
    else:
        da, db = _datasets(fa, a.prefix), _datasets(fb, a.prefix)
        sa = {n[len("/stats"):]: v for n, v in _stats(fa, ["/stats" + p for p in a.prefix]).items()}
        sb = {n[len("/stats"):]: v for n, v in _stats(fb, ["/stats" + p for p in a.prefix]).items()}
    common = sorted(set(da) & set(db))
    by_stats = sorted((set(sa) & set(sb)) - set(common))
    if not common and not by_stats:
        where = " vs ".join(a.pair) if a.pair else ", ".join(a.prefix)
        print(f"error: {a.a} and {a.b} have no dataset in common under {where}", file=sys.stderr)
        return 1
    bad = 0
    print(f"# {'dataset':<48} {'max_abs':>10} {'max_rel':>10} {'result':>6}")
    for n in common:
        x, y = np.asarray(da[n][()], dtype=np.float64), np.asarray(db[n][()], dtype=np.float64)
        if x.shape != y.shape:
            print(f"  {n:<48} {'shape':>10} {str(x.shape) + ' vs ' + str(y.shape):>17} FAIL")
            bad += 1
            continue
        d = np.abs(x - y)
        mabs = float(d.max()) if d.size else 0.0
        ref = float(np.abs(y).max()) if y.size else 0.0
        mrel = mabs / ref if ref > 0 else mabs
        ok = mabs <= a.atol + a.rtol * ref
        bad += 0 if ok else 1
        print(f"  {n:<48} {mabs:10.3e} {mrel:10.3e} {'pass' if ok else 'FAIL':>6}")
    if by_stats:
        print(f"# {len(by_stats)} tensors not kept by both files: compared by their statistics (L2 norm, max |x|, "
              "mean; max relative difference shown)")
    for n in by_stats:
        bad += 0 if _compare_stats(n, sa[n], sb[n], a) else 1
    only = sorted((set(da) | set(sa)) ^ (set(db) | set(sb)))
    if only:
        print(f"# {len(only)} tensors in one file only (not compared), e.g. {only[0]}")
    total = len(common) + len(by_stats)
    print(f"RESULT compare {'PASS' if bad == 0 else 'FAIL'} {total - bad}/{total}")
    return 0 if bad == 0 else 1


def _config(f):
    c = f["config"].attrs if "config" in f else {}
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in c.items()}


def cmd_summary(a):
    bad = checked = 0
    for path in a.files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            print(f"# {path}: driver={cfg.get('driver')} cp={int(cfg.get('cp_size', 0))} strategy={cfg.get('strategy')}")
            if "summary" not in f:
                print("  (no /summary: not checked against cp=1)")
                continue
            rows = []
            f["summary"].visititems(lambda n, o: rows.append((n, o)) if "pass" in o.attrs else None)
            worst = {}
            checked += len(rows)
            for n, o in rows:
                ok = bool(o.attrs["pass"])
                bad += 0 if ok else 1
                group = n.split("/")[0] if "/" in n else "-"
                w = worst.setdefault(group, [0.0, 0, 0, 0.0])
                w[0] = max(w[0], float(o.attrs["max_rel"]))
                w[1] += 1
                w[2] += 0 if ok else 1
                w[3] = float(o.attrs["tolerance"])
                if not a.brief:
                    print(f"  {n:<40} max_rel {float(o.attrs['max_rel']):10.3e}  tol {float(o.attrs['tolerance']):8.1e}"
                          f"  {'pass' if ok else 'FAIL'}")
            if a.brief:
                for g, (mx, n, nb, tol) in sorted(worst.items()):
                    print(f"  {g:<16} {n:4d} tensors  worst max_rel {mx:9.2e}  tol {tol:8.1e}  {'pass' if nb == 0 else 'FAIL'}")
    if checked == 0:
        print("RESULT summary NOTHING-TO-CHECK (no /summary entries: the runs did not compare against cp=1)")
        return 3
    print(f"RESULT summary {'PASS' if bad == 0 else 'FAIL'}")
    return 0 if bad == 0 else 1


def _timings(f):
    """{strategy: {phase: median over repeats of the slowest rank (ms)}} from /timings."""
    out = {}
    if "timings" not in f:
        return out

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            v = np.asarray(obj[()], dtype=np.float64)
            v = v.max(axis=0) if v.ndim == 2 else v  # [rank, repeat] -> slowest rank per repeat
            parts = name.split("/")
            strat, phase = (parts[0], "/".join(parts[1:])) if len(parts) > 1 else ("-", parts[0])
            out.setdefault(strat, {})[phase] = float(np.median(v)) if v.size else 0.0

    f["timings"].visititems(visit)
    return out


def _step_of(f, strat, phases):
    """The step (ms) as every command reads it: the median over repeats of the slowest rank's step
    (per repeat: its step phase, else its forward + backward), with the min and max over repeats."""
    reps = hcp_figures._step(f, strat)
    if reps is not None and reps.size:
        return float(np.median(reps)), float(reps.min()), float(reps.max())
    v = _step_ms(phases)
    return v, v, v


def _step_ms(phases):
    for key in ("step", "train/step"):
        if key in phases:
            return phases[key]
    if "forward" in phases and "backward" in phases:
        return phases["forward"] + phases["backward"]
    return sum(v for k, v in phases.items() if "/" not in k)


def _overlap(phases):
    """Fraction of the ring communication hidden behind compute: 1 - exposed / isolated (see
    drivers/overlap.hpp), from the slowest rank's medians; None when the strategy has no ring, NaN when
    the exposed time exceeds the isolated one (no fraction is known to be hidden)."""
    e, i = phases.get("ring_exposed"), phases.get("ring_isolated")
    if e is None or not i:
        return None
    return float("nan") if e > i else min(1.0, 1.0 - e / i)


def _attention_flops(cfg):
    """Forward + backward FLOPs of a cp_attention run's step (its whole problem): 4 H D per scored
    query-key pair forward (QK^T and PV), 2.5 times that backward; causal rows score the keys up to
    themselves. None for other drivers."""
    if cfg.get("driver") != "cp_attention":
        return None
    deck = hcp_figures.deck_of(cfg)
    a, data = deck.get("attention", {}), deck.get("data", {})
    if data.get("format") == "bshd":
        lens = [int(data.get("seqlen", 0))] * int(data.get("batch", 1))
    else:
        raw = data.get("seq_lens", [])
        lens = [int(x) for x in (raw if isinstance(raw, list) else str(raw).replace(",", " ").split())]
    causal = bool(a.get("causal", True))
    pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
    return 3.5 * 4 * pairs * int(a.get("heads", 0)) * int(a.get("head_dim", 0))


def _table_rows(files):
    """One dict per (file, strategy): file, cp, strategy, step_ms (median of the slowest rank), its
    min and max over repeats, real tokens per second of the whole CP group, attention TFLOP/s per
    rank (cp_attention runs), overlap and every phase (ms)."""
    rows = []
    for path in files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            tokens = hcp_figures.real_tokens(cfg)
            flops = _attention_flops(cfg)
            for strat, ph in sorted(_timings(f).items()):
                step, lo, hi = _step_of(f, strat, ph)
                rows.append({"file": path.split("/")[-1], "cp": int(cfg.get("cp_size", 0)), "strategy": strat,
                             "step_ms": step, "min_ms": lo, "max_ms": hi,
                             "tokens_per_s": tokens / (step * 1e-3) if step > 0 else float("nan"),
                             # per rank: the problem's FLOPs over the CP group's ranks and the step
                             "tflops_per_rank": flops / int(cfg.get("cp_size", 1)) / (step * 1e-3) / 1e12
                             if flops and step > 0 else float("nan"),
                             "overlap": _overlap(ph),
                             "phases": {k: v for k, v in sorted(ph.items()) if k not in ("step", "forward", "backward")}})
    return rows


def cmd_table(a):
    rows = _table_rows(a.files)
    if a.json:
        import json
        # JSON has no NaN: an overlap that is not known is null, as a strategy without a ring
        nan = lambda v: None if v is not None and np.isnan(v) else v  # noqa: E731
        json.dump([dict(r, overlap=nan(r["overlap"]), tokens_per_s=nan(r["tokens_per_s"]),
                        tflops_per_rank=nan(r["tflops_per_rank"])) for r in rows], sys.stdout, indent=1)
        print()
        return 0
    if a.csv:
        import csv
        phases = sorted({k for r in rows for k in r["phases"]})
        w = csv.writer(sys.stdout)
        w.writerow(["file", "cp", "strategy", "step_ms", "min_ms", "max_ms", "tokens_per_s", "tflops_per_rank", "overlap"]
                   + phases)
        for r in rows:
            w.writerow([r["file"], r["cp"], r["strategy"], f"{r['step_ms']:.6g}", f"{r['min_ms']:.6g}",
                        f"{r['max_ms']:.6g}", f"{r['tokens_per_s']:.6g}",
                        "" if np.isnan(r["tflops_per_rank"]) else f"{r['tflops_per_rank']:.6g}",
                        "" if r["overlap"] is None else f"{r['overlap']:.4f}"]
                       + ["" if k not in r["phases"] else f"{r['phases'][k]:.6g}" for k in phases])
        return 0
    print(f"# {'file':<40} {'cp':>3} {'strategy':<16} {'step_ms':>10} {'min..max':>19} {'tokens/s':>10} "
          f"{'TFLOP/s/rank':>12} {'overlap':>8}  phases (ms)")
    for r in rows:
        detail = " ".join(f"{k}={v:.2f}" for k, v in r["phases"].items())
        ovs = "-" if r["overlap"] is None else "n/a" if np.isnan(r["overlap"]) else f"{r['overlap']:.2f}"
        span = f"{r['min_ms']:.2f}..{r['max_ms']:.2f}"
        tf = "-" if np.isnan(r["tflops_per_rank"]) else f"{r['tflops_per_rank']:.4g}"
        print(f"  {r['file']:<40} {r['cp']:>3} {r['strategy']:<16} {r['step_ms']:10.2f} {span:>19} "
              f"{r['tokens_per_s']:10.4g} {tf:>12} {ovs:>8}  {detail}")
    return 0


# nccl-tests' bus-bandwidth factors: the bytes a rank sends per byte of the collective's size. The
# communicators count exactly the bus bytes (all_gather: count (n-1) per rank), so busbw is bytes
# sent over time and algbw that over the factor.
_BUS_FACTOR = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
               "all_to_all": lambda n: (n - 1) / n, "all_to_all_v": lambda n: (n - 1) / n,
               "all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0, "send": lambda n: 1.0}


def _comm_rows(files):
    """Per (file, strategy, operation): calls and MiB per rank and step (max over ranks), ms in the
    operation per step (the slowest rank) and nccl-tests-style algbw and busbw (GB/s) of that rank;
    ring exchanges overlap compute, so their wait is not a link time: no bandwidth for them."""
    rows = []
    for path in files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            n = int(cfg.get("cp_size", 1))
            for strat in sorted(f["comm"]) if "comm" in f else []:
                for op, g in sorted(f["comm"][strat].items()):
                    if op == "barrier" or not isinstance(g, h5py.Group):
                        continue
                    sent = np.asarray(g["bytes_sent"][()], dtype=np.float64)
                    sec = np.asarray(g["seconds"][()], dtype=np.float64)
                    calls = np.asarray(g["calls"][()], dtype=np.float64)
                    k = int(np.argmax(sec))
                    bus = sent[k] / sec[k] / 1e9 if sec[k] > 0 and op in _BUS_FACTOR and n > 1 else float("nan")
                    alg = bus / _BUS_FACTOR[op](n) if op in _BUS_FACTOR and n > 1 else float("nan")
                    rows.append({"file": path.split("/")[-1], "cp": n, "strategy": strat, "op": op,
                                 "calls": int(calls.max()), "mib": float(sent.max()) / 2**20, "ms": float(sec.max()) * 1e3,
                                 "algbw": alg, "busbw": bus})
    return rows


def cmd_comm(a):
    rows = _comm_rows(a.files)
    if not rows:
        print(f"error: {' '.join(a.files)}: no /comm counters", file=sys.stderr)
        return 1
    print(f"# {'file':<40} {'cp':>3} {'strategy':<16} {'operation':<15} {'calls':>6} {'MiB/rank':>10} {'ms':>9} "
          f"{'algbw GB/s':>10} {'busbw GB/s':>10}   per timed step; the slowest rank's time")
    for r in rows:
        bw = lambda v: "-" if np.isnan(v) else f"{v:.3f}"  # noqa: E731
        print(f"  {r['file']:<40} {r['cp']:>3} {r['strategy']:<16} {r['op']:<15} {r['calls']:>6} {r['mib']:10.3f} "
              f"{r['ms']:9.3f} {bw(r['algbw']):>10} {bw(r['busbw']):>10}")
    return 0


def _scale_rows(files):
    """One dict per (file, strategy): driver, tokens, cp, step_ms, memory per rank and its model
    (MiB, max over ranks), MiB sent per rank and step (max over ranks) and the check's verdict."""
    rows = []
    for path in files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            deck = hcp_figures.deck_of(cfg)
            check = str(deck.get("run", {}).get("check", "-"))
            order = cfg.get("strategy", "").split(",")
            timings = _timings(f)
            tokens = hcp_figures.real_tokens(cfg)
            for strat in sorted(timings, key=lambda n: order.index(n) if n in order else len(order)):
                mem = f.get(f"memory/{strat}")
                if mem is None or "step_tensor_bytes" not in mem:
                    continue
                held = (mem["step_tensor_bytes"][()] + mem["live_tensor_bytes"][()]).max() / 2**20
                model = mem["model_bytes"][()].max() / 2**20 if "model_bytes" in mem else float("nan")
                sent = 0
                if f"comm/{strat}" in f:
                    per_rank = sum(np.asarray(g["bytes_sent"][()], dtype=np.float64) for g in f[f"comm/{strat}"].values())
                    sent = float(np.max(per_rank)) / 2**20
                verdict = "-"
                if f"summary/{strat}" in f:
                    entries = []
                    f[f"summary/{strat}"].visititems(lambda n, o: entries.append(o) if "pass" in o.attrs else None)
                    worst = max((float(o.attrs["max_rel"]) for o in entries), default=0.0)
                    ok = all(bool(o.attrs["pass"]) for o in entries)
                    verdict = f"{check} {'pass' if ok else 'FAIL'} {worst:.1e}"
                elif check == "cross" and order and strat == order[0]:
                    verdict = "cross baseline"
                rows.append({"file": path.split("/")[-1], "driver": cfg.get("driver", "?"), "tokens": tokens,
                             "dtype": cfg.get("dtype", "?"), "cp": int(cfg.get("cp_size", 0)), "strategy": strat,
                             "layout": str(cfg.get("partition", "-")),
                             "step_ms": _step_of(f, strat, timings[strat])[0], "mem_mib": float(held), "model_mib": float(model),
                             "sent_mib": sent, "check": verdict})
    for r in rows:  # memory x cp against the same driver, tokens and dtype at cp=1 (any strategy: the
        # same computation), else against the same strategy at the fewest ranks
        same = [b for b in rows if (b["driver"], b["tokens"], b["dtype"]) == (r["driver"], r["tokens"], r["dtype"])]
        base = next((b for b in same if b["cp"] == 1), None) or \
            min((b for b in same if (b["strategy"], b["layout"]) == (r["strategy"], r["layout"])), key=lambda b: b["cp"])
        r["mem_vs_ideal"] = r["mem_mib"] * r["cp"] / (base["mem_mib"] * base["cp"])
    return rows


def cmd_scale(a):
    rows = _scale_rows(a.files)
    cols = ["driver", "tokens", "dtype", "cp", "strategy", "layout", "step_ms", "mem_mib", "model_mib", "mem_vs_ideal", "sent_mib", "check"]
    if a.csv:
        import csv
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        for r in rows:
            w.writerow([f"{r[c]:.6g}" if isinstance(r[c], float) else r[c] for c in cols])
        return 0
    print(f"# {'driver':<13} {'tokens':>7} {'dtype':<5} {'cp':>3} {'strategy':<16} {'layout':<9} {'step_ms':>10} {'MiB/rank':>9} "
          f"{'model':>8} {'x cp/base':>9} {'MiB sent/rank':>13}  check")
    for r in rows:
        print(f"  {r['driver']:<13} {r['tokens']:>7} {r['dtype']:<5} {r['cp']:>3} {r['strategy']:<16} {r['layout']:<9} {r['step_ms']:10.1f} "
              f"{r['mem_mib']:9.1f} {r['model_mib']:8.1f} {r['mem_vs_ideal']:9.2f} {r['sent_mib']:13.2f}  {r['check']}")
    return 0


_plt = hcp_figures.pyplot


def plot_against_cp(series, out, title, ylabel, ylog=False):
    """One line per label of `series` ({label: [(cp, y), ...]}) against the CP size (log2 axis)."""
    hcp_figures.figure({k: {"pts": [(c, y, y, y) for c, y in v]} for k, v in series.items()}, out, title, ylabel, ylog)


def _titled(title, files):
    """A figure's title naming the problem its files share (driver, pattern, dtype, tokens), unless
    it does already (study titles do); the problems' count where they differ."""
    groups = study_groups(files)
    label = group_label(next(iter(groups))) if len(groups) == 1 else f"{len(groups)} problems"
    return title if label in title else f"{title}, {label}" if title else label


def _figure_cmd(fn, what, a):
    lines = fn(a.files, a.out, _titled(a.title, a.files))
    if not lines:
        print(f"error: {' '.join(a.files)}: no {what} in the given files", file=sys.stderr)
        return 1
    print(f"wrote {a.out} ({sum(len(v['pts']) for v in lines.values())} points, {len(lines)} strategies)")
    return 0


def cmd_plot_scaling(a):
    return _figure_cmd(hcp_figures.plot_time, "/timings", a)


def cmd_plot_memory(a):
    return _figure_cmd(hcp_figures.plot_memory, "/memory", a)


def cmd_plot_bytes(a):
    return _figure_cmd(hcp_figures.plot_bytes, "/comm", a)


# Block kinds of model.pattern and the model's ends, as the breakdown names them.
_PHASE_NAMES = {"M": "Mamba2", "*": "attention", "E": "MoE", "-": "MLP", "embed": "embedding", "head": "head"}


def _phase_label(key):
    """'fwd/M' -> 'Mamba2 fwd'; keys of no known block kind keep their name."""
    d, _, k = key.partition("/")
    return f"{_PHASE_NAMES[k]} {d}" if k in _PHASE_NAMES else key


def _breakdown(f, strat):
    """(step ms, {phase label: ms}) of one strategy, every number from one timed step: the repeat
    whose slowest-rank step is the median, on that slowest rank. Phases of that rank and repeat are
    parts of that step, so "other" (the step less their sum: communication outside the blocks, glue,
    launch gaps) is what the bar does not name. Block phases (cp_hybrid, train_hybrid) where the run
    timed blocks; else compute and communication wait (cp_attention, cp_mamba). None without them."""
    g = f.get(f"timings/{strat}")
    if not isinstance(g, h5py.Group):
        return None
    arrays = {}
    g.visititems(lambda n, o: arrays.__setitem__(n, np.atleast_2d(np.asarray(o[()], dtype=np.float64)))
                 if isinstance(o, h5py.Dataset) else None)
    step = next((arrays[k] for k in ("step", "train/step") if k in arrays), None)
    if step is None and "forward" in arrays and "backward" in arrays:
        step = arrays["forward"] + arrays["backward"]
    blocks = {k: v for k, v in arrays.items() if "/" in k and k != "train/step"}
    split = {k: arrays[k] for k in ("compute", "comm_wait") if k in arrays}
    parts = blocks or split
    if step is None or not parts or step.size == 0:
        return None
    slowest = step.max(axis=0)
    r = int(np.argsort(slowest)[(len(slowest) - 1) // 2])  # the (lower) median repeat
    k = int(np.argmax(step[:, r]))
    names = {"compute": "compute", "comm_wait": "communication wait"}
    return float(step[k, r]), {names.get(n, _phase_label(n)): float(v[k, r]) for n, v in parts.items()}


def cmd_plot_breakdown(a):
    """Per (file, strategy) a stacked bar of the phases of one timed step (_breakdown: the median
    repeat's slowest rank), plus "other", so that a bar is as tall as that step."""
    bars = {}
    layouts = set()
    for path in a.files:
        with h5py.File(path, "r") as f:
            layouts.add(str(_config(f).get("partition", "")))
    for path in a.files:
        with h5py.File(path, "r") as f:
            cfg = _config(f)
            cp, dtype = int(cfg.get("cp_size", 1)), cfg.get("dtype", "")
            if len(layouts) > 1:  # dcs and documents runs of one strategy and cp are two bars
                dtype += f" {cfg.get('partition', '-')}"
            for s_ in sorted(f["timings"]) if "timings" in f else []:
                got = _breakdown(f, s_)
                if got is None:
                    continue
                step, parts = got
                parts["other"] = max(0.0, step - sum(parts.values()))
                bars[s_ if len(a.files) == 1 else f"{s_}\ncp={cp} {dtype}"] = (cp, s_, parts)
    if not bars:
        print(f"error: {' '.join(a.files)}: no per-phase timings (block phases, or compute and comm_wait)",
              file=sys.stderr)
        return 1
    plt = _plt()
    names = sorted(bars, key=lambda n: (bars[n][0], bars[n][1]))
    phases = sorted({k for (_, _, ph) in bars.values() for k in ph} - {"other"}) + ["other"]
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(names) + 3.5), 4.2))
    bottom = np.zeros(len(names))
    colors = list(plt.cm.tab20(np.linspace(0, 1, max(len(phases) - 1, 2))))[: len(phases) - 1] + ["lightgrey"]
    for k, c in zip(phases, colors):
        vals = np.array([bars[n][2].get(k, 0.0) for n in names])
        ax.bar(names, vals, bottom=bottom, label=k, color=c, hatch="//" if k == "other" else None)
        bottom += vals
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("ms in one step\n(the median repeat's slowest rank)")
    title = _titled(a.title or "time per phase", a.files)
    ax.set_title(textwrap.fill(title, 60), fontsize=11 if len(title) <= 60 else 10)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out} ({len(names)} strategies, {len(phases)} phases)")
    return 0


def cmd_plot_errors(a):
    """Worst error against cp=1 of each (file, strategy), on a log axis beside its tolerance."""
    bars = []
    for path in a.files:
        with h5py.File(path, "r") as f:
            cp = int(_config(f).get("cp_size", 1))
            if "summary" not in f:
                continue
            for strat in sorted(f["summary"]):
                g = f["summary"][strat]
                if not isinstance(g, h5py.Group):
                    continue
                vals = [(float(o.attrs["max_rel"]), float(o.attrs["tolerance"])) for o in g.values() if "max_rel" in o.attrs]
                if vals:
                    bars.append((cp, f"{strat}\ncp={cp} {_config(f).get('dtype', '')}", max(v for v, _ in vals),
                                 max(t for _, t in vals)))
    if not bars:
        print(f"error: {' '.join(a.files)}: no /summary entries (the runs did not compare against cp=1)", file=sys.stderr)
        return 1
    bars.sort()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 0.95 * len(bars) + 2), 4))
    names = [label for _, label, _, _ in bars]
    ax.tick_params(axis="x", labelsize=8)
    # A zero error (cp=1 against itself, or bit-equal strategies) has no place on a log axis: such
    # bars stand at a floor two decades below the smallest error or tolerance, marked "0".
    positive = [b[2] for b in bars if b[2] > 0] + [b[3] for b in bars if b[3] > 0]
    floor = 10.0 ** (np.floor(np.log10(min(positive))) - 2) if positive else 1e-20
    heights = [b[2] if b[2] > 0 else floor for b in bars]
    rects = ax.bar(names, heights, color=["tab:green" if b[2] <= b[3] else "tab:red" for b in bars])
    for r, b in zip(rects, bars):
        if b[2] == 0:
            r.set_hatch("//")
            r.set_alpha(0.5)
            ax.annotate("0", (r.get_x() + r.get_width() / 2, floor), ha="center", va="bottom")
    ax.plot(names, [b[3] for b in bars], "k_", markersize=30, label="tolerance")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 2)
    ax.set_ylabel("worst relative error\n(vs cp=1; cross: vs the first strategy)")
    ax.set_title(textwrap.fill(_titled(a.title, a.files), 64), fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out} ({len(bars)} runs, {sum(b[2] > b[3] for b in bars)} beyond tolerance, "
          f"{sum(b[2] == 0 for b in bars)} exact; log axis from {floor / 2:.0e})")
    return 0


def cmd_study(a):
    """Every finished results file of a study directory: table, CSV, plots and the error summary."""
    if not os.path.isdir(a.dir):
        print(f"error: study: '{a.dir}' is not a directory", file=sys.stderr)
        return 2
    names = sorted(n for n in os.listdir(a.dir) if n.endswith(".h5") and ".tmp-" not in n)
    unfinished = sorted(n for n in os.listdir(a.dir) if ".h5.tmp-" in n)
    if not names:
        print(f"error: study: no finished *.h5 results file in '{a.dir}'", file=sys.stderr)
        return 2
    files = [os.path.join(a.dir, n) for n in names]
    for path in files:
        why = unusable(path)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
    # A study is CP runs: another driver's file in the folder (bench_kernels, a checkpoint) is left
    # out by name, not tabulated as "cp 0".
    others = []
    for path in files:
        with h5py.File(path, "r") as f:
            drv = _config(f).get("driver", "") if "config" in f else ""
        if drv not in ("cp_attention", "cp_mamba", "cp_hybrid", "train_hybrid"):
            others.append(f"{os.path.basename(path)} ({drv or 'no /config/driver'})")
    files = [p for p in files if not any(o.startswith(os.path.basename(p) + " ") for o in others)]
    if not files:
        print(f"error: study: no CP run among the results files in '{a.dir}' ({', '.join(others)})", file=sys.stderr)
        return 2
    title = a.title or os.path.basename(os.path.normpath(a.dir))
    print(f"# study {a.dir}: {len(files)} files" + (f" ({len(unfinished)} unfinished, left out)" if unfinished else ""))
    if others:
        print(f"# left out, not CP runs: {', '.join(others)}")
    if unfinished:
        print(f"# left out, unfinished: {', '.join(unfinished)}")
    groups = study_groups(files)
    if len(groups) == 1:  # the title names the problem: driver, pattern, dtype and tokens
        key, members = next(iter(groups.items()))
        return study_group(members, a.dir, f"{title}, {group_label(key)}", "")
    # Runs of different problems do not share a scaling line: one table and set of figures each,
    # their files suffixed by the group's number.
    codes = []
    for i, (key, members) in enumerate(sorted(groups.items()), start=1):
        print(f"\n# group {i}: {group_label(key)}: {len(members)} files (figures *-{i}.png, timings-{i}.csv)")
        codes.append(study_group(members, a.dir, f"{title}, {group_label(key)}", f"-{i}"))
    return next((c for c in (2, 1, 3) if c in codes), 0)  # damaged, then failed, then unchecked


def _model_key(cfg):
    """The model of a run: its resolved deck without the sections a scaling study varies."""
    deck = hcp_figures.deck_of(cfg)
    return repr(sorted((k, repr(v)) for k, v in deck.items() if k not in ("data", "parallel", "run")))


def study_groups(files):
    """{(driver, pattern, model, dtype, tokens, per_rank): [files]}: the runs of one problem. A
    strong study has one token count; a weak one keeps tokens per rank (tokens = per_rank x cp), and
    is one group when each token count is at one CP size and the tokens per rank agree."""
    by = {}
    for path in files:
        with h5py.File(path, "r") as f:
            c = _config(f)
        cp, tokens = int(c.get("cp_size", 1)), hcp_figures.real_tokens(c)
        key = (c.get("driver", "?"), c.get("pattern", "?"), _model_key(c), c.get("dtype", "?"))
        by.setdefault(key, []).append((path, cp, tokens))
    groups = {}
    for key, runs in by.items():
        cps_of = {}
        for _, cp, tokens in runs:
            cps_of.setdefault(tokens, set()).add(cp)
        per_rank = {tokens // cp for _, cp, tokens in runs if cp > 0}
        weak = len(cps_of) > 1 and all(len(v) == 1 for v in cps_of.values()) and len(per_rank) == 1 and \
            all(tokens % cp == 0 for _, cp, tokens in runs)
        for path, cp, tokens in runs:
            g = key + ((next(iter(per_rank)), True) if weak else (tokens, False))
            groups.setdefault(g, []).append(path)
    return groups


def group_label(key):
    driver, pattern, _, dtype, tokens, weak = key
    return f"{driver} {'' if pattern == '?' else pattern + ' '}{dtype}, " + (f"{tokens} tokens per rank" if weak else f"{tokens} tokens")


def study_group(files, folder, title, suffix):
    """Table, CSV, figures and the error summary of the runs of one problem."""
    # Ranks beyond a node's cores share them: those runs' times are not a scaling measurement.
    over = []
    for path in files:
        with h5py.File(path, "r") as f:
            c = _config(f)
        rpn, cores = int(c.get("ranks_per_node", 0)), int(c.get("node_cores", 0))
        if rpn and cores and rpn > cores:
            over.append(f"{os.path.basename(path)} ({rpn} ranks on {cores} cores)")
    if over:
        print(f"# warning: oversubscribed runs, their times measure core sharing, not CP: {', '.join(over)}")
        title += " (oversubscribed runs)"
    cmd_table(argparse.Namespace(files=files, csv=False, json=False))
    if _comm_rows(files):
        cmd_comm(argparse.Namespace(files=files))
    csv_path = os.path.join(folder, f"timings{suffix}.csv")
    saved = sys.stdout
    with open(csv_path, "w") as out:
        sys.stdout = out
        try:
            cmd_table(argparse.Namespace(files=files, csv=True, json=False))
        finally:
            sys.stdout = saved
    print(f"wrote {csv_path}")
    png = lambda name: os.path.join(folder, f"{name}{suffix}.png")  # noqa: E731
    cmd_plot_scaling(argparse.Namespace(files=files, out=png("scaling"), title=f"{title}: time per step"))
    for fn, name, what in ((cmd_plot_memory, "memory", "memory per rank"), (cmd_plot_bytes, "bytes", "bytes sent per rank")):
        if fn(argparse.Namespace(files=files, out=png(name), title=f"{title}: {what}")) != 0:
            print(f"# no {what} in these files: no {name}{suffix}.png")

    def phased(path):
        with h5py.File(path, "r") as f:
            return any(_breakdown(f, s_) for s_ in (f["timings"] if "timings" in f else []))

    if any(phased(p) for p in files):
        cmd_plot_breakdown(argparse.Namespace(files=files, out=png("breakdown"), title=f"{title}: time per phase"))
    else:
        print("# no per-phase timings in these files: no breakdown plot")

    def checked(path):
        with h5py.File(path, "r") as f:
            return "summary" in f

    if any(checked(p) for p in files):
        cmd_plot_errors(argparse.Namespace(files=files, out=png("errors"), title=f"{title}: errors against cp=1"))
    return cmd_summary(argparse.Namespace(files=files, brief=True))


def cmd_loss(a):
    with h5py.File(a.file, "r") as f:
        if "train/loss" not in f:
            print(f"error: {a.file} has no /train/loss (not a train_hybrid file)", file=sys.stderr)
            return 2
        loss = np.asarray(f["train/loss"][()])
        ref = np.asarray(f["train/loss_reference"][()]) if "train/loss_reference" in f else None
    other = None
    if a.against:
        with h5py.File(a.against, "r") as g:
            if "train/loss" not in g:
                print(f"error: --against {a.against} has no /train/loss (not a train_hybrid file)", file=sys.stderr)
                return 2
            other = np.asarray(g["train/loss"][()])
        if len(other) != len(loss):
            print(f"error: --against {a.against} has {len(other)} steps, {a.file} has {len(loss)}", file=sys.stderr)
            return 2
    with h5py.File(a.file, "r") as f:
        cfg = _config(f)
    plt = _plt()
    # Below the curves, what they hide: the CP run's loss less the cp=1 replica's (and the --against
    # run's), relative, per step; an exact match is a line at zero.
    compared = [(ref, "cp=1 replica", "--")] if ref is not None and len(ref) else []
    if other is not None:
        compared.append((other, os.path.basename(a.against), ":"))
    if compared:
        fig, (ax, rx) = plt.subplots(2, 1, figsize=(6.5, 5.4), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    else:
        fig, ax = plt.subplots(figsize=(6.5, 4))
    steps = np.arange(1, len(loss) + 1)
    ax.plot(steps, loss, label="CP run")
    for curve, label, style in compared:
        ax.plot(steps[-len(curve):], curve, style, label=label)
    ax.set_ylabel("loss (nats / label token)")
    ax.legend()
    ax.set_title(a.title or f"{cfg.get('driver', 'train_hybrid')} loss: cp {cfg.get('cp_size', '?')}, "
                 f"{cfg.get('pattern', '')} {cfg.get('dtype', '')}, {len(loss)} steps", fontsize=10)
    if compared:
        for curve, label, style in compared:
            mine = loss[-len(curve):]
            rx.plot(steps[-len(curve):], (mine - curve) / np.maximum(np.abs(curve), 1e-300), style, marker=".",
                    label=f"vs {label}")
        rx.axhline(0.0, color="k", lw=0.6)
        rx.set_ylabel("(CP - other) / other")
        rx.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        rx.legend(fontsize=7)
        rx.set_xlabel("step")
    else:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    k = max(1, len(loss) // 5)
    first, last = float(np.mean(loss[:k])), float(np.mean(loss[-k:]))
    print(f"loss {first:.4f} (first {k} steps) -> {last:.4f} (last {k}); wrote {a.out}")
    if a.min_drop > 0 and first - last < a.min_drop:
        print(f"RESULT loss FAIL: fell by {first - last:.4f} < {a.min_drop}")
        return 1
    if other is not None:
        # NaN anywhere is a departure, never within the band.
        dev = np.abs(loss - other) / np.maximum(np.abs(other), 1e-300)
        worst = float(np.max(np.where(np.isfinite(dev), dev, np.inf)))
        print(f"max |loss - against| / against = {worst:.2e} over {len(loss)} steps (band {a.band:g})")
        if not worst <= a.band:
            print(f"RESULT loss FAIL: departs from {a.against} beyond the band")
            return 1
    print("RESULT loss PASS")
    return 0


def cmd_anchors(a):
    import json
    anc = json.load(open(a.anchors))
    f = h5py.File(a.file, "r")

    def ours(op):
        t = f.get("/timings/" + op)
        return None if t is None else float(np.median(np.max(np.asarray(t), axis=0) if np.asarray(t).ndim == 2 else t))

    def meta(op):
        b = f.get("/bench/" + op)
        return (0.0, 0.0, 0.0) if b is None else tuple(float(x) for x in np.asarray(b))

    def anchor(key):
        v = anc.get(key, {})
        return v.get("median_ms")

    rows = []
    for op in sorted(k for k in f["/timings"].keys()):
        fl, by, scratch = meta(op)
        t = ours(op)
        if op.startswith("attention_fwd"):
            tag = op[len("attention_fwd"):]
            for be in ("sdpa_flash", "sdpa_cudnn"):
                rows.append((op, t, f"{be} fwd", anchor(f"attention_fwd{tag}/{be}"), fl / t / 1e9, "TFLOP/s"))
                fb = anchor(f"attention_fwdbwd{tag}/{be}")
                # The backward as the layers run it, and each kernel form bench.variant timed beside it.
                forms = [""] + sorted(o[len("attention_bwd" + tag):] for o in f["/timings"].keys()
                                      if o.startswith("attention_bwd" + tag + "."))
                for form in forms:
                    tb = ours("attention_bwd" + tag + form)
                    if tb is not None and fb is not None:
                        rows.append(("attention_fwd+bwd" + tag + form, t + tb, f"{be} fwd+bwd", fb,
                                     3.5 * fl / (t + tb) / 1e9, "TFLOP/s"))
        elif op == "ssd_fwd":
            rows.append((op, t, "mamba_ssm triton fwd", anchor("ssd_fwd/mamba_ssm_triton"), by / t / 1e6, "GB/s"))
            tb = ours("ssd_bwd")
            if tb is not None:
                rows.append(("ssd_fwd+bwd", t + tb, "mamba_ssm triton fwd+bwd", anchor("ssd_fwdbwd/mamba_ssm_triton"), None, ""))
        elif op.startswith("ssd_init_state_"):
            # State passing's initial-state term beside the whole SSD of the same shape and direction.
            whole = "ssd_" + op[len("ssd_init_state_"):]
            rows.append((op, t, f"{whole} (ours, same shape)", ours(whole), fl / t / 1e9, "TFLOP/s"))
        elif op == "grouped_gemm":
            rows.append((op, t, "dense cuBLAS same FLOPs (ours)", ours("dense_gemm_same_flops"), fl / t / 1e9, "TFLOP/s"))
            rows.append((op, t, "torch.matmul same FLOPs", anchor("dense_gemm_same_flops/torch_matmul"), fl / t / 1e9, "TFLOP/s"))
        elif fl == 0 and by > 0 and op not in ("ssd_bwd", "device_copy"):
            copy_t = ours("device_copy")
            copy_bw = meta("device_copy")[1] / copy_t / 1e6 if copy_t else None
            bw = by / t / 1e6
            rows.append((op, t, "device copy ceiling", None, bw, f"GB/s ({bw / copy_bw:.0%} of copy {copy_bw:.0f})" if copy_bw else "GB/s"))
    print(f"# device: {anc.get('_device', '?')}, torch {anc.get('_torch', '?')}; ratio = anchor time / our time")
    print(f"{'op':52s} {'ours_ms':>10s} {'anchor':32s} {'anchor_ms':>10s} {'ratio':>8s}  throughput")
    for op, t, name, at, thr, unit in rows:
        r = f"{at / t:8.3f}" if (at and t) else f"{'-':>8s}"
        print(f"{op:52s} {t:10.3f} {name:32s} {(f'{at:10.3f}' if at else f'{chr(45):>10s}')} {r}  "
              + (f"{thr:.1f} {unit}" if thr is not None else ""))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    D = argparse.ArgumentDefaultsHelpFormatter
    c = sub.add_parser("compare", formatter_class=D, help="tensor by tensor: A against B")
    c.add_argument("a", help="results file compared")
    c.add_argument("b", help="results file compared with (its largest magnitude scales rtol)")
    c.add_argument("--rtol", type=float, default=1e-10, help="relative tolerance (of max |B|)")
    c.add_argument("--atol", type=float, default=0.0, help="absolute tolerance")
    c.add_argument("--prefix", nargs="+", default=["/activations", "/gradients", "/params", "/train/loss"],
                   help="the groups compared")
    c.add_argument("--pair", nargs=2, metavar=("PA", "PB"), help="compare A's datasets under PA with B's under PB")
    c.set_defaults(fn=cmd_compare)
    s = sub.add_parser("summary", formatter_class=D, help="errors against cp=1 with pass/fail")
    s.add_argument("--brief", action="store_true", help="one line per strategy: the worst error")
    s.add_argument("files", nargs="+", help="results files")
    s.set_defaults(fn=cmd_summary)
    t = sub.add_parser("table", formatter_class=D, help="timings per file, strategy and phase")
    fmt = t.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV on stdout: one row per file and strategy, a column per phase")
    fmt.add_argument("--json", action="store_true", help="JSON on stdout: a list of rows with their phases")
    t.add_argument("files", nargs="+", help="results files")
    t.set_defaults(fn=cmd_table)
    cm = sub.add_parser("comm", formatter_class=D,
                        help="per collective: calls, MiB and ms per step, algbw and busbw as nccl-tests defines them")
    cm.add_argument("files", nargs="+")
    cm.set_defaults(fn=cmd_comm)
    sc = sub.add_parser("scale", formatter_class=D, help="what CP trades: time, memory and bytes per rank")
    sc.add_argument("--csv", action="store_true", help="CSV on stdout instead of the table")
    sc.add_argument("files", nargs="+", help="results files")
    sc.set_defaults(fn=cmd_scale)
    for name, fn, title, what in (("plot-scaling", cmd_plot_scaling, "CP scaling: time per step", "time per step"),
                                  ("plot-memory", cmd_plot_memory, "CP scaling: memory per rank", "tensor memory per rank"),
                                  ("plot-bytes", cmd_plot_bytes, "CP scaling: bytes sent per rank", "bytes sent per rank")):
        ps = sub.add_parser(name, formatter_class=D, help=f"{what} against the CP size, one line per strategy")
        ps.add_argument("--out", required=True, help="the PNG to write")
        ps.add_argument("--title", default=title, help="figure title")
        ps.add_argument("files", nargs="+", help="results files (any CP sizes and strategies)")
        ps.set_defaults(fn=fn)
    pb = sub.add_parser("plot-breakdown", formatter_class=D, help="stacked time per phase, per strategy and cp")
    pb.add_argument("--out", required=True, help="the PNG to write")
    pb.add_argument("--title", default="", help="figure title")
    pb.add_argument("files", nargs="+", help="results files")
    pb.set_defaults(fn=cmd_plot_breakdown)
    pe = sub.add_parser("plot-errors", formatter_class=D, help="worst error against cp=1 per strategy and cp")
    pe.add_argument("--out", required=True, help="the PNG to write")
    pe.add_argument("--title", default="errors against cp=1", help="figure title")
    pe.add_argument("files", nargs="+", help="results files")
    pe.set_defaults(fn=cmd_plot_errors)
    st = sub.add_parser("study", formatter_class=D, help="a study folder in one command: tables, CSV, figures, errors")
    st.add_argument("--title", default="", help="figure titles' prefix (empty: the folder's name)")
    st.add_argument("dir", help="folder of results files (e.g. a Slurm job's HCP_OUTDIR)")
    st.set_defaults(fn=cmd_study)
    pl = sub.add_parser("loss", formatter_class=D, help="training loss curve(s) of a train_hybrid file")
    pl.add_argument("--out", required=True, help="the PNG to write")
    pl.add_argument("--min-drop", type=float, default=0.0, help="exit 1 unless the loss fell by this fraction")
    pl.add_argument("--against", help="another train_hybrid file of the same steps (e.g. the fp32 run of a bf16 run)")
    pl.add_argument("--title", default="", help="figure title (default: driver, cp, pattern, dtype and steps)")
    pl.add_argument("--band", type=float, default=0.05, help="largest relative loss difference per step with --against")
    pl.add_argument("file", help="train_hybrid results file")
    pl.set_defaults(fn=cmd_loss)
    pa = sub.add_parser("anchors", formatter_class=D, help="bench_kernels against the anchors of the same run")
    pa.add_argument("--anchors", required=True, help="JSON written by jobs/bench/anchors.py")
    pa.add_argument("file", help="bench_kernels results file")
    pa.set_defaults(fn=cmd_anchors)
    a = p.parse_args(argv)
    for path in [getattr(a, k) for k in ("a", "b", "file") if hasattr(a, k)] + list(getattr(a, "files", [])):
        why = unusable(path)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
    try:
        return a.fn(a)
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `| head`): not a damaged file. Quiet, and no second
        # error when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (KeyError, OSError, ValueError, TypeError, IndexError) as e:
        # A file that opens but whose groups or attributes are not what a driver writes: one line, exit 2
        # (exit 1 means "compared, and a check failed").
        print(f"error: {a.cmd}: a results file is damaged or not from a hybridcp driver: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
