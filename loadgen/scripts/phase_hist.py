#!/usr/bin/env python3
"""The acks=all round trip's phases from two scrapes of each node's /metrics.

    phase_hist.py DIR

DIR holds before-N.txt and after-N.txt (N = node) scraped around one load step
(cluster_sweep.sh PHASES=1 writes them around the half-load RF 3 step). For each
histogram of the round trip, summed over the nodes, prints the observations of the step
(after - before), their mean and the p50 / p99 read off the buckets (linear inside a
bucket, so only as fine as the bounds).
"""
import glob
import os
import re
import sys

PHASES = [
    ("weir_produce_local_seconds", "leader: produce append until its own write completed"),
    ("weir_produce_replication_wait_seconds", "leader: own write done until the HW covers it"),
    ("weir_follower_fetch_turnaround_seconds", "leader: follower answered with records -> its next fetch"),
    ("weir_replica_fetch_response_seconds", "follower: Fetch sent -> response in (long poll included)"),
    ("weir_replica_append_seconds", "follower: append until written"),
    ("weir_fetch_wait_seconds", "leader: a Fetch parked waiting for data"),
]
LINE = re.compile(r'^(\w+?)(_bucket|_sum|_count)(\{[^}]*\})? (\S+)$')


def scrape(path):
    """{metric: {"buckets": {le: n}, "sum": s, "count": c}} of the histograms without
    labels other than le (the node-wide ones)."""
    out = {}
    for line in open(path):
        m = LINE.match(line.strip())
        if not m:
            continue
        name, kind, labels, value = m.groups()
        h = out.setdefault(name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        if kind == "_bucket":
            le = re.search(r'le="([^"]+)"', labels or "")
            if le is None or "," in (labels or ""):
                continue
            h["buckets"][le.group(1)] = float(value)
        elif labels:
            continue
        elif kind == "_sum":
            h["sum"] = float(value)
        else:
            h["count"] = float(value)
    return out


def add(total, h, sign):
    for le, n in h["buckets"].items():
        total["buckets"][le] = total["buckets"].get(le, 0.0) + sign * n
    total["sum"] += sign * h["sum"]
    total["count"] += sign * h["count"]


def quantile(buckets, count, q):
    """From cumulative buckets {le: n}: the q-quantile, linear inside its bucket."""
    bounds = sorted(((float("inf") if le == "+Inf" else float(le)), n) for le, n in buckets.items())
    want = q * count
    lo, below = 0.0, 0.0
    for le, n in bounds:
        if n >= want:
            if le == float("inf"):
                return lo
            inside = n - below
            return lo + (le - lo) * ((want - below) / inside if inside > 0 else 1.0)
        lo, below = le, n
    return lo


def main(d):
    nodes = sorted({re.sub(r"\D", "", os.path.basename(p)) for p in glob.glob(f"{d}/before-*.txt")})
    totals = {}
    for n in nodes:
        before, after = scrape(f"{d}/before-{n}.txt"), scrape(f"{d}/after-{n}.txt")
        for name, _ in PHASES:
            t = totals.setdefault(name, {"buckets": {}, "sum": 0.0, "count": 0.0})
            if name in after:
                add(t, after[name], 1)
            if name in before:
                add(t, before[name], -1)
    print(f"{'phase':<40} {'count':>8} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7}  what")
    for name, what in PHASES:
        t = totals[name]
        c = t["count"]
        if c <= 0:
            print(f"{name:<40} {0:>8}")
            continue
        mean = t["sum"] / c * 1e3
        p50 = quantile(t["buckets"], c, 0.50) * 1e3
        p99 = quantile(t["buckets"], c, 0.99) * 1e3
        print(f"{name:<40} {c:>8.0f} {mean:>8.3f} {p50:>7.3f} {p99:>7.3f}  {what}")


if __name__ == "__main__":
    main(sys.argv[1])
