#!/usr/bin/env python3
"""Does the leader copy record bytes in user space to serve replica fetches? (issue 11)

Reads `perf script -F comm,ip,sym` output of a `perf record --call-graph dwarf` of a weir
leader (cluster_sweep.sh PERF=1 writes $OUT/perf.data) and prints: samples under the Fetch
handler (`weir::api::fetch`) and under the response send path (`server::conn::send_now`,
the vectored sendmsg from the log's buffers), their leaf symbols, and every memmove/memcpy
leaf with the weir function that called it.

    perf script -i target/lg-cluster-sweep/perf.data --no-inline -F comm,ip,sym > stacks.txt
    python3 loadgen/scripts/perf_fetch_copies.py stacks.txt
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from perfscript import stacks  # noqa: E402  (bench/perfscript.py, the shared parser)

COPY = ("memmove", "memcpy")


def first_weir(frames):
    return next((f for f in frames if "weir::" in f), "?")


def main():
    all_stacks = list(stacks(sys.argv[1]))
    total = max(len(all_stacks), 1)
    print(f"samples: {len(all_stacks)}")
    groups = {
        "Fetch handler (weir::api::fetch)": lambda fs: any("api::fetch" in f for f in fs),
        "send path (server::conn::send_now)": lambda fs: any("conn::send_now" in f for f in fs),
    }
    for name, pick in groups.items():
        g = [fs for fs in all_stacks if pick(fs)]
        copies = [fs for fs in g if any(c in fs[0] for c in COPY)]
        print(f"\n{name}: {len(g)} samples ({100 * len(g) / total:.1f}%), "
              f"memmove/memcpy leaves {len(copies)} ({100 * len(copies) / total:.2f}%)")
        for sym, n in collections.Counter(fs[0] for fs in g).most_common(8):
            print(f"  {100 * n / total:5.2f}%  {sym}")
        for fs in copies:
            print("  copy:", " <- ".join(fs[:4]))
    copies = [fs for fs in all_stacks if any(c in fs[0] for c in COPY)]
    print(f"\nall memmove/memcpy leaves: {len(copies)} ({100 * len(copies) / total:.1f}%), by weir caller:")
    for sym, n in collections.Counter(first_weir(fs) for fs in copies).most_common(10):
        print(f"  {100 * n / total:5.2f}%  {sym}")


if __name__ == "__main__":
    main()
