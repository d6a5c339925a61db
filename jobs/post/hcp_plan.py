#!/usr/bin/python3
"""Cost model of hybridcp's CP strategies: bytes per rank (the drivers' own byte models, read from
their --dry-run BYTES line), an alpha-beta time for each collective and kernel rates for compute.

  hcp_plan.py bytes F.h5 ...      the drivers' byte models at each run's deck and ranks against its
      /comm counters (cp_attention / cp_mamba files); exit 1 unless every rank of every strategy matches
  hcp_plan.py rates BENCH.h5      the [compute] rates of a bench_kernels anchors file (attention,
      grouped GEMM, SSD), as a machine deck section; predict and sweep take it as --rates BENCH.h5
  hcp_plan.py predict --model DECK --machine DECK --tokens L --cp N
      per layer kind and strategy: bytes per rank, communication (exposed) and compute ms per
      forward+backward step; the best strategy of each kind and the step time of the model's pattern
  hcp_plan.py sweep --model DECK --machine DECK --tokens L1,L2,.. --cp N1,N2,.. --out P.png [--csv F]
      the best step time against cp for each L (one line per L), and which strategy each kind takes
  hcp_plan.py documents --model DECK --machine DECK --mix LENS.txt [--mix ..] --cp N1,N2,.. [--out P.png]
      packed documents (each LENS.txt a comma-separated list of lengths, jobs/bench/doc_lengths.py) by
      layout (data.partition = dcs, documents, groups): split documents by group size, pad tokens,
      bytes per rank, work max/mean, memory per rank and the step time, the heaviest rank's share
      of the compute (by the placement's work) plus each kind's exposed communication
  hcp_plan.py validate --machine DECK --calibrate C1.h5,C2.h5,.. [--band X] [--memory-band Y] F.h5 ...
      per-kind compute from a cp = 1 cp_hybrid run, alpha and beta fitted to the other calibration
      runs' counters, then each run's predicted step time against its measured one (BSHD runs);
      parameter bytes per rank (exact) and the step's memory per rank (scaled by the cp = 1 runs)

The model: a collective moving n bytes per rank over p ranks takes steps * alpha + n / beta, with the
intra-node (alpha, beta) while the CP group fits in a node and the inter-node pair beyond; ring p2p
overlaps its exchanges with the attention compute (exposed = max(0, comm - compute)). Compute:
attention FLOPs (causal, balanced by DualChunkSwap) at the attention rates, projections and experts
at the GEMM rate, the SSD at its state-update rate. MoE traffic assumes uniform routing. What the
model leaves out: kernel launch and glue time, memory traffic of the element-wise kernels, contention
between the CP group's links. Times are estimates. Bytes and memory per rank are not modelled here:
every command runs the driver's `--dry-run --ranks N` (--bin DIR, default build/drivers) and reads
its BYTES line (each strategy's byte model, the one the runs assert on every rank) and its MEMORY
line (drivers/memory_model.cpp, the one the admission check uses).
"""
import argparse
import math
import os
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hcp_figures  # noqa: E402  (the figures)
import hcp_post  # noqa: E402  (the results files' readers and plots)



# ---- bytes and memory per rank: the drivers' own models, read from --dry-run ---------------------
DEFAULT_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "drivers")


def driver_dry_run(bindir, deck_text, sets, ranks, driver="cp_hybrid"):
    """`driver --dry-run --ranks N` on a deck (TOML text) with --set overrides: its MEMORY line (the
    estimate per rank by part, the limit, whether it fits, the smallest power-of-two cp that does) as
    "memory", and its BYTES line (bytes per rank and step of every strategy of each layer kind, from
    the strategies' own models; drivers/byte_model.hpp) as "bytes"."""
    import json
    import subprocess
    import tempfile
    exe = os.path.join(bindir, driver)
    if not os.access(exe, os.X_OK):
        raise OSError(f"{exe}: no driver to ask for its models (build first, or give --bin DIR)")
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(deck_text)
        f.flush()
        cmd = [exe, "--deck", f.name, "--dry-run", "--ranks", str(ranks)]
        for kv in sets:
            cmd += ["--set", kv]
        out = subprocess.run(cmd, capture_output=True, text=True)
    got = {}
    for line in out.stdout.splitlines():
        for key in ("MEMORY", "BYTES"):
            if line.startswith(key + " "):
                got[key.lower()] = json.loads(line[len(key) + 1:])
    if "memory" not in got or ("bytes" not in got and driver != "train_hybrid"):  # train_hybrid: MEMORY only
        raise ValueError(f"{' '.join(cmd)}: no MEMORY and BYTES lines (exit {out.returncode}): "
                         f"{out.stderr.strip()[-500:]}")
    return got


def deck_driver(d):
    """The driver a deck (a dict from TOML) is written for, by its sections: train_hybrid ([train]),
    cp_hybrid ([model]), cp_attention (attention only), cp_mamba (Mamba only)."""
    if "train" in d:
        return "train_hybrid"
    if "model" in d or ("attention" in d and "mamba" in d):
        return "cp_hybrid"
    return "cp_attention" if "attention" in d else "cp_mamba" if "mamba" in d else "cp_hybrid"


