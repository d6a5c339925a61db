#!/usr/bin/python3
"""The admission check and --dry-run, on the sizes CP exists for:
  1. cp_attention, 32 768 tokens of 32 x 128 heads (inputs/attention_scaling.toml): the estimate per
     rank falls from --ranks 2 to 4 to 8, and at 4 ranks it fits in 5 GiB (a model of the whole
     problem on every rank asked for 6.4 GiB at any rank count);
  2. a refusal names what does not fit and what helps: at np 2 in 4.5 GiB the CP part fits and the
     cp=1 reference does not (the message says run.check = "cross"); in 2 GiB the CP part does not
     (it says to use more ranks and at which cp it fits);
  3. run.memory_check: "warn" runs with one warning, "off" runs silently, "refuse" exits 2;
  4. inputs/hybrid_nano_blocks.toml in bf16 on 80 and 141 GiB GPUs: the driver's smallest
     power-of-two cp for 128K, 512K and 1M tokens equals hcp_plan.py sweep's (the same model).
Usage: dry_run.py BINDIR PLAN MPIRUN...   Prints each check and RESULT dry_run PASS|FAIL."""
import json
import os
import re
import subprocess
import sys
import tempfile

from checklist import bad, check, finish

bindir, plan, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
inputs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inputs")
tmp = tempfile.mkdtemp()


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def memory(driver, args, ranks):
    out = run([f"{bindir}/{driver}", "--dry-run", "--ranks", str(ranks)] + args)
    m = re.search(r"^MEMORY (.*)$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        bad.append(f"{driver} --dry-run --ranks {ranks}: exit {out.returncode} {out.stderr[-300:]}")
        return None
    return json.loads(m.group(1))


att = ["--deck", f"{inputs}/attention_scaling.toml", "--set", "data.seqlen=32768", "--set", "run.check=off"]
est = {n: memory("cp_attention", att, n) for n in (2, 4, 8)}
if None not in est.values():
    e = {n: est[n]["every_rank"] / 2**30 for n in est}
    check(e[8] < e[4] < e[2], f"cp_attention 32K: GiB per rank falls with ranks (2/4/8: {e[2]:.2f}/{e[4]:.2f}/{e[8]:.2f})")
    fit4 = memory("cp_attention", att + ["--set", "run.memory_gib=5"], 4)
    check(fit4 is not None and fit4["fits"], "cp_attention 32K at 4 ranks fits in 5 GiB per rank")

ref = ["--deck", f"{inputs}/attention_scaling.toml", "--set", "data.seqlen=32768", "--set", "run.check=reference"]
out = run(mpirun + ["-n", "2", f"{bindir}/cp_attention", "--set", "run.memory_gib=4.5", "--out", os.path.join(tmp, "never.h5")] + ref)
check(out.returncode == 2 and "the cp=1 reference on rank 0 does not" in out.stderr and 'run.check = "cross"' in out.stderr,
      "np 2, 4.5 GiB: refused (exit 2) naming the cp=1 reference and run.check = \"cross\"")
out = run(mpirun + ["-n", "2", f"{bindir}/cp_attention", "--set", "run.memory_gib=2"] + att)
check(out.returncode == 2 and re.search(r"use more ranks \(about [0-9.]+ GiB per rank at cp (4|8)\)", out.stderr) is not None,
      "np 2, 2 GiB: refused (exit 2), more ranks suggested with the cp that fits")

small = [f"{bindir}/cp_attention", "--quiet", "--set", "run.repeats=1", "--set", "run.memory_gib=0.000001", "--out", os.path.join(tmp, "small.h5")]
for mode, code, warned in (("warn", 0, True), ("off", 0, False), ("refuse", 2, False)):
    out = run(mpirun + ["-n", "2"] + small + ["--set", f"run.memory_check={mode}"])
    w = out.stderr.count("warning: ")
    check(out.returncode == code and (w == 1) == warned,
          f"run.memory_check = {mode}: exit {out.returncode} (want {code}), {w} warning line(s)")

blocks = f"{inputs}/hybrid_nano_blocks.toml"
for gib in (80, 141):
    sweep = run([plan, "sweep", "--model", blocks, "--machine", f"{inputs}/machines/h200_nvlink_ib.toml", "--tokens",
                 "131072,524288,1048576", "--cp", "1,2,4,8,16,32,64", "--memory-gib", str(gib), "--bin", bindir,
                 "--out", os.path.join(tmp, "sweep.png")])
    planned = dict(re.findall(r"smallest cp that fits (\d+) tokens in [0-9.]+ GiB: (\S+)", sweep.stdout))
    for L in (131072, 524288, 1048576):
        m = memory("cp_hybrid", ["--deck", blocks, "--set", f"data.seqlen={L}", "--set", "run.device=cuda",
                                 "--set", f"run.memory_gib={gib}"], 1)
        got = str(m["smallest_cp"]) if m else None
        check(got is not None and planned.get(str(L)) == got,
              f"hybrid_nano_blocks bf16 {L} tokens on {gib} GiB: smallest cp {got} (driver) vs {planned.get(str(L))} (planner)")

for b in bad:
    print("  FAIL " + b)
finish("dry_run")
