"""The checks a job test makes: each printed as ok or FAIL as it is made, the failures kept in `bad`,
and finish(name) prints RESULT <name> PASS|FAIL and exits 1 on any failure."""
import sys

bad = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        bad.append(what)


def finish(name):
    print(f"RESULT {name} {'PASS' if not bad else 'FAIL'}")
    sys.exit(1 if bad else 0)
