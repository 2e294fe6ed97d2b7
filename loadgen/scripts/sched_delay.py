#!/usr/bin/env python3
"""How long runnable threads waited for a CPU, from `perf sched timehist` (issue 11).

An acks=all produce at RF 3 is a relay: the leader appends, each follower must be
scheduled to fetch and append, the leader again to advance the high watermark and answer.
On a machine whose cores the nodes share, every hop can wait for a CPU. This prints, for
the given node processes (by pid) and for everything else, the scheduler delay (wakeup to
running) of each switch-in: count, p50, p99, p99.9, max, and the share of delays over 1 ms.

    perf sched record -a -o sched.data -- sleep 4
    perf sched timehist -i sched.data > timehist.txt
    python3 loadgen/scripts/sched_delay.py timehist.txt PID [PID ...]
"""
import re
import sys

LINE = re.compile(
    r"^\s*[\d.]+\s+\[\d+\]\s+(?P<comm>.+?)\[(?P<tid>\d+)(?:/(?P<pid>\d+))?\]"
    r"\s+(?P<wait>[\d.]+)\s+(?P<delay>[\d.]+)\s+(?P<run>[\d.]+)"
)


def pct(sorted_ms, q):
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, pids = sys.argv[1], set(sys.argv[2:])
    groups = {"nodes": [], "others": []}
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m or m.group("comm").startswith("<idle>"):
            continue
        pid = m.group("pid") or m.group("tid")
        groups["nodes" if pid in pids else "others"].append(float(m.group("delay")))
    print(f"{'threads':<8} {'switch-ins':>10} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'max ms':>8} {'> 1 ms':>7}")
    for name, delays in groups.items():
        delays.sort()
        over = sum(d > 1.0 for d in delays) / max(len(delays), 1)
        print(f"{name:<8} {len(delays):>10} {pct(delays, 0.5):>8.3f} {pct(delays, 0.99):>8.3f} "
              f"{pct(delays, 0.999):>9.3f} {(delays[-1] if delays else float('nan')):>8.3f} {over:>7.1%}")


if __name__ == "__main__":
    main()
