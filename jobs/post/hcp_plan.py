#!/usr/bin/python3
"""Cost model of hybridcp's CP strategies: bytes per rank (the drivers' byte models, for one BSHD
batch without padding), an alpha-beta time for each collective and kernel rates for compute.

  hcp_plan.py bytes F.h5 ...      predicted bytes per rank and step against the /comm counters of
      cp_attention / cp_mamba files (BSHD); exit 1 unless every rank of every strategy matches exactly
  hcp_plan.py rates BENCH.h5      the [compute] rates of a bench_kernels anchors file (attention,
      grouped GEMM, SSD), as a machine deck section; predict and sweep take it as --rates BENCH.h5
  hcp_plan.py predict --model DECK --machine DECK --tokens L --cp N
      per layer kind and strategy: bytes per rank, communication (exposed) and compute ms per
      forward+backward step; the best strategy of each kind and the step time of the model's pattern
  hcp_plan.py sweep --model DECK --machine DECK --tokens L1,L2,.. --cp N1,N2,.. --out P.png [--csv F]
      the best step time against cp for each L (one line per L), and which strategy each kind takes
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
between the CP group's links. Times are estimates; bytes are exact for the layouts `bytes` checks.
Memory per rank is not modelled here: predict, sweep and validate run `cp_hybrid --dry-run --ranks N`
(--bin DIR, default build/drivers) and read its model (drivers/memory_model.cpp), the one the
drivers' admission check uses.
"""
import argparse
import math
import os
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hcp_post  # noqa: E402  (the results files' readers and plots)

ES = {"fp64": 8, "fp32": 4, "bf16": 2}


# ---- the drivers' byte models (per rank, forward + backward, BSHD batch B x L, no padding) ---------
def owner(k, cp):
    """DualChunkSwap: rank r holds chunks r and 2cp-1-r of each sequence."""
    return k if k < cp else 2 * cp - 1 - k