def _toml(d):
    """A deck dict as TOML text (tables of scalars, strings and lists: what decks hold)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)
    return "".join(f"[{sec}]\n" + "".join(f"{k} = {val(v)}\n" for k, v in body.items()) + "\n"
                   for sec, body in d.items() if isinstance(body, dict))


def hybrid_deck_of_train(d):
    """The cp_hybrid deck of a train_hybrid deck's model (its byte model: train_hybrid prints none):
    the model sections, data.dtype and the strategies."""
    keep = {sec: dict(d[sec]) for sec in ("model", "mamba", "attention", "moe", "mlp") if sec in d}
    keep["data"] = {k: v for k, v in d.get("data", {}).items() if k == "dtype"}
    keep["parallel"] = {k: v for k, v in d.get("parallel", {}).items() if k in ("attention", "mamba_cp", "ep", "cp_inner")}
    return _toml(keep)


def driver_memory(bindir, deck_text, sets, ranks, driver="cp_hybrid"):
    return driver_dry_run(bindir, deck_text, sets, ranks, driver)["memory"]


def cp_inner(machine, cp):
    """a2a+p2p's inner (Ulysses) group: the CP ranks of one node."""
    return math.gcd(int(machine["network"]["gpus_per_node"]), cp)


def step_model(a, text, L, cp, inner):
    """The cp_hybrid step's memory and bytes per rank of the --model deck (its TOML text) at L tokens
    (one BSHD row) and CP size cp, a2a+p2p over inner groups of `inner`, on GPU ranks of
    --memory-gib GiB (run.device = cuda, run.check = off)."""
    d = tomllib.loads(text)
    driver = deck_driver(d)
    # EP over the CP group, or over the largest group that divides the experts (as plan() assumes)
    ep = d.get("parallel", {}).get("ep", 0) or cp
    experts = d.get("moe", {}).get("experts", 0)
    if experts and experts % ep:
        ep = math.gcd(experts, cp)
    sets = ["data.format=bshd", "run.device=cuda", f"run.memory_gib={a.memory_gib}", f"parallel.cp_size={cp}"]
    check = ["train.reference=false"] if driver == "train_hybrid" else ["run.check=off"]
    if driver != "cp_mamba":
        sets.append(f"parallel.cp_inner={inner}")
    if driver in ("cp_hybrid", "train_hybrid"):
        sets.append(f"parallel.ep={ep}")
    # The dry run applies the strategies' shape rules: ask it for a Mamba strategy that runs at cp
    # (hidden parallel splits the heads over the ranks; state passing runs at any cp).
    if cp > 1 and "mamba" in d and d["mamba"].get("heads", 64) % cp:
        sets.append("parallel.mamba_cp=state_passing")
    rows = [f"data.seqs_per_step=1", f"data.max_len={L}"] if driver == "train_hybrid" else \
        ["data.batch=1", f"data.seqlen={L}"]
    got = driver_dry_run(a.bin, text, sets + check + rows, cp, driver)
    if driver == "train_hybrid":  # the step's bytes by cp_hybrid's model of the same blocks
        got["bytes"] = driver_dry_run(a.bin, hybrid_deck_of_train(d),
                                      sets + ["run.check=off", "data.batch=1", f"data.seqlen={L}"], cp)["bytes"]
    return got


# ---- time ----------------------------------------------------------------------------------------
def link(machine, cp):
    n = machine["network"]
    if cp <= n["gpus_per_node"]:
        return n["intra_alpha_us"] * 1e-3, n["intra_gbps"] * 1e6  # ms, bytes per ms
    return n["inter_alpha_us"] * 1e-3, n["inter_gbps"] * 1e6


def comm_ms(machine, cp, nbytes, steps):
    a, b = link(machine, cp)
    return steps * a + nbytes / b


def attention_comm_ms(machine, cp, comp, per_rank, ring, msg):
    """Exposed communication (ms) of an attention strategy from its BYTES line: its exchanges over
    msg["group"] ranks (their link), then its K/V ring over msg["ring_ranks"] ranks, whose steps
    overlap the compute. `ring`: the ring's bytes per rank where the strategy has an exchange too
    (else a ring carries all its bytes)."""
    n = msg["ring_ranks"]
    if ring is None:
        ring = per_rank if n > 1 else [0] * len(per_rank)
    exchange = max(t - r for t, r in zip(per_rank, ring))
    t = comm_ms(machine, msg["group"], exchange, msg["exchange"]) if exchange or msg["exchange"] else 0.0
    if n > 1:
        t += max(0.0, comm_ms(machine, cp, max(ring), msg["ring"]) - comp * (n - 1) / n)
    return t


def layer_costs(kind, model, machine, L, cp, nb, B=1):
    """{strategy: (bytes per rank, comm ms exposed, compute ms)} for one layer of `kind`; `nb` is the
    BYTES line of the driver's dry run at this (L, cp) (the largest rank's bytes count)."""
    c, hid = machine["compute"], model["hidden"]
    tl = B * L / cp
    gemm = lambda flops: flops / (c["gemm_tflops"] * 1e9)  # ms
    lay, out = nb["layers"], {}
    if kind == "*":
        a = model["attention"]
        H, Hkv, D = a["heads"], a["kv_heads"], a["head_dim"]
        f = 4 * B * L * L / 2 * H * D / cp
        proj = gemm(3 * 2 * tl * hid * (2 * H + 2 * Hkv) * D)
        comp = f / (c["attn_fwd_tflops"] * 1e9) + 2.5 * f / (c["attn_bwd_tflops"] * 1e9) + proj
        for s, per_rank in lay.get("*", {}).items():
            msg = nb["messages"][s]
            if msg["two_level"] and not 1 < msg["group"] < cp:
                continue  # two levels need more than one node's ranks and more than one per node
            out[s] = (max(per_rank), attention_comm_ms(machine, cp, comp, per_rank, nb["ring"].get(s), msg), comp)
    elif kind == "M":
        m = model["mamba"]
        di, G, N = m["heads"] * m["head_dim"], m["n_groups"], m["d_state"]
        d_in_proj = 2 * di + 2 * G * N + m["heads"]
        comp = gemm(3 * 2 * tl * hid * (d_in_proj + di)) + 3 * tl * m["heads"] * m["head_dim"] * N / (c["ssd_gunits"] * 1e6)
        for s, per_rank in lay.get("M", {}).items():
            steps = nb.get("mamba_messages", {}).get(s, 0)  # by the strategy's record
            out[s] = (max(per_rank), comm_ms(machine, cp, max(per_rank), steps) if cp > 1 else 0.0, comp)
    elif kind == "E":
        e = model["moe"]
        comp = gemm(3 * 2 * tl * (e["topk"] * 2 * hid * e["ffn"] + 2 * hid * e.get("shared_ffn", 0)))
        b = max(lay.get("E", {}).get("ep", [0]))
        out["ep"] = (b, comm_ms(machine, cp, b, 4 * (cp - 1)) if cp > 1 else 0.0, comp)
    return out


