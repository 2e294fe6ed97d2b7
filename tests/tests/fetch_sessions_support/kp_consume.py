"""kafka-python consumer for tests/fetch_sessions_wire.rs: reads every partition of a topic
from offset 0 by assignment (no group, so no ListOffsets or coordinator before the first
fetch), printing one line per record as it arrives:

    REC <partition> <offset> <key>

until it has read EXPECT records (and, if STOP_FILE is given, until that file exists),
then polls one more second so duplicates would show, and prints DONE <count>. Fails
(exit 1) if the deadline passes first. kafka-python (3.x) uses KIP-227 fetch sessions by
itself; the test watches them on the wire."""

import os
import sys
import time

from kafka import KafkaConsumer, TopicPartition

DEADLINE_S = 240


def main(bootstrap, topic, partitions, expect, client_id, stop_file=None):
    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=None,
                      enable_auto_commit=False, fetch_max_wait_ms=100,
                      request_timeout_ms=60000)
    parts = [TopicPartition(topic, p) for p in range(partitions)]
    c.assign(parts)
    for tp in parts:
        c.seek(tp, 0)
    got, end = 0, time.monotonic() + DEADLINE_S

    def poll(timeout_ms):
        nonlocal got
        for tp, msgs in c.poll(timeout_ms=timeout_ms).items():
            for m in msgs:
                key = m.key.decode() if m.key is not None else "-"
                print(f"REC {tp.partition} {m.offset} {key}", flush=True)
                got += 1

    def done():
        return got >= expect and (stop_file is None or os.path.exists(stop_file))

    while not done():
        if time.monotonic() > end:
            print(f"FAIL: read {got} of {expect} records in {DEADLINE_S} s", file=sys.stderr)
            sys.exit(1)
        poll(200)
    tail = time.monotonic() + 1.0
    while time.monotonic() < tail:
        poll(100)
    c.close()
    print(f"DONE {got}", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), a[4], a[5] if len(a) > 5 else None)