def kv_head_ranges(H, Hkv, parts, mine):
    """K/V heads read by each of `parts` query-head blocks, and whether block `mine` is plain GQA."""
    hl, g = H // parts, H // Hkv
    lo = [r * hl // g for r in range(parts)]
    n = [((r + 1) * hl - 1) // g + 1 - lo[r] for r in range(parts)]
    nm = n[mine]
    plain = hl % nm == 0 and all((mine * hl + i) // g - lo[mine] == i // (hl // nm) for i in range(hl))
    return lo, n, plain


def a2a_p2p_bytes(cp, inner, rank, B, L, H, Hkv, D, dtype):
    """a2a+p2p, forward + backward: (bytes of the inner all-to-alls, bytes of the outer ring)."""
    es, tl = ES[dtype], B * L // cp
    outer, i, hl = cp // inner, rank % inner, H // inner
    _, n, plain = kv_head_ranges(H, Hkv, inner, i)
    ring_kv = 2 * inner * tl * (n[i] if plain else hl) * D
    acc = ES["fp32"] if dtype == "bf16" else es
    a2a = (4 * tl * (H - hl) * D + 2 * tl * (sum(n) - n[i]) * D + 2 * (inner - 1) * tl * n[i] * D) * es
    ring = 2 * (outer - 1) * ring_kv * es + outer * ring_kv * acc if outer > 1 else 0
    return a2a, ring


def attention_bytes(strategy, cp, rank, B, L, H, Hkv, D, dtype, inner=1):
    if cp == 1:
        return 0
    es, tl = ES[dtype], B * L // cp
    kv = 2 * tl * Hkv * D
    if strategy == "a2a+p2p":  # Ulysses over `inner` ranks, the p2p ring over cp / inner
        return sum(a2a_p2p_bytes(cp, inner, rank, B, L, H, Hkv, D, dtype))
    if strategy == "p2p":
        acc = ES["fp32"] if dtype == "bf16" else es  # the travelling dK/dV accumulator
        return (cp - 1) * kv * es + (cp - 1) * kv * es + cp * kv * acc
    if strategy == "allgather":
        return 2 * (cp - 1) * kv * es  # all-gather of K/V, reduce-scatter of dK/dV
    if strategy == "a2a":
        q, hl, g = tl * H * D, H // cp, H // Hkv
        kv_n = [((r + 1) * hl - 1) // g + 1 - r * hl // g for r in range(cp)]
        out = sum(n for r, n in enumerate(kv_n) if r != rank)
        fwd = (cp - 1) * 2 * q // cp + 2 * tl * out * D
        bwd = (cp - 1) * 2 * q // cp + 2 * (cp - 1) * tl * kv_n[rank] * D
        return (fwd + bwd) * es
    raise ValueError(strategy)


def halo_rows(cp, rank, B, L, halo):
    """Conv halo rows this rank sends forward and returns backward (chunks no shorter than the halo)."""
    lc, rows = L // (2 * cp), 0
    for k in range(1, 2 * cp):
        need = min(halo, k * lc)
        frm = [owner(o // lc, cp) for o in range(k * lc - need, k * lc)]
        to = owner(k, cp)
        rows += sum((f != to) * ((f == rank) + (to == rank)) for f in frm)
    return B * rows


def state_elements(scan, cp, rank, B, H, pn):
    if cp == 1:
        return 0
    K = 2 * cp
    pieces = [rank, 2 * cp - 1 - rank]
    if scan == "allgather":
        return (cp - 1) * B * len(pieces) * H * (2 * pn + 1)
    n = 0
    remote = lambda k, d: 0 <= k + d < K and owner(k + d, cp) != rank
    for k in pieces:
        d = 1
        while d < K:
            n += (remote(k, d) + remote(k, -d)) * H * (pn + 1)
            d *= 2
        n += (remote(k, 1) + remote(k, -1)) * H * pn
    return B * n


def resolve_scan(scan, cp, B, H, pn):
    if scan != "auto":
        return scan
    d = max(state_elements("doubling", cp, r, B, H, pn) for r in range(cp))
    a = max(state_elements("allgather", cp, r, B, H, pn) for r in range(cp))
    return "doubling" if d < a else "allgather"


def mamba_bytes(strategy, cp, rank, B, L, m, dtype, scan="auto"):
    if cp == 1:
        return 0
    es, tl = ES[dtype], B * L // cp
    G, N, di = m["n_groups"], m["d_state"], m["heads"] * m["head_dim"]
    if strategy == "hidden_parallel":
        rep = cp // G if G < cp else 1
        per_tok = 2 * di + 2 * G * rep * N + m["heads"]
        return 2 * (cp - 1) * tl * per_tok // cp * es
    pn = m["head_dim"] * N
    ss = ES["fp32"] if dtype == "bf16" else es
    states = state_elements(resolve_scan(scan, cp, B, m["heads"], pn), cp, rank, B, m["heads"], pn)
    conv_dim = di + 2 * G * N
    return states * ss + halo_rows(cp, rank, B, L, m["conv"] - 1) * conv_dim * es


def moe_bytes(cp, B, L, e, hidden, dtype, ep=0):
    """Expert parallelism over groups of ep CP ranks (0: the CP group), uniform routing: dispatch and
    combine, forward and back."""
    ep = ep or cp
    if ep == 1:
        return 0
    return 4 * (B * L // cp) * e["topk"] * hidden * ES[dtype] * (ep - 1) // ep


# ---- memory per rank: the drivers' own model (drivers/memory_model.cpp), read from --dry-run -------
DEFAULT_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "drivers")


def driver_memory(bindir, deck_text, sets, ranks, driver="cp_hybrid"):
    """The MEMORY line of `driver --dry-run --ranks N` on a deck (TOML text) with --set overrides: the
    estimate per rank by part, the limit, whether it fits and the smallest power-of-two cp that does."""
    import json
    import subprocess
    import tempfile
    exe = os.path.join(bindir, driver)
    if not os.access(exe, os.X_OK):
        raise OSError(f"{exe}: no driver to ask for the memory model (build first, or give --bin DIR)")
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(deck_text)
        f.flush()
        cmd = [exe, "--deck", f.name, "--dry-run", "--ranks", str(ranks)]
        for kv in sets:
            cmd += ["--set", kv]
        out = subprocess.run(cmd, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("MEMORY "):
            return json.loads(line[7:])
    raise ValueError(f"{' '.join(cmd)}: no MEMORY line (exit {out.returncode}): {out.stderr.strip()[-500:]}")


def step_memory(a, text, L, cp):
    """The cp_hybrid step's memory per rank of the --model deck (its TOML text) at L tokens (one BSHD
    row) and CP size cp, on GPU ranks of --memory-gib GiB (run.device = cuda, run.check = off)."""
    d = tomllib.loads(text)
    # EP over the CP group, or over the largest group that divides the experts (as plan() assumes)
    ep = d.get("parallel", {}).get("ep", 0) or cp
    experts = d.get("moe", {}).get("experts", 0)
    if experts and experts % ep:
        ep = math.gcd(experts, cp)
    sets = ["data.format=bshd", "data.batch=1", f"data.seqlen={L}", "run.check=off", "run.device=cuda",
            f"run.memory_gib={a.memory_gib}", f"parallel.cp_size={cp}", f"parallel.ep={ep}"]
    return driver_memory(a.bin, text, sets, cp)


# ---- time ----------------------------------------------------------------------------------------
def link(machine, cp):
    n = machine["network"]
    if cp <= n["gpus_per_node"]:
        return n["intra_alpha_us"] * 1e-3, n["intra_gbps"] * 1e6  # ms, bytes per ms
    return n["inter_alpha_us"] * 1e-3, n["inter_gbps"] * 1e6


def comm_ms(machine, cp, nbytes, steps):
    a, b = link(machine, cp)
    return steps * a + nbytes / b


def layer_costs(kind, model, machine, L, cp, B=1):
    """{strategy: (bytes per rank, comm ms exposed, compute ms)} for one layer of `kind`."""
    c, dt, hid = machine["compute"], model["dtype"], model["hidden"]
    tl = B * L / cp
    gemm = lambda flops: flops / (c["gemm_tflops"] * 1e9)  # ms
    out = {}
    if kind == "*":
        a = model["attention"]
        H, Hkv, D = a["heads"], a["kv_heads"], a["head_dim"]
        f = 4 * B * L * L / 2 * H * D / cp
        proj = gemm(3 * 2 * tl * hid * (2 * H + 2 * Hkv) * D)
        comp = f / (c["attn_fwd_tflops"] * 1e9) + 2.5 * f / (c["attn_bwd_tflops"] * 1e9) + proj
        for s in ("p2p", "allgather", "a2a"):
            if s == "a2a" and H % cp:
                continue
            # p2p and allgather send the same on every rank; a2a's K/V heads differ by rank
            nb = max(attention_bytes(s, cp, r, B, L, H, Hkv, D, dt) for r in (range(cp) if s == "a2a" else (0,)))
            steps = {"p2p": 3 * (cp - 1), "allgather": 2 * (cp - 1), "a2a": 8 * (cp - 1)}[s]
            t = comm_ms(machine, cp, nb, steps) if cp > 1 else 0.0
            out[s] = (nb, max(0.0, t - comp * (cp - 1) / cp) if s == "p2p" else t, comp)
        # a2a+p2p: Ulysses inside a node (its link), the ring across nodes overlapping compute
        inner = math.gcd(int(machine["network"]["gpus_per_node"]), cp)
        if 1 < inner < cp and H % inner == 0:
            outer = cp // inner
            parts = [a2a_p2p_bytes(cp, inner, r, B, L, H, Hkv, D, dt) for r in range(inner)]
            ia, ring = max(p[0] for p in parts), max(p[1] for p in parts)
            t_ring = comm_ms(machine, cp, ring, 3 * (outer - 1))
            t = comm_ms(machine, inner, ia, 8 * (inner - 1)) + max(0.0, t_ring - comp * (outer - 1) / outer)
            out["a2a+p2p"] = (ia + ring, t, comp)
    elif kind == "M":
        m = model["mamba"]
        di, G, N = m["heads"] * m["head_dim"], m["n_groups"], m["d_state"]
        d_in_proj = 2 * di + 2 * G * N + m["heads"]
        comp = gemm(3 * 2 * tl * hid * (d_in_proj + di)) + 3 * tl * m["heads"] * m["head_dim"] * N / (c["ssd_gunits"] * 1e6)
        for s in ("hidden_parallel", "state_passing"):
            if s == "hidden_parallel" and m["heads"] % cp:
                continue
            ranks = range(cp) if cp <= 64 else (0, cp - 1)
            nb = max(mamba_bytes(s, cp, r, B, L, m, dt, m.get("state_scan", "auto")) for r in ranks)
            if s == "hidden_parallel":
                steps = 4 * (cp - 1)
            else:
                scan = resolve_scan(m.get("state_scan", "auto"), cp, B, m["heads"], m["head_dim"] * N)
                steps = 3 * (cp - 1) if scan == "allgather" else 2 * (2 * math.ceil(math.log2(2 * cp)) + 2) * 2
                steps += 4  # conv halo, forward and backward
            out[s] = (nb, comm_ms(machine, cp, nb, steps) if cp > 1 else 0.0, comp)
    elif kind == "E":
        e = model["moe"]
        comp = gemm(3 * 2 * tl * (e["topk"] * 2 * hid * e["ffn"] + 2 * hid * e.get("shared_ffn", 0)))
        nb = moe_bytes(cp, B, L, e, hid, dt, model.get("ep", 0))
        out["ep"] = (nb, comm_ms(machine, cp, nb, 4 * (cp - 1)) if cp > 1 else 0.0, comp)
    return out


def plan(model, machine, L, cp):
    """Best strategy per layer kind, and the step time (ms) of the pattern with those choices."""
    best, step = {}, 0.0
    for kind in sorted(set(model["pattern"]) & {"*", "M", "E"}):
        costs = layer_costs(kind, model, machine, L, cp)
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
    m = d.get("model", {})
    return model_of(d)


def model_of(d):
    """The planner's view of a deck (a dict from TOML)."""
    m = d.get("model", {})
    return {"pattern": m.get("pattern", "M*E"), "hidden": m.get("hidden", d.get("mamba", {}).get("hidden", 2688)),
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
def cmd_bytes(a):
    import h5py
    bad = checked = 0
    print(f"# {'file':<36} {'strategy':<16} {'rank':>4} {'measured':>12} {'predicted':>12}")
    for path in a.files:
        with h5py.File(path, "r") as f:
            cfg = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
            deck = tomllib.loads(cfg["deck_resolved"])
            drv, cp = cfg["driver"], int(cfg["cp_size"])
            data = deck["data"]
            if data["format"] != "bshd" or drv not in ("cp_attention", "cp_mamba") or cp != int(cfg["world_size"]):
                print(f"error: {path}: bytes checks BSHD cp_attention / cp_mamba runs with cp = ranks", file=sys.stderr)
                return 2
            B, L, dt = data["batch"], data["seqlen"], data["dtype"]
            for strat in f["comm"]:
                ops = f["comm"][strat]
                measured = [0.0] * cp
                for op in ops:
                    if op in ("barrier", "all_reduce"):  # the parameter all-reduce is checked apart
                        continue
                    for r, v in enumerate(ops[op]["bytes_sent"][()]):
                        measured[r] += v  # per timed step
                for r in range(cp):
                    if drv == "cp_attention":
                        at = deck["attention"]
                        want = attention_bytes(strat, cp, r, B, L, at["heads"], at["kv_heads"], at["head_dim"], dt,
                                               int(cfg.get("cp_inner", 1)))
                    else:
                        mm = dict(deck["mamba"])
                        want = mamba_bytes(strat, cp, r, B, L, mm, dt, mm.get("state_scan", "auto"))
                    ok = int(measured[r]) == want
                    checked += 1
                    bad += 0 if ok else 1
                    print(f"  {path.split('/')[-1]:<36} {strat:<16} {r:>4} {int(measured[r]):>12} {want:>12} {'' if ok else 'DIFFERS'}")
    print(f"RESULT plan_bytes {'EXACT' if bad == 0 and checked else 'DIFFERS'} {checked - bad}/{checked}")
    return 0 if bad == 0 and checked else 1


def cmd_predict(a):
    model, machine = load_model(a.model), load_machine(a.machine, a.rates)
    print(f"# {a.model}: pattern {model['pattern']}, L = {a.tokens}, cp = {a.cp}, machine {a.machine}")
    print(f"# {'kind':<4} {'strategy':<16} {'bytes/rank':>14} {'comm ms':>10} {'compute ms':>11} {'total':>9}")
    for kind in sorted(set(model["pattern"]) & {"*", "M", "E"}):
        for s, (nb, t, comp) in layer_costs(kind, model, machine, a.tokens, a.cp).items():
            print(f"  {kind:<4} {s:<16} {nb:>14,} {t:>10.3f} {comp:>11.3f} {t + comp:>9.3f}")
    best, step = plan(model, machine, a.tokens, a.cp)
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
    with open(a.model) as f:
        mem = step_memory(a, f.read(), a.tokens, a.cp)
    print(f"# memory per rank (cp_hybrid --dry-run, forward+backward, GiB): "
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
            best, step = plan(model, machine, L, cp)
            if best is not None:
                mem = step_memory(a, text, L, cp)
                rows.append((L, cp, step, {k: v[0] for k, v in best.items()}, mem["every_rank"], mem["fits"]))
    print(f"# {'tokens':>9} {'cp':>5} {'step ms':>10} {'GiB/rank':>9} {'fits':>4}  best strategy per layer kind "
          f"(GiB: the cp_hybrid step, cp_hybrid --dry-run; fits: in {a.memory_gib:g} GiB)")
    for L, cp, step, b, mem, fits in rows:
        print(f"  {L:>9} {cp:>5} {step:>10.2f} {mem / 2**30:>9.2f} {'yes' if fits else 'no':>4}  "
              + " ".join(f"{k}:{v}" for k, v in sorted(b.items())))
    for L in lens:
        ok = [cp for (l, cp, _, _, _, fits) in rows if l == L and fits]
        print(f"# smallest cp that fits {L} tokens in {a.memory_gib:g} GiB: {min(ok) if ok else 'none of ' + a.cp}")
    rows = [r[:5] for r in rows]
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("tokens,cp,step_ms,train_bytes_per_rank," + ",".join(f"best_{k}" for k in ("*", "E", "M")) + "\n")
            for L, cp, step, b, mem in rows:
                f.write(f"{L},{cp},{step:.6g},{mem:.6g}," + ",".join(b.get(k, "") for k in ("*", "E", "M")) + "\n")
        print(f"wrote {a.csv}")
    series = {f"L = {L:,}": [(cp, s) for (l, cp, s, _, _) in rows if l == L] for L in lens}
    hcp_post.plot_against_cp({k: v for k, v in series.items() if v}, a.out,
                             f"{model['pattern']}: predicted forward+backward", "predicted step time per rank (ms)", ylog=True)
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
    b0 = base[0]
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
        B, L, dt = d["data"]["batch"], d["data"]["seqlen"], d["data"]["dtype"]
        over = max(1.0, cp / cores)
        pat = d["model"]["pattern"]
        for strat, ph in r["timings"].items():
            if "step" not in ph:
                continue
            work = lambda k: (fit[k][0] + (fit[k][1] * T + fit[k][2] * T * T) / cp) * over
            pred = work("other")
            for k in ("M", "*", "E", "-"):
                if not any(fit[k]):
                    continue
                comp = work(k)
                n, nb, steps = pat.count(k), 0, 0
                if cp > 1 and k == "*":
                    at = d["attention"]
                    inner = r["cp_inner"]
                    nb = max(attention_bytes(strat, cp, q, B, L, at["heads"], at["kv_heads"], at["head_dim"], dt, inner)
                             for q in range(cp))
                    steps = {"p2p": 3 * (cp - 1), "allgather": 2 * (cp - 1), "a2a": 8 * (cp - 1),
                             "a2a+p2p": 8 * (inner - 1) + 3 * (cp // inner - 1)}[strat]
                elif cp > 1 and k == "M":
                    mcp = d["parallel"]["mamba_cp"]
                    nb = max(mamba_bytes(mcp, cp, q, B, L, d["mamba"], dt, d["mamba"].get("state_scan", "auto")) for q in range(cp))
                    steps = 4 * (cp - 1)
                elif cp > 1 and k == "E":
                    nb, steps = moe_bytes(cp, B, L, d["moe"], d["model"]["hidden"], dt, d["parallel"].get("ep", 0)), 4 * (cp - 1)
                t = n * (steps * alpha + nb * inv_beta)
                pred += comp + (max(0.0, t - comp * (cp - 1) / cp) if (k == "*" and strat == "p2p") else t)
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
    b.add_argument("files", nargs="+", help="results files of cp_attention, cp_mamba or cp_hybrid")
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