def plan(model, machine, L, cp, nb):
    """Best strategy per layer kind, and the step time (ms) of the pattern with those choices."""
    best, step = {}, 0.0
    for kind in sorted(set(model["pattern"]) & {"*", "M", "E"}):
        # the dry run lists the strategies whose shape rules hold at cp
        costs = layer_costs(kind, model, machine, L, cp, nb)
        if not costs:
            return None, None
        s = min(costs, key=lambda k: costs[k][1] + costs[k][2])
        best[kind] = (s, costs[s])
        step += model["pattern"].count(kind) * (costs[s][1] + costs[s][2])
    return best, step


# ---- inputs --------------------------------------------------------------------------------------
def load_model(path):
    with open(path, "rb") as f:
        d = tomllib.load(f)
    return model_of(d)


def model_of(d):
    """The planner's view of a deck (a dict from TOML)."""
    m = d.get("model", {})
    driver = deck_driver(d)
    a = d.get("attention", {})
    pattern = {"cp_attention": "*", "cp_mamba": "M"}.get(driver, m.get("pattern", "M*E"))
    # a layer deck's width: the Mamba layer's hidden, or the attention heads' (no projections there)
    hidden = m.get("hidden", d.get("mamba", {}).get("hidden", a.get("heads", 32) * a.get("head_dim", 128)
                                                          if driver == "cp_attention" else 2688))
    return {"pattern": pattern, "hidden": hidden, "driver": driver,
            "vocab": m.get("vocab", 1024), "dtype": d.get("data", {}).get("dtype", "bf16"), "mamba": d.get("mamba", {}),
            "attention": d.get("attention", {}), "moe": d.get("moe", {}), "mlp_ffn": d.get("mlp", {}).get("ffn", 64),
            "ep": d.get("parallel", {}).get("ep", 0)}


def load_machine(path, rates=None):
    """A machine deck; with `rates` (a bench_kernels file) its [compute] section from that file."""
    with open(path, "rb") as f:
        m = tomllib.load(f)
    if rates:
        m["compute"] = {**m.get("compute", {}), **kernel_rates(rates)}
    return m


def kernel_rates(path):
    """The [compute] rates of a bench_kernels HDF5 file (bench.suite = anchors): attention forward and
    backward TFLOP/s at the largest head_dim timed, the grouped expert GEMM's TFLOP/s, and SSD state
    updates per second (b L H P N per call, forward + backward counted 3x as layer_costs does)."""
    import re

    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        med = {k: float(np.median(f["timings"][k][()])) for k in f["bench"] if k in f["timings"]}
        flops = {k: float(f["bench"][k][()][0]) for k in med}
        layout = {k: f["bench"][k].attrs.get("layout", b"") for k in med}
    layout = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in layout.items()}
    out = {}
    for d in ("fwd", "bwd"):
        cands = sorted((int(re.search(r"d(\d+)$", k).group(1)), k) for k in med if re.match(rf"attention_{d}_b\d+h\d+l\d+d\d+$", k))
        if cands:
            k = max(cands)[1]
            out[f"attn_{d}_tflops"] = round(flops[k] / med[k] / 1e9, 1)
    if "grouped_gemm" in med:
        out["gemm_tflops"] = round(flops["grouped_gemm"] / med["grouped_gemm"] / 1e9, 1)
    if "ssd_fwd" in med and "ssd_bwd" in med:
        v = {m.group(1): int(m.group(2)) for m in re.finditer(r"\b(b|L|H|P|N)=(\d+)", layout["ssd_fwd"])}
        if len(v) == 5:
            units = v["b"] * v["L"] * v["H"] * v["P"] * v["N"]
            out["ssd_gunits"] = round(3 * units / (med["ssd_fwd"] + med["ssd_bwd"]) / 1e6, 1)
    if not out:
        raise ValueError(f"{path}: no attention, grouped_gemm or ssd timings (a bench_kernels anchors file?)")
    return out


def cmd_rates(a):
    r = kernel_rates(a.file)
    print(f"# [compute] of {a.file} (medians of its timings)\n[compute]")
    for k, v in r.items():
        print(f"{k} = {v}")
    return 0


