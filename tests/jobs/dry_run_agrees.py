#!/usr/bin/python3
"""A dry run applies every rule a run applies: for each deck below that a run at np N refuses
(exit 2), `driver --dry-run --ranks N` from one process refuses it too, with the same error line;
for decks a run admits, the dry run of N launched ranks and the one-process `--dry-run --ranks N`
print the same MEMORY and BYTES lines (a2a+p2p's inner group is the node's ranks in both, and
--ranks-per-node changes it). Shape rules at rank counts not launched here (64 ranks of the Nano
deck) are refused by the dry run alone.
Usage: dry_run_agrees.py BINDIR MPIRUN...   Prints each check and RESULT dry_run_agrees PASS|FAIL."""
import json
import os
import re
import subprocess
import sys
import tempfile

from checklist import check, finish

bindir, mpirun = sys.argv[1], sys.argv[2:]
inputs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs")
never = os.path.join(tempfile.mkdtemp(), "never.h5")


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def sets(*kv):
    return [a for s in kv for a in ("--set", s)]


def error_line(text):
    m = re.search(r"^(?:\[rank \d+\] )?(error: .*)$", text, re.M)
    return m.group(1) if m else None


def lines(text, key):
    m = re.search(rf"^{key} (.*)$", text, re.M)
    return json.loads(m.group(1)) if m else None


# (driver, np, settings): each breaks one shape rule at that rank count.
refused = [
    ("cp_hybrid", 8, sets("model.pattern=*", "attention.heads=4", "parallel.attention=a2a", "data.format=bshd",
                          "data.seqlen=256")),
    ("cp_hybrid", 8, sets("model.pattern=M", "mamba.heads=4", "parallel.mamba_cp=hidden_parallel",
                          "data.format=bshd", "data.seqlen=256")),
    ("cp_attention", 4, sets("parallel.attention=a2a", "attention.heads=6")),
    ("cp_attention", 4, sets("parallel.attention=a2a+p2p", "parallel.cp_inner=4", "attention.heads=6")),
    ("cp_mamba", 4, sets("parallel.mamba_cp=hidden_parallel", "mamba.heads=6")),
    ("cp_mamba", 4, sets("data.format=bshd", "data.seqlen=12")),
    ("train_hybrid", 4, sets("parallel.attention=a2a", "attention.heads=6")),
    ("train_hybrid", 4, sets("parallel.attention=a2a+p2p", "parallel.cp_inner=3")),
    ("cp_attention", 4, sets("parallel.cp_size=3")),
]
for drv, n, args in refused:
    what = f"{drv} np {n} {' '.join(args[1::2])}"
    r = run(mpirun + ["-n", str(n), f"{bindir}/{drv}", "--out", never] + args)
    d = run([f"{bindir}/{drv}", "--dry-run", "--ranks", str(n)] + args)
    er, ed = error_line(r.stderr), error_line(d.stderr)
    check(r.returncode == 2 and er is not None, f"{what}: the run refuses it (exit {r.returncode}: {er})")
    check(d.returncode == 2 and ed == er, f"{what}: --dry-run --ranks {n} refuses it with the same line "
          f"(exit {d.returncode}: {ed})")
check(not os.path.exists(never), "no results file left by a refused run")

# Admitted decks: the launched dry run and the one-process one agree on memory and bytes.
admitted = [
    ("cp_attention", 4, sets("parallel.attention=a2a+p2p", "attention.heads=8")),
    ("cp_hybrid", 4, sets("parallel.attention=a2a+p2p", "data.format=bshd", "data.seqlen=512")),
    ("cp_mamba", 4, sets("parallel.mamba_cp=all")),
    ("train_hybrid", 4, sets("parallel.attention=a2a+p2p")),
]
for drv, n, args in admitted:
    what = f"{drv} np {n} {' '.join(args[1::2])}"
    r = run(mpirun + ["-n", str(n), f"{bindir}/{drv}", "--dry-run", "--set", "run.memory_gib=8"] + args)
    d = run([f"{bindir}/{drv}", "--dry-run", "--ranks", str(n), "--set", "run.memory_gib=8"] + args)
    for key in ("MEMORY", "BYTES"):
        lr, ld = lines(r.stdout, key), lines(d.stdout, key)
        if key == "BYTES" and lr is None and drv == "train_hybrid":
            continue  # train_hybrid prints no byte model
        check(r.returncode == 0 and lr is not None and lr == ld,
              f"{what}: {key} of mpirun -n {n} --dry-run equals --dry-run --ranks {n} (exit {r.returncode}/{d.returncode})")

# a2a+p2p's inner group follows --ranks-per-node: 8 ranks on one node is a2a inside the node (no
# ring), 2 per node a 2-rank Ulysses group around a 4-rank ring.
aa = sets("parallel.attention=a2a+p2p", "attention.heads=8", "run.memory_gib=8")
one = lines(run([f"{bindir}/cp_attention", "--dry-run", "--ranks", "8"] + aa).stdout, "BYTES")
two = lines(run([f"{bindir}/cp_attention", "--dry-run", "--ranks", "8", "--ranks-per-node", "2"] + aa).stdout, "BYTES")
ring = lambda b: (b or {}).get("ring", {}).get("a2a+p2p")
check(one is not None and two is not None and not any(ring(one) or [0]) and all(ring(two) or [0]),
      f"--ranks 8: a2a+p2p has no ring on one node of 8, a ring with 2 ranks per node ({ring(one)} / {ring(two)})")
r = run([f"{bindir}/cp_attention", "--ranks-per-node", "2"])
check(r.returncode == 2 and "--ranks-per-node 2 needs --dry-run --ranks N" in r.stderr,
      f"--ranks-per-node without --dry-run --ranks is refused ({error_line(r.stderr)})")

# Rank counts not launched here: the Nano deck's 32 attention heads cannot be split over 64 ranks by
# Ulysses alone; at 32 ranks they can.
nano = ["--deck", f"{inputs}/hybrid_nano_blocks.toml", "--set", "parallel.attention=a2a", "--set", "run.memory_gib=1000"]
r64 = run([f"{bindir}/cp_hybrid", "--dry-run", "--ranks", "64"] + nano)
r32 = run([f"{bindir}/cp_hybrid", "--dry-run", "--ranks", "32"] + nano)
check(r64.returncode == 2 and "heads" in (error_line(r64.stderr) or ""),
      f"Nano deck, a2a, --ranks 64: refused naming the heads ({error_line(r64.stderr)})")
check(r32.returncode == 0, f"Nano deck, a2a, --ranks 32: admitted (exit {r32.returncode} {error_line(r32.stderr)})")
finish("dry_run_agrees")
