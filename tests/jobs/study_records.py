#!/usr/bin/python3
"""What a scaling study reads, checked on small runs:
  1. a long run says where it is: at run.repeats = 1 a line per case names the case, how many are
     done and the run's time left;
  2. /config holds counts as integers and the launcher's line (mpirun ...) as command_line;
  3. runs of dcs and documents layouts stay apart: plot-scaling draws a line per layout, scale has a
     layout column, plot-breakdown splits cp_attention's step into compute and communication wait
     (bars as tall as a timed step), and hcp_documents.py's step is the table's;
  4. the table carries min..max over repeats (the median inside) and tokens/s; the comm table
     nccl-tests' algbw and busbw per collective.
Usage: study_records.py BINDIR MPIRUN...   Prints each check and RESULT study_records PASS|FAIL."""
import os
import re
import subprocess
import sys
import tempfile

import h5py

from checklist import check, finish

bindir, mpirun = sys.argv[1], sys.argv[2:]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
post = [sys.executable, os.path.join(root, "jobs", "post", "hcp_post.py")]
tmp = tempfile.mkdtemp()


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


# 1-2: four cases of a few seconds each, one timed step each.
long = os.path.join(tmp, "long.h5")
r = run(mpirun + ["-n", "2", f"{bindir}/cp_attention", "--deck", f"{root}/inputs/attention_scaling.toml",
                  "--set", "data.seqlen=4096", "--set", "run.repeats=1", "--set", "run.warmup=0", "--out", long])
lines = re.findall(r"^# cp_attention: case (\S+) \((\d)/4\); (\d) done in [0-9.]+ s, the run ~[0-9.]+ s more$",
                   r.stderr, re.M)
check(r.returncode == 0 and len(lines) >= 2 and all(int(k) == int(d) + 1 for _, k, d in lines),
      f"run.repeats = 1: a progress line per case names it and the run's time left ({len(lines)} lines: {lines})")
if os.path.exists(long):
    with h5py.File(long, "r") as f:
        a = f["config"].attrs
        ints = {k: a[k].dtype.kind for k in ("cp_size", "world_size", "node_cores", "ranks_per_node", "gpus_per_node")}
        cmdline = a["command_line"]
        cmdline = cmdline.decode() if isinstance(cmdline, bytes) else cmdline
    check(all(v == "i" for v in ints.values()), f"/config counts are integers ({ints})")
    exe = os.path.basename(mpirun[0])
    check(cmdline.split()[0].endswith(exe) and "cp_attention" in cmdline and "data.seqlen=4096" in cmdline,
          f"/config command_line is the launcher's line ({cmdline[:90]}...)")

# 3-4: the built-in packed batch laid out by dcs and by documents, cp 1, 2, 4.
files = []
for np_ in (1, 2, 4):
    for part in ("dcs", "documents"):
        if np_ == 1 and part == "documents":
            continue
        out = os.path.join(tmp, f"att_np{np_}_{part}.h5")
        r = run(mpirun + ["-n", str(np_), f"{bindir}/cp_attention", "--quiet", "--set", "parallel.attention=p2p",
                          "--set", f"data.partition={part}", "--set", "run.repeats=3", "--out", out])
        check(r.returncode == 0, f"cp_attention np {np_} {part}: exit {r.returncode}")
        files.append(out)
with h5py.File(files[-1], "r") as f:
    kinds = {k: f["partition"][k].dtype.kind for k in ("lengths", "owner", "rows", "tokens", "pad_tokens")}
check(all(v == "i" for v in kinds.values()), f"/partition counts are integers ({kinds})")
r = run(post + ["plot-scaling", "--out", os.path.join(tmp, "scaling.png")] + files)
check(r.returncode == 0 and "(6 points, 2 strategies)" in r.stdout,
      f"plot-scaling: one line per layout, the cp=1 run in both ({r.stdout.strip()})")
r = run(post + ["scale"] + files)
rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  cp_attention")]
check(r.returncode == 0 and {row[5] for row in rows} == {"dcs", "documents"}, "scale: a layout column (dcs, documents)")
r = run(post + ["plot-breakdown", "--out", os.path.join(tmp, "breakdown.png")] + files)
check(r.returncode == 0 and "(5 strategies, 3 phases)" in r.stdout,
      f"plot-breakdown of cp_attention files: compute, communication wait, other ({r.stdout.strip()} {r.stderr.strip()})")
r = run(post + ["table"] + files)
ok = r.returncode == 0
for ln in r.stdout.splitlines()[1:]:
    m = re.match(r"\s+(\S+)\s+\d+\s+p2p\s+([0-9.]+)\s+([0-9.]+)\.\.([0-9.]+)\s+([0-9.e+]+)", ln)
    ok = ok and m is not None and float(m.group(3)) <= float(m.group(2)) <= float(m.group(4)) and float(m.group(5)) > 0
check(ok, "table: the step's median lies within its min..max; tokens/s beside it")
tf = [ln.split()[6] for ln in r.stdout.splitlines()[1:]]
check(all(re.fullmatch(r"[0-9.e+-]+", x) and float(x) > 0 for x in tf), f"table: attention TFLOP/s per rank ({tf})")
table = {ln.split()[0]: float(ln.split()[3]) for ln in r.stdout.splitlines()[1:]}
r = run([sys.executable, os.path.join(root, "jobs", "post", "hcp_documents.py"), "--bin", bindir]
        + [f for f in files if "np1" not in f])
doc_rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| 2 ") or ln.startswith("| 4 ")]
steps = [float(ln.strip("|").split("|")[-1].split()[0]) for ln in doc_rows]
want = [table[os.path.basename(f)] for f in sorted((f for f in files if "np1" not in f),
                                                   key=lambda p: (int(re.search(r"np(\d)", p).group(1)), p))]
check(r.returncode == 0 and len(steps) == 4 and all(abs(a - b) <= 0.51 for a, b in zip(steps, want)),
      f"hcp_documents.py's step is the table's, to its whole ms ({steps} / {want})")
att2 = os.path.join(tmp, "att2_all.h5")
run(mpirun + ["-n", "2", f"{bindir}/cp_attention", "--quiet", "--set", "run.repeats=2", "--out", att2])
r = run(post + ["comm", att2])
ag = re.search(r"allgather\s+all_gather\s+\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+([0-9.]+)", r.stdout)
check(r.returncode == 0 and ag is not None and abs(float(ag.group(1)) - 2 * float(ag.group(2))) <= 0.002 * float(ag.group(1)) + 1e-3,
      f"comm: all_gather's algbw is busbw x n/(n-1) = 2 busbw at cp 2 ({ag.groups() if ag else r.stdout[:200]})")
finish("study_records")
