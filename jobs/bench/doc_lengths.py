#!/usr/bin/env python3
"""Document lengths for a packed (THD) batch, drawn from a long-tailed distribution, seeded.

  doc_lengths.py [--tokens 65536] [--median 1000] [--sigma 1.6] [--max 32768] [--min 16] [--seed 7]

Lengths are log-normal (median --median, log-space standard deviation --sigma), clipped to
[--min, --max], drawn until the pack holds --tokens tokens (the last document is cut to fit). With
sigma 1.6 about one document in 25 is longer than 16K, so a 64K pack usually holds one or two of
them beside dozens of short ones: the mix that packed CP has to place. Prints the comma-separated
list that data.seq_lens takes; the same arguments print the same list (Python's Mersenne Twister).
"""
import argparse
import math
import random


def lengths(tokens, median, sigma, lo, hi, seed):
    rng = random.Random(seed)
    out, left = [], tokens
    while left > 0:
        n = int(round(rng.lognormvariate(math.log(median), sigma)))
        n = min(max(n, lo), hi, left)
        out.append(n)
        left -= n
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--median", type=float, default=1000)
    ap.add_argument("--sigma", type=float, default=1.6)
    ap.add_argument("--min", type=int, default=16)
    ap.add_argument("--max", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    print(", ".join(str(n) for n in lengths(a.tokens, a.median, a.sigma, a.min, a.max, a.seed)))


if __name__ == "__main__":
    main()
