#!/usr/bin/python3
"""jobs/post/hcp_documents.py on cp_attention runs at np 4, data.partition = dcs, documents and
groups, on a mix of two long documents among short ones: the table's bytes equal the byte model on
every rank and the placement (groups included) the planner's (RESULT documents EXACT); documents
pads only the split documents (fewer pad tokens than dcs) and sends fewer bytes per rank; groups
splits each long document over 2 ranks, not 4, and sends fewer bytes still; the figure is written;
with every document whole nothing is sent and nothing padded; a file of another driver is refused
(exit 2).
Usage: documents_table.py BINDIR MPIRUN...   Prints each check and RESULT documents_table PASS|FAIL."""
import os
import subprocess
import sys
import tempfile

from checklist import check, finish

bindir, mpirun = sys.argv[1], sys.argv[2:]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
post = os.path.join(root, "jobs", "post", "hcp_documents.py")
tmp = tempfile.mkdtemp()


def run(name, sets):
    out = os.path.join(tmp, name + ".h5")
    cmd = mpirun + ["-n", "4", f"{bindir}/cp_attention", "--quiet", "--out", out, "--set", "parallel.attention=p2p",
                    "--set", "data.seq_lens=5,1,17,300,33,64,9,2,290", "--set", "attention.head_dim=8",
                    "--set", "run.repeats=1", "--set", "run.warmup=0"] + sets
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, f"{name}: exit {r.returncode} {r.stderr[-300:]}")
    return out


def table(files, extra=()):
    r = subprocess.run(["/usr/bin/python3", post, "--bin", bindir, *extra] + files, capture_output=True, text=True)
    print(r.stdout + r.stderr)
    rows = {}
    for line in r.stdout.splitlines():
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) == 10 and c[0].isdigit():
            rows[c[1]] = {"split": c[2], "pads": int(c[3]), "sent_max": float(c[4].split()[0])}
    return r.returncode, r.stdout, rows


dcs, docs = run("dcs", ["--set", "data.partition=dcs"]), run("documents", ["--set", "data.partition=documents"])
groups = run("groups", ["--set", "data.partition=groups"])
png = os.path.join(tmp, "documents.png")
rc, text, rows = table([dcs, docs, groups], ["--plot", png])
check(rc == 0 and "RESULT documents EXACT" in text and "3/3" in text,
      "bytes = model on every rank, placement (groups too) = planner's")
check(os.path.getsize(png) > 10000 if os.path.exists(png) else False, "the figure is written")
if set(rows) == {"dcs", "documents", "groups"}:
    check(rows["documents"]["pads"] < rows["dcs"]["pads"],
          f"documents pads only the split documents: {rows['documents']['pads']} < {rows['dcs']['pads']}")
    check(rows["documents"]["sent_max"] < rows["dcs"]["sent_max"],
          f"documents sends less: {rows['documents']['sent_max']} < {rows['dcs']['sent_max']} MiB")
    check(rows["documents"]["split"] == "2x4" and rows["groups"]["split"] == "2x2",
          f"documents splits over the group, groups over 2 ranks: {rows['documents']['split']}, {rows['groups']['split']}")
    check(rows["groups"]["sent_max"] < rows["documents"]["sent_max"],
          f"groups sends less still: {rows['groups']['sent_max']} < {rows['documents']['sent_max']} MiB")
else:
    check(False, f"one row per layout: {sorted(rows)}")
whole = run("whole", ["--set", "data.partition=documents", "--set", "data.doc_split_len=100000"])
rc, text, rows = table([whole])
check(rc == 0 and rows.get("documents", {}).get("pads") == 0 and rows["documents"]["sent_max"] == 0,
      "every document whole: 0 pad tokens, nothing sent")
other = os.path.join(tmp, "mamba.h5")
subprocess.run(mpirun + ["-n", "1", f"{bindir}/cp_mamba", "--quiet", "--out", other, "--set", "run.repeats=1"],
               capture_output=True)
r = subprocess.run(["/usr/bin/python3", post, "--bin", bindir, other], capture_output=True, text=True)
check(r.returncode == 2 and "not a cp_attention THD run" in r.stderr, f"a cp_mamba file refused: exit {r.returncode}")
finish("documents_table")