# ---- commands ------------------------------------------------------------------------------------
def file_byte_model(bindir, cfg):
    """{strategy: [bytes per rank and step]} of a cp_attention or cp_mamba run (its /config: the
    resolved deck, ranks and a2a+p2p's inner group), by the driver's own model (--dry-run BYTES):
    every operation but barriers and the parameter all-reduce. None for other drivers or cp != ranks."""
    drv, cp = cfg.get("driver"), int(cfg.get("cp_size", 0))
    if drv not in ("cp_attention", "cp_mamba") or cp != int(cfg.get("world_size", 0)):
        return None
    sets = ["run.check=off", "run.memory_gib=1e6", "run.device=host"]
    if drv == "cp_attention":
        sets.append(f"parallel.cp_inner={int(cfg.get('cp_inner', 1))}")
    model = driver_dry_run(bindir, cfg["deck_resolved"], sets, cp, drv)["bytes"]["layers"]
    return model["*" if drv == "cp_attention" else "M"]


def cmd_bytes(a):
    """Each rank's /comm bytes per step against the driver's own byte model at the run's deck and
    rank count (its --dry-run BYTES line): the planner reads the models it is checked against."""
    import h5py
    bad = checked = 0
    print(f"# {'file':<36} {'strategy':<16} {'rank':>4} {'measured':>12} {'predicted':>12}")
    for path in a.files:
        with h5py.File(path, "r") as f:
            cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
            drv, cp = cfg["driver"], int(cfg["cp_size"])
            model = file_byte_model(a.bin, cfg)
            if model is None:
                print(f"error: {path}: bytes checks cp_attention / cp_mamba runs with cp = ranks", file=sys.stderr)
                return 2
            for strat in f["comm"]:
                ops = f["comm"][strat]
                measured = [0.0] * cp
                for op in ops:
                    if op in ("barrier", "all_reduce"):  # the parameter all-reduce is checked apart
                        continue
                    for r, v in enumerate(ops[op]["bytes_sent"][()]):
                        measured[r] += v  # per timed step
                for r in range(cp):
                    want = model[strat][r] if strat in model else -1
                    ok = int(measured[r]) == want
                    checked += 1
                    bad += 0 if ok else 1
                    print(f"  {path.split('/')[-1]:<36} {strat:<16} {r:>4} {int(measured[r]):>12} {want:>12} {'' if ok else 'DIFFERS'}")
    print(f"RESULT plan_bytes {'EXACT' if bad == 0 and checked else 'DIFFERS'} {checked - bad}/{checked}")
    return 0 if bad == 0 and checked else 1


def mix_compute(model, machine, lens):
    """Forward+backward compute (ms) of one layer of each kind over a packed batch of documents of
    lengths `lens` on one GPU: causal attention pairs inside each document, the rest per token (as
    layer_costs counts them)."""
    c, hid, T = machine["compute"], model["hidden"], sum(lens)
    gemm = lambda flops: flops / (c["gemm_tflops"] * 1e9)  # ms
    a, m, e = model["attention"], model["mamba"], model["moe"]
    out = {}
    if a:
        H, Hkv, D = a["heads"], a["kv_heads"], a["head_dim"]
        f = 4 * sum(n * (n + 1) / 2 for n in lens) * H * D
        out["*"] = (f / (c["attn_fwd_tflops"] * 1e9) + 2.5 * f / (c["attn_bwd_tflops"] * 1e9)
                    + gemm(3 * 2 * T * hid * (2 * H + 2 * Hkv) * D))
    if m:
        di, G, N = m["heads"] * m["head_dim"], m["n_groups"], m["d_state"]
        out["M"] = (gemm(3 * 2 * T * hid * (2 * di + 2 * G * N + m["heads"] + di))
                    + 3 * T * m["heads"] * m["head_dim"] * N / (c["ssd_gunits"] * 1e6))
    if e:
        out["E"] = gemm(3 * 2 * T * (e["topk"] * 2 * hid * e["ffn"] + 2 * hid * e.get("shared_ffn", 0)))
    return out


def doc_step(model, machine, lens, cp, nb):
    """(step ms, {kind: (strategy, bytes per rank max, comm ms)}) of a packed batch placed as the dry
    run's BYTES line says: each kind's compute over the batch times the heaviest rank's share of the
    placement's work, plus its cheapest strategy's exposed communication (over the largest block a
    split document runs on: the link of that many ranks)."""
    pl = nb["placement"]
    share = max(pl["work"]) / sum(pl["work"])
    gmax = max([g for g in pl["group"] if g > 1], default=1)
    total = mix_compute(model, machine, lens)
    step, chosen = 0.0, {}
    for kind in sorted(set(model["pattern"]) & {"*", "M", "E"}):
        comp = total[kind] * share
        costs = {}
        for s, per_rank in nb["layers"].get(kind, {}).items():
            nbytes = max(per_rank)
            if kind == "*":
                msg = nb["messages"][s]
                if msg["two_level"] and not 1 < msg["group"] < cp:
                    continue
                t = attention_comm_ms(machine, gmax, comp, per_rank, nb["ring"].get(s), msg) if nbytes else 0.0
            elif kind == "M":
                t = comm_ms(machine, gmax, nbytes, nb.get("mamba_messages", {}).get(s, 0)) if nbytes else 0.0
            else:
                t = comm_ms(machine, cp, nbytes, 4 * (cp - 1)) if cp > 1 else 0.0
            costs[s] = (nbytes, t)
        if not costs:
            return None, None
        s = min(costs, key=lambda k: costs[k][1])
        chosen[kind] = (s, costs[s][0], costs[s][1])
        step += model["pattern"].count(kind) * (comp + costs[s][1])
    return step, chosen


def split_over(group):
    """The split documents by the ranks each runs over: "2x4 1x8" (two over 4 ranks, one over 8)."""
    g = [int(x) for x in group if int(x) > 1]
    return " ".join(f"{g.count(n)}x{n}" for n in sorted(set(g))) or "none"


