#!/usr/bin/env python3
"""Where a process's CPU goes, from a `perf record --call-graph dwarf` (issue 14).

Reads `perf script -F comm,tid,ip,sym` output and prints the top self (leaf) symbols with
their share of samples, and for each of the top ones the weir functions that called it
(the first frame naming `weir::`), so a copy or a memset shows with the code that did it.

    perf record --call-graph dwarf,16384 -F 499 -p PID -o perf.data -- sleep 8
    perf script -i perf.data --no-inline -F comm,tid,ip,sym > stacks.txt
    python3 bench/perf_top.py stacks.txt [TOP]
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfscript import stacks  # noqa: E402  (the parser beside this script)

CALLERS_SHOWN = 4


def short(sym):
    sym = sym.split(" (")[0]
    return sym if len(sym) <= 110 else sym[:107] + "..."


def first_weir(frames):
    caller = next((f for f in frames[1:] if "weir" in f and "::" in f), None)
    return short(caller) if caller else "(no weir frame)"


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    all_stacks = list(stacks(sys.argv[1]))
    total = max(len(all_stacks), 1)
    leaves = collections.Counter(short(s[0]) for s in all_stacks)
    callers = collections.defaultdict(collections.Counter)
    for s in all_stacks:
        callers[short(s[0])][first_weir(s)] += 1
    inclusive = collections.Counter()
    for s in all_stacks:
        for f in {short(f) for f in s if "weir" in f and "::" in f}:
            inclusive[f] += 1
    print(f"samples: {len(all_stacks)}")
    for sym, n in leaves.most_common(top):
        print(f"{100 * n / total:6.2f} %  {sym}")
        for caller, m in callers[sym].most_common(CALLERS_SHOWN):
            print(f"            {100 * m / total:6.2f} %  <- {caller}")
    print("\ninclusive, weir functions:")
    for sym, n in inclusive.most_common(top):
        print(f"{100 * n / total:6.2f} %  {sym}")


if __name__ == "__main__":
    main()
