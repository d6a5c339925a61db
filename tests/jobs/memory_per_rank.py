#!/usr/bin/python3
"""Memory per rank at fixed total tokens, from the drivers' "# memory per rank" lines (tensor storage
allocated during the timed step beyond what was alive before it). Runs cp_mamba (one BSHD row of
4096 tokens) and cp_attention (2048 tokens) at np 1, 2 and 4 and checks that the step's memory per
rank falls with cp: for both Mamba strategies cp * mem(cp) / mem(1) <= 1.6 at cp 2 and 4 (1 would
be exactly 1/cp; a memory that does not fall gives cp); for attention, whose exchange buffers make
cp = 2 cost more than the local cp = 1 path, mem(4) / mem(2) <= 0.8 for every strategy. What is
alive before the step (inputs and outputs; no cp=1 reference with run.check = "off") falls as 1/cp
for every strategy: cp * live(cp) / live(1) <= 1.2 (each rank makes only its own rows).
Usage: memory_per_rank.py BINDIR MPIRUN...   Prints the table and RESULT memory_per_rank PASS|FAIL."""
import re
import subprocess
import sys

bindir, mpirun = sys.argv[1], sys.argv[2:]
line = re.compile(r"# memory per rank of (\S+) \(MiB, max over ranks\): tensors allocated in the step ([0-9.]+), "
                  r"alive before it ([0-9.]+)")
runs = {
    "cp_mamba": ["--set", "data.format=bshd", "--set", "data.batch=1", "--set", "data.seqlen=4096"],
    "cp_attention": ["--set", "data.format=bshd", "--set", "data.batch=1", "--set", "data.seqlen=2048"],
}
mem, live = {}, {}
for drv, args in runs.items():
    for np_ in (1, 2, 4):
        out = subprocess.run(mpirun + ["-n", str(np_), f"{bindir}/{drv}", "--quiet", "--set", "run.repeats=1",
                                       "--set", "run.check=off"] + args, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-2000:])
            print("RESULT memory_per_rank FAIL")
            sys.exit(1)
        for strat, mib, alive in line.findall(out.stdout):
            mem[(drv, strat, np_)] = float(mib)
            live[(drv, strat, np_)] = float(alive)
bad = []
print(f"# {'driver':<13} {'strategy':<16} {'np1 MiB':>8} {'np2 MiB':>8} {'np4 MiB':>8} {'2*m2/m1':>8} {'4*m4/m1':>8} {'m4/m2':>6}"
      f"  live MiB np1/np2/np4")
for drv, strat in sorted({(d, s) for d, s, _ in mem}):
    m1, m2, m4 = (mem.get((drv, strat, n), float("nan")) for n in (1, 2, 4))
    r2, r4, h = 2 * m2 / m1, 4 * m4 / m1, m4 / m2
    l1, l2, l4 = (live.get((drv, strat, n), float("nan")) for n in (1, 2, 4))
    print(f"  {drv:<13} {strat:<16} {m1:8.2f} {m2:8.2f} {m4:8.2f} {r2:8.2f} {r4:8.2f} {h:6.2f}  {l1:.2f}/{l2:.2f}/{l4:.2f}")
    if not (2 * l2 / l1 <= 1.2 and 4 * l4 / l1 <= 1.2):
        bad.append(f"{strat}: inputs and outputs per rank do not fall as 1/cp")
    if drv == "cp_mamba" and not (r2 <= 1.6 and r4 <= 1.6):
        bad.append(f"{strat}: memory per rank does not fall ~1/cp")
    if drv == "cp_attention" and not h <= 0.8:
        bad.append(f"{strat}: memory per rank does not fall from cp 2 to cp 4")
for b in bad:
    print("  FAIL " + b)
print(f"RESULT memory_per_rank {'PASS' if not bad and len(mem) == 18 else 'FAIL'}")  # 6 strategies x 3 np
sys.exit(0 if not bad and len(mem) == 15 else 1)