def cmd_documents(a):
    model, machine = load_model(a.model), load_machine(a.machine, a.rates)
    with open(a.model) as f:
        text = f.read()
    d = tomllib.loads(text)
    mixes = []
    for path in a.mix:
        with open(path) as f:
            lens = [int(x) for x in f.read().replace("\n", ",").split(",") if x.strip()]
        mixes.append((os.path.splitext(os.path.basename(path))[0], lens))
    layouts = a.layouts.split(",")
    print(f"# {a.model}: pattern {model['pattern']}, machine {a.machine}, memory {a.memory_gib:g} GiB per GPU")
    print("| mix | tokens | cp | layout | split over (docs x ranks) | pad tokens | attention MiB/rank (strategy) "
          "| Mamba MiB/rank (strategy) | work max/mean | memory GiB/rank | step ms | tokens/s per GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, lens in mixes:
        for cp in [int(x) for x in a.cp.split(",")]:
            ep = d.get("parallel", {}).get("ep", 0) or cp
            if d.get("moe", {}).get("experts", 0) % ep:
                ep = math.gcd(d["moe"]["experts"], cp)
            for lay in layouts:
                sets = ["data.format=thd", "data.seq_lens=" + ",".join(map(str, lens)), f"data.partition={lay}",
                        "run.device=cuda", f"run.memory_gib={a.memory_gib}", "run.check=off",
                        f"parallel.cp_inner={cp_inner(machine, cp)}", f"parallel.ep={ep}", "parallel.attention=all"]
                if cp > 1 and d.get("mamba", {}).get("heads", 64) % cp:
                    sets.append("parallel.mamba_cp=state_passing")
                dry = driver_dry_run(a.bin, text, sets, cp, "cp_hybrid")
                nb, mem = dry["bytes"], dry["memory"]
                step, chosen = doc_step(model, machine, lens, cp, nb)
                if step is None:
                    continue
                pl = nb["placement"]
                w = pl["work"]
                r = {"mix": name, "tokens": sum(lens), "cp": cp, "layout": lay, "split": split_over(pl["group"]),
                     "pads": pl["pad_tokens"], "attn": chosen.get("*", ("-", 0, 0)), "mamba": chosen.get("M", ("-", 0, 0)),
                     "work": max(w) * len(w) / sum(w), "mem": mem["every_rank"] / 2**30, "fits": mem["fits"], "step": step}
                rows.append(r)
                by = lambda c: f"{c[1] / 2**20:.1f} ({c[0]})" if c[1] else "0"
                print(f"| {name} | {r['tokens']} | {cp} | {lay} | {r['split']} | {r['pads']} "
                      f"| {by(r['attn'])} | {by(r['mamba'])} "
                      f"| {r['work']:.3f} | {r['mem']:.1f}{'' if r['fits'] else ' (does not fit)'} | {step:.1f} "
                      f"| {r['tokens'] / cp / (step * 1e-3):.0f} |")
    if a.out and rows:
        plot_documents(rows, a.out, f"{os.path.basename(a.model)} on {os.path.basename(a.machine)} (planner)")
    return 0


def plot_documents(rows, path, title):
    """Predicted step time and attention bytes per rank against cp, one line per (mix, layout)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = {"dcs": (":", "s"), "documents": ("--", "^"), "groups": ("-", "o")}
    for i, mix in enumerate(sorted({r["mix"] for r in rows})):
        for lay, (ls, mk) in styles.items():
            sel = sorted((r for r in rows if r["mix"] == mix and r["layout"] == lay), key=lambda r: r["cp"])
            if not sel:
                continue
            cps = [r["cp"] for r in sel]
            kw = dict(ls=ls, marker=mk, color=f"C{i}", label=f"{mix}, {lay}")
            axes[0].plot(cps, [r["step"] for r in sel], **kw)
            axes[1].plot(cps, [r["attn"][1] / 2**20 for r in sel], **kw)
    for ax, t, u in ((axes[0], "predicted step (forward+backward)", "ms"),
                     (axes[1], "attention bytes per rank and step (max over ranks)", "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("CP size (GPUs)")
        ax.set_ylabel(u)
        ax.set_title(t, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("symlog", linthresh=1)
    axes[1].set_ylim(0, 4 * max(r["attn"][1] / 2**20 for r in rows) + 1)
    axes[0].set_ylim(0, None)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Packed documents by layout: {title}; model estimates, no spread")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def cmd_predict(a):
    model, machine = load_model(a.model), load_machine(a.machine, a.rates)
    print(f"# {a.model}: pattern {model['pattern']}, L = {a.tokens}, cp = {a.cp}, machine {a.machine}")
    with open(a.model) as f:
        dry = step_model(a, f.read(), a.tokens, a.cp, cp_inner(machine, a.cp))
    mem = dry["memory"]
    print(f"# {'kind':<4} {'strategy':<16} {'bytes/rank':>14} {'comm ms':>10} {'compute ms':>11} {'total':>9}")
    for kind in sorted(set(model["pattern"]) & {"*", "M", "E"}):
        for s, (nb, t, comp) in layer_costs(kind, model, machine, a.tokens, a.cp, dry["bytes"]).items():
            print(f"  {kind:<4} {s:<16} {nb:>14,} {t:>10.3f} {comp:>11.3f} {t + comp:>9.3f}")
    best, step = plan(model, machine, a.tokens, a.cp, dry["bytes"])
    if best is None:
        print("# no strategy of some layer kind runs at this cp")
        return 1
    print("# best: " + ", ".join(f"{k} {v[0]}" for k, v in best.items()) + f"; step {step:.2f} ms (forward+backward)")
    if "*" in best:
        # one entry per attention layer of model.pattern, each that layer's cheapest (the layers of one
        # model share a shape and a CP group, so today they agree)
        per_layer = [best["*"][0] for k in model["pattern"] if k == "*"]
        print("# deck: parallel.attention = [" + ", ".join(f'"{s}"' for s in per_layer) + "]  (--set "
              f"parallel.attention=[{','.join(per_layer)}])")
    print(f"# memory per rank ({model['driver']} --dry-run, forward+backward, GiB): "
          + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in mem["parts"].items())
          + f"; total {mem['every_rank'] / 2**30:.2f} of {a.memory_gib:g}: {'fits' if mem['fits'] else 'does not fit'}")
    return 0


def cmd_sweep(a):
    model, machine = load_model(a.model), load_machine(a.machine, a.rates)
    lens = [int(x) for x in a.tokens.split(",")]
    cps = [int(x) for x in a.cp.split(",")]
    with open(a.model) as f:
        text = f.read()
    rows = []
    for L in lens:
        for cp in cps:
            if L % (2 * cp):
                continue
            dry = step_model(a, text, L, cp, cp_inner(machine, cp))
            best, step = plan(model, machine, L, cp, dry["bytes"])
            if best is not None:
                mem = dry["memory"]
                rows.append((L, cp, step, {k: v[0] for k, v in best.items()}, mem["every_rank"], mem["fits"]))
    print(f"# {'tokens':>9} {'cp':>5} {'step ms':>10} {'GiB/rank':>9} {'fits':>4}  best strategy per layer kind "
          f"(GiB: the cp_hybrid step, cp_hybrid --dry-run; fits: in {a.memory_gib:g} GiB)")
    for L, cp, step, b, mem, fits in rows:
        print(f"  {L:>9} {cp:>5} {step:>10.2f} {mem / 2**30:>9.2f} {'yes' if fits else 'no':>4}  "
              + " ".join(f"{k}:{v}" for k, v in sorted(b.items())))
    for L in lens:
        ok = [cp for (l, cp, _, _, _, fits) in rows if l == L and fits]
        print(f"# smallest cp that fits {L} tokens in {a.memory_gib:g} GiB: {min(ok) if ok else 'none of ' + a.cp}")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("tokens,cp,step_ms,train_bytes_per_rank,fits," + ",".join(f"best_{k}" for k in ("*", "E", "M")) + "\n")
            for L, cp, step, b, mem, fits in rows:
                f.write(f"{L},{cp},{step:.6g},{mem:.6g},{int(fits)}," + ",".join(b.get(k, "") for k in ("*", "E", "M")) + "\n")
        print(f"wrote {a.csv}")
    # Sizes that do not fit are drawn hollow: a time the step would take if it could run.
    lines = {f"L = {L:,}": {"pts": [(cp, s, s, s) for (l, cp, s, _, _, _) in rows if l == L],
                            "over": {cp for (l, cp, _, _, _, fits) in rows if l == L and not fits}} for L in lens}
    hcp_figures.figure({k: v for k, v in lines.items() if v["pts"]}, a.out,
                       f"{model['pattern']} ({model['dtype']}, hidden {model['hidden']}): predicted forward+backward "
                       f"on {os.path.basename(a.machine)}", "predicted step time per rank (ms)", ylog=True,
                       hollow_label=f"does not fit in {a.memory_gib:g} GiB per rank (memory model)")
    print(f"wrote {a.out} ({len(rows)} points)")
    return 0


STEPS_PER_CALL = {"ring_post": lambda p: 1, "all_gather": lambda p: p - 1, "all_to_all": lambda p: p - 1,
                  "all_to_all_v": lambda p: p - 1, "reduce_scatter": lambda p: p - 1, "all_reduce": lambda p: 2 * (p - 1)}


def _run_info(path):
    """A cp_hybrid results file: its deck, cp, tokens, strategies' phase medians (slowest rank) and
    per-rank communication counters per timed step."""
    import h5py
    with h5py.File(path, "r") as f:
        cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
        deck = tomllib.loads(cfg["deck_resolved"])
        if cfg["driver"] != "cp_hybrid" or deck["data"]["format"] != "bshd":
            raise ValueError(f"{path}: validate takes BSHD cp_hybrid runs")
        comm = {}
        for strat in f.get("comm", {}):
            for op in f["comm"][strat]:
                if op in STEPS_PER_CALL:
                    g = f["comm"][strat][op]
                    comm.setdefault(strat, {})[op] = [(int(c), int(b), s * 1e3) for c, b, s in
                                                      zip(g["calls"][()], g["bytes_sent"][()], g["seconds"][()])]
        mem = {}
        for strat in f.get("memory", {}):
            g = f["memory"][strat]
            if "step_tensor_bytes" in g:
                mem[strat] = float((g["step_tensor_bytes"][()] + g["live_tensor_bytes"][()]).max())
        params = float(f["memory/parameters/bytes"][()].max()) if "memory/parameters/bytes" in f else None
        return {"path": path, "deck": deck, "deck_text": cfg["deck_resolved"], "world": int(cfg["world_size"]),
                "cp": int(cfg["cp_size"]), "cp_inner": int(cfg.get("cp_inner", 1)),
                "tokens": deck["data"]["batch"] * deck["data"]["seqlen"],
                "timings": hcp_post._timings(f), "comm": comm, "memory": mem, "param_bytes": params}


def validate_memory(a, files, band):
    """Parameter bytes per rank (exact: the model's parameters part against /memory/parameters/bytes)
    and the model's memory of every rank (cp_hybrid --dry-run of the run's own deck) against the
    measured high-water (alive before the step + allocated in it, max over ranks): model / measured
    in [1, band]."""
    print(f"# {'file':<36} {'cp':>3} {'strategy':<10} {'param bytes':>12} {'model':>12} {'MiB':>9} {'model MiB':>10} {'ratio':>6}")
    lo, hi, exact, n = float("inf"), 0.0, 0, 0
    for path in files:
        r = _run_info(path)
        for strat, meas in r["memory"].items():
            mem = driver_memory(a.bin, r["deck_text"], [f"parallel.attention={strat}", "run.check=off", "run.memory_gib=1e6"], r["world"])
            pb = mem["parts"].get("parameters", 0)
            n += 1
            exact += int(r["param_bytes"] is not None and r["param_bytes"] == pb)
            ratio = mem["every_rank"] / meas
            lo, hi = min(lo, ratio), max(hi, ratio)
            print(f"  {path.split('/')[-1]:<36} {r['cp']:>3} {strat:<10} {r['param_bytes'] or 0:>12.0f} {pb:>12} "
                  f"{meas / 2**20:>9.3f} {mem['every_rank'] / 2**20:>10.3f} {ratio:>6.3f}")
    ok = exact == n and 1.0 <= lo and hi <= band
    print(f"RESULT plan_memory params {'EXACT' if exact == n else 'DIFFER'} {exact}/{n}, model / measured "
          f"{lo:.2f}..{hi:.2f} (band 1..{band:g}) {'WITHIN' if ok else 'OUTSIDE'}")
    return ok


def cmd_validate(a):
    """Calibrate per-kind compute (cp = 1 runs) and the network's alpha and beta (the other
    calibration runs' counters) and predict the step time of other runs."""
    import numpy as np
    machine = load_machine(a.machine)
    cores = machine["network"].get("cores_per_node", 1 << 30)
    calib = [_run_info(p) for p in a.calibrate.split(",")]
    base = [c for c in calib if c["cp"] == 1]
    if not base:
        print("error: validate: --calibrate needs a cp = 1 run", file=sys.stderr)
        return 2
    # Per-kind compute against tokens T from the cp = 1 runs: attention a T + b T^2 (its score work
    # is quadratic), every other kind c + a T (c: work that does not shrink with cp, e.g. launches).
    kinds = ("M", "*", "E", "-", "other")
    pts = {k: [] for k in kinds}
    for b in base:
        ph = next(iter(b["timings"].values()))
        for k in kinds[:4]:
            pts[k].append((b["tokens"], ph.get(f"fwd/{k}", 0.0) + ph.get(f"bwd/{k}", 0.0)))
        pts["other"].append((b["tokens"], sum(ph.get(f"{d}/{x}", 0.0) for d in ("fwd", "bwd") for x in ("embed", "head"))))
    fit = {}
    for k, v in pts.items():
        T = np.array([t for t, _ in v], dtype=float)
        y = np.array([m for _, m in v], dtype=float)
        if len(set(T)) < 2:  # one length: proportional to T (and T^2 for attention)
            fit[k] = (0.0, y[0] / T[0], 0.0) if k != "*" else (0.0, 0.0, y[0] / T[0] ** 2)
            continue
        A = np.stack([T, T * T] if k == "*" else [np.ones_like(T), T], axis=1)
        c = np.linalg.lstsq(A, y, rcond=None)[0]
        fit[k] = (0.0, max(c[0], 0.0), max(c[1], 0.0)) if k == "*" else (max(c[0], 0.0), max(c[1], 0.0), 0.0)
    X, y = [], []
    for c in calib:
        if c["cp"] == 1:
            continue
        for ops in c["comm"].values():
            for op, per_rank in ops.items():
                for calls, nbytes, ms in per_rank:
                    X.append([calls * STEPS_PER_CALL[op](c["cp"]), nbytes])
                    y.append(ms)
    if X:
        coef = np.linalg.lstsq(np.array(X, dtype=float), np.array(y, dtype=float), rcond=None)[0]
        alpha, inv_beta = max(coef[0], 0.0), max(coef[1], 0.0)
    else:
        alpha, inv_beta = link(machine, 2)[0], 1.0 / link(machine, 2)[1]
    print(f"# calibrated on {len(base)} cp=1 run(s), compute per kind c + a T + b T^2 (ms): "
          + " ".join(f"{k}=({c:.3g}, {a_:.3g}, {b_:.3g})" for k, (c, a_, b_) in fit.items() if c or a_ or b_) + "; "
          f"network alpha {alpha * 1e3:.2f} us per step, beta {1e-6 / inv_beta if inv_beta else float('inf'):.2f} GB/s "
          f"({len(y)} counters)")
    print(f"# {'file':<36} {'cp':>3} {'strategy':<10} {'measured ms':>12} {'predicted ms':>13} {'error':>7}")
    worst = 0.0
    for path in a.files:
        r = _run_info(path)
        d, cp, T = r["deck"], r["cp"], r["tokens"]
        over = max(1.0, cp / cores)
        pat = d["model"]["pattern"]
        # the run's bytes per rank by the drivers' models, at its own deck and ranks
        dry = driver_dry_run(a.bin, r["deck_text"], ["run.check=off", "run.memory_gib=1e6", "run.device=host",
                                                      f"parallel.cp_inner={r['cp_inner']}"], r["world"])["bytes"]
        lay = dry["layers"]
        for strat, ph in r["timings"].items():
            if "step" not in ph:
                continue
            work = lambda k: (fit[k][0] + (fit[k][1] * T + fit[k][2] * T * T) / cp) * over
            pred = work("other")
            for k in ("M", "*", "E", "-"):
                if not any(fit[k]):
                    continue
                comp = work(k)
                n, nb, steps, overlaps = pat.count(k), 0, 0, False
                if cp > 1 and k == "*":
                    nb = max(lay["*"][strat])
                    msg = dry["messages"][strat]
                    steps = msg["exchange"] + msg["ring"]
                    overlaps = msg["ring_ranks"] == cp  # a ring carries all of it
                elif cp > 1 and k == "M":
                    mcp = d["parallel"]["mamba_cp"]
                    nb = max(lay["M"][mcp])
                    steps = dry["mamba_messages"][mcp]  # by the strategy's record
                elif cp > 1 and k == "E":
                    nb, steps = max(lay["E"]["ep"]), 4 * (cp - 1)
                t = n * (steps * alpha + nb * inv_beta)
                pred += comp + (max(0.0, t - comp * (cp - 1) / cp) if (k == "*" and overlaps) else t)
            meas = ph["step"]
            err = (pred - meas) / meas
            worst = max(worst, abs(err))
            print(f"  {path.split('/')[-1]:<36} {cp:>3} {strat:<10} {meas:>12.2f} {pred:>13.2f} {err * 100:>6.0f}%")
    mem_ok = validate_memory(a, a.files, a.memory_band)
    print(f"RESULT plan_validate worst |error| {worst * 100:.0f}% (band {a.band * 100:.0f}%) "
          f"{'WITHIN' if worst <= a.band else 'OUTSIDE'}")
    return 0 if worst <= a.band and mem_ok else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    D = argparse.ArgumentDefaultsHelpFormatter
    b = sub.add_parser("bytes", formatter_class=D, help="bytes per rank by strategy against a run's counters")
    b.add_argument("files", nargs="+", help="results files of cp_attention or cp_mamba")
    b.add_argument("--bin", default=DEFAULT_BIN, help="folder of the driver binaries")
    b.set_defaults(fn=cmd_bytes)
    r = sub.add_parser("rates", formatter_class=D, help="kernel rates of a bench_kernels file, as a machine deck's [compute]")
    r.add_argument("file", help="bench_kernels results file")
    r.set_defaults(fn=cmd_rates)
    for name, fn in (("predict", cmd_predict), ("sweep", cmd_sweep)):
        s = sub.add_parser(name, formatter_class=D,
                           help="time, bytes and memory per rank of each strategy" + (" at one (L, cp)" if name == "predict"
                                                                                      else " over L and cp, with a plot"))
        s.add_argument("--model", required=True, help="a cp_hybrid deck (the model sections are read)")
        s.add_argument("--machine", required=True, help="a machine deck (inputs/machines/*.toml)")
        s.add_argument("--rates", help="a bench_kernels file whose kernel rates replace the machine deck's [compute]")
        if name == "predict":
            s.add_argument("--tokens", type=int, required=True, help="sequence length")
            s.add_argument("--cp", type=int, required=True, help="CP size")
        else:
            s.add_argument("--tokens", required=True, help="sequence lengths, comma-separated")
            s.add_argument("--cp", required=True, help="CP sizes, comma-separated")
            s.add_argument("--out", required=True, help="the PNG to write")
            s.add_argument("--csv", help="also write the table as CSV here")
        s.add_argument("--memory-gib", type=float, default=141.0, help="memory per GPU, GiB (141: an H200)")
        s.add_argument("--bin", default=DEFAULT_BIN, help="folder of the driver binaries")
        s.set_defaults(fn=fn)
    dc = sub.add_parser("documents", formatter_class=D, help="packed documents by layout: bytes, balance, memory, step")
    dc.add_argument("--model", required=True, help="a cp_hybrid deck (the model sections are read)")
    dc.add_argument("--machine", required=True, help="a machine deck (inputs/machines/*.toml)")
    dc.add_argument("--rates", help="a bench_kernels file whose kernel rates replace the machine deck's [compute]")
    dc.add_argument("--mix", action="append", required=True, help="a file of comma-separated document lengths")
    dc.add_argument("--cp", required=True, help="CP sizes, comma-separated")
    dc.add_argument("--layouts", default="dcs,documents,groups", help="data.partition values, comma-separated")
    dc.add_argument("--out", help="the PNG to write")
    dc.add_argument("--memory-gib", type=float, default=141.0, help="memory per GPU, GiB (141: an H200)")
    dc.add_argument("--bin", default=DEFAULT_BIN, help="folder of the driver binaries")
    dc.set_defaults(fn=cmd_documents)
    v = sub.add_parser("validate", formatter_class=D, help="predicted step time and memory against runs")
    v.add_argument("--machine", required=True, help="a machine deck (inputs/machines/*.toml)")
    v.add_argument("--calibrate", required=True, help="cp_hybrid runs, comma-separated: one at cp = 1, others for the network")
    v.add_argument("--band", type=float, default=0.15, help="largest relative step-time error accepted")
    v.add_argument("--memory-band", type=float, default=1.5,
                   help="largest model / measured memory per rank accepted (the model must not be below 1)")
    v.add_argument("--bin", default=DEFAULT_BIN, help="folder of the driver binaries")
    v.add_argument("files", nargs="+", help="cp_hybrid results files to predict")
    v.set_defaults(fn=cmd_validate)
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as e:
        print(f"error: {a.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
