"""Shared by the Python interop checks: the records each client sends and the check
that what it read back is exactly that, in order per partition."""

import sys
import time

RECORDS = 300
PARTITIONS = 3
DEADLINE_S = 60


def records(client):
    """(key, value) pairs; keys spread over partitions, values unique per client."""
    return [(f"key-{i % 17}".encode(), f"{client}-value-{i}".encode()) for i in range(RECORDS)]


def check(sent, got):
    """sent: [(key, value)]; got: [(partition, offset, key, value)]. Every sent record read
    back once; offsets dense per partition; per key (one partition), send order kept."""
    if len(got) != len(sent):
        fail(f"read {len(got)} records, sent {len(sent)}")
    by_part = {}
    for p, o, k, v in got:
        by_part.setdefault(p, []).append((o, k, v))
    for p, rows in by_part.items():
        rows.sort()
        offsets = [o for o, _, _ in rows]
        if offsets != list(range(len(rows))):
            fail(f"partition {p}: offsets {offsets[:5]}... not dense from 0")
    order = {}
    for p, rows in sorted(by_part.items()):
        for _, k, v in rows:
            order.setdefault(k, []).append(v)
    want = {}
    for k, v in sent:
        want.setdefault(k, []).append(v)
    if order != want:
        fail("records differ from what was sent (content or per-key order)")


def deadline():
    return time.monotonic() + DEADLINE_S


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)
