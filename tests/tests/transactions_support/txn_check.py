"""Transactions against a running weir with confluent-kafka (librdkafka), one scenario per
subcommand; exits non-zero with a message on the first broken promise.

    python txn_check.py BOOTSTRAP SCENARIO [TOPIC]

Every wait is bounded (DEADLINE_S) and ends on an observable condition.
"""

import os
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

DEADLINE_S = 60.0
# Records per consume-transform-produce transaction.
TRANSFORM_BATCH = 10


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def producer(boot, txn_id, timeout_ms=60000):
    return Producer({
        "bootstrap.servers": boot,
        "transactional.id": txn_id,
        "transaction.timeout.ms": timeout_ms,
        "message.timeout.ms": timeout_ms,
        "linger.ms": 5,
    })


def consumer(boot, committed, group=None):
    return Consumer({
        "bootstrap.servers": boot,
        "group.id": group or f"reader-{os.getpid()}-{time.monotonic_ns()}",
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    })


def produce(p, topic, prefix, n):
    for i in range(n):
        p.produce(topic, value=f"{prefix}-{i}".encode(), partition=0)
    p.flush(30)


def read_all(boot, topic, committed, settle_s=1.5):
    """Reads partition 0 from the start until EOF was seen and nothing came for
    `settle_s`; returns (values, position)."""
    c = consumer(boot, committed)
    c.assign([TopicPartition(topic, 0, 0)])
    values, eof_at = [], None
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            if eof_at is not None and time.monotonic() - eof_at >= settle_s:
                break
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                eof_at = eof_at or time.monotonic()
                continue
            fail(f"consumer error {m.error()}")
        eof_at = None
        values.append(m.value().decode())
    position = c.position([TopicPartition(topic, 0)])[0].offset
    c.close()
    return values, position


def lso(boot, topic):
    """The LSO as a read_committed client sees it: ListOffsets latest, isolation 1."""
    c = consumer(boot, True)
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    c.close()
    return high


def wait_until(what, check):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    fail(f"timed out waiting for {what}")


def prefixes(values):
    return sorted({v.split("-")[0] for v in values})


def visibility(boot, topic):
    p = producer(boot, "txn-visibility")
    p.init_transactions(30)
    p.begin_transaction()
    produce(p, topic, "c", 10)
    p.commit_transaction(30)
    p.begin_transaction()
    produce(p, topic, "a", 10)
    p.abort_transaction(30)
    p.begin_transaction()
    produce(p, topic, "o", 5)  # left open: holds the LSO at its first offset
    committed, lso = read_all(boot, topic, True)
    if committed != [f"c-{i}" for i in range(10)]:
        fail(f"read_committed while open: {committed}")
    # 10 committed + COMMIT marker + 10 aborted + ABORT marker: the open one starts at 22.
    if lso != 22:
        fail(f"read_committed position {lso}, expected the LSO 22")
    uncommitted, _ = read_all(boot, topic, False)
    if prefixes(uncommitted) != ["a", "c", "o"] or len(uncommitted) != 25:
        fail(f"read_uncommitted: {uncommitted}")
    p.commit_transaction(30)
    committed, end = read_all(boot, topic, True)
    want = [f"c-{i}" for i in range(10)] + [f"o-{i}" for i in range(5)]
    if committed != want:
        fail(f"read_committed after commit: {committed}")
    print(f"ok visibility: lso held at {lso} while open, {end} after commit", flush=True)


def timeout(boot, topic):
    # Long enough that the "still open" checks below, which start consumers on a
    # loaded machine, finish well before the coordinator aborts it.
    p = producer(boot, "txn-timeout", timeout_ms=15000)
    p.init_transactions(30)
    p.begin_transaction()
    produce(p, topic, "t", 3)
    held, _ = read_all(boot, topic, True, settle_s=0.5)
    if held or lso(boot, topic) != 0:
        fail(f"open transaction visible or LSO moved: {held}, LSO {lso(boot, topic)}")
    started = time.monotonic()
    # The coordinator aborts it after transaction.timeout.ms: the LSO passes the marker.
    end = wait_until("the LSO to pass the timed-out transaction",
                     lambda: lso(boot, topic) >= 4 and lso(boot, topic))
    waited = time.monotonic() - started
    values, _ = read_all(boot, topic, True)
    if values:
        fail(f"timed-out transaction visible to read_committed: {values}")
    raw, _ = read_all(boot, topic, False)
    if raw != ["t-0", "t-1", "t-2"]:
        fail(f"read_uncommitted: {raw}")
    try:
        p.commit_transaction(10)
        fail("commit after the coordinator's timeout abort succeeded")
    except KafkaException as e:
        print(f"ok timeout: aborted after {waited:.1f}s (LSO {end}); commit then: {e}", flush=True)


def offsets(boot, topic):
    src = f"{topic}-in"
    plain = Producer({"bootstrap.servers": boot})
    for i in range(5):
        plain.produce(src, value=f"in-{i}".encode(), partition=0)
    plain.flush(30)
    group = "txn-offsets-group"
    c = consumer(boot, True, group)
    c.assign([TopicPartition(src, 0, 0)])
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < 5 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got += 1
    if got != 5:
        fail(f"read {got} input records")
    p = producer(boot, "txn-offsets")
    p.init_transactions(30)
    positions = c.position([TopicPartition(src, 0)])

    # A read_uncommitted client asks without require_stable: it sees what is committed.
    plain_reader = consumer(boot, False, group)

    def committed():
        return plain_reader.committed([TopicPartition(src, 0)], 10)[0].offset

    p.begin_transaction()
    produce(p, topic, "x", 5)
    p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
    p.abort_transaction(30)
    if committed() >= 0:
        fail(f"offset committed by an aborted transaction: {committed()}")
    p.begin_transaction()
    produce(p, topic, "y", 5)
    p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
    if committed() >= 0:
        fail(f"offset visible before the commit: {committed()}")
    # A read_committed client asks with require_stable (KIP-447): the pending offset is
    # UNSTABLE_OFFSET_COMMIT, which librdkafka retries until its timeout.
    unstable = None
    try:
        got = c.committed([TopicPartition(src, 0)], 2)[0]
        unstable = got.error
    except KafkaException as e:
        unstable = e.args[0]
    if unstable is None:
        fail("read_committed OffsetFetch answered a pending offset as stable")
    p.commit_transaction(30)
    got = committed()
    if got != 5:
        fail(f"committed offset after commit: {got}")
    stable = c.committed([TopicPartition(src, 0)], 10)[0].offset
    if stable != 5:
        fail(f"read_committed committed offset after commit: {stable}")
    c.close()
    plain_reader.close()
    print(f"ok offsets: none after abort or before commit ({unstable}), 5 after", flush=True)


def fencing(boot, topic):
    first = producer(boot, "txn-fence")
    first.init_transactions(30)
    first.begin_transaction()
    produce(first, topic, "zombie", 3)
    second = producer(boot, "txn-fence")
    second.init_transactions(30)  # fences the first; its open transaction is aborted
    second.begin_transaction()
    produce(second, topic, "live", 3)
    second.commit_transaction(30)
    fatal = None
    try:
        first.produce(topic, value=b"zombie-late", partition=0)
        first.flush(10)
        first.commit_transaction(10)
    except KafkaException as e:
        fatal = e.args[0]
    if fatal is not None and not fatal.fatal() and fatal.txn_requires_abort():
        # The refused produce made the transaction abortable; ending it meets the fence.
        try:
            first.abort_transaction(10)
        except KafkaException as e:
            fatal = e.args[0]
    if fatal is None or not fatal.fatal():
        fail(f"the fenced producer got no fatal error: {fatal}")
    values, _ = read_all(boot, topic, True)
    if values != ["live-0", "live-1", "live-2"]:
        fail(f"read_committed after fencing: {values}")
    print(f"ok fencing: first producer got {fatal.name()}", flush=True)


def open_and_die(boot, topic):
    p = producer(boot, "txn-restart", timeout_ms=8000)
    p.init_transactions(30)
    p.begin_transaction()
    produce(p, topic, "c", 2)
    p.commit_transaction(30)
    p.begin_transaction()
    produce(p, topic, "open", 3)
    print("ok open: transaction left open", flush=True)
    os._exit(0)


def after_restart(boot, topic):
    values, position = read_all(boot, topic, True, settle_s=0.5)
    rebuilt = lso(boot, topic)
    # 2 committed + marker: the open transaction starts at 3, and the LSO is rebuilt there
    # (unless the restarted coordinator already timed it out: then it is past the marker).
    if values != ["c-0", "c-1"] or rebuilt not in (3, 7):
        fail(f"after restart: read_committed {values} (position {position}), LSO {rebuilt}")
    end = wait_until("the restarted coordinator to abort the open transaction",
                     lambda: lso(boot, topic) >= 7 and lso(boot, topic))
    values, _ = read_all(boot, topic, True)
    if values != ["c-0", "c-1"]:
        fail(f"aborted records visible after the timeout: {values}")
    raw, _ = read_all(boot, topic, False)
    if raw != ["c-0", "c-1", "open-0", "open-1", "open-2"]:
        fail(f"read_uncommitted after restart: {raw}")
    print(f"ok restart: LSO {rebuilt} after restart, {end} after the timeout abort", flush=True)


def seed_input(boot, topic, n=60000):
    """Writes `n` input records in-0 .. in-(n-1) to `topic`-in (plain producer)."""
    plain = Producer({"bootstrap.servers": boot})
    for i in range(n):
        plain.produce(f"{topic}-in", value=f"in-{i}".encode(), partition=0)
    plain.flush(30)
    print(f"ok seeded {n}", flush=True)


def transform(boot, topic):
    """Consume-transform-produce: reads `topic`-in from the group's committed offset and
    writes out-<i> for each in-<i> to `topic`, 10 records per transaction, with the
    consumer offsets in the transaction. Exits 0 once the input is consumed; the test
    SIGKILLs it (and the broker) at random points before that."""
    src = f"{topic}-in"
    p = producer(boot, f"{topic}-app", timeout_ms=10000)
    p.init_transactions(60)
    c = Consumer({
        "bootstrap.servers": boot,
        "group.id": f"{topic}-app",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    c.assign([TopicPartition(src, 0, -1001)])  # from the committed offset
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        msgs = [m for m in c.consume(TRANSFORM_BATCH, 1.0) if not m.error()]
        if not msgs:
            _, high = c.get_watermark_offsets(TopicPartition(src, 0), timeout=10, cached=False)
            pos = c.position([TopicPartition(src, 0)])[0].offset
            if pos < 0:  # nothing consumed by this instance: where the group is
                pos = c.committed([TopicPartition(src, 0)], 30)[0].offset
            if pos >= high:
                print(f"ok transform done at {pos}", flush=True)
                return
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(topic, value=m.value().decode().replace("in-", "out-").encode(), partition=0)
        p.send_offsets_to_transaction(c.position([TopicPartition(src, 0)]),
                                      c.consumer_group_metadata(), 60)
        p.commit_transaction(60)
    fail("transform did not finish")


def verify_exactly_once(boot, topic, n=60000):
    values, _ = read_all(boot, topic, True)
    want = [f"out-{i}" for i in range(n)]
    if sorted(values, key=lambda v: int(v.split("-")[1])) != want or len(values) != n:
        dup = len(values) - len(set(values))
        missing = len(set(want) - set(values))
        fail(f"output: {len(values)} records, {dup} duplicated, {missing} missing")
    if values != want:
        fail("output out of input order")
    print(f"ok exactly once: {n} outputs, in order", flush=True)


def count(boot, topic):
    values, _ = read_all(boot, topic, True, settle_s=0.5)
    print(f"ok {len(values)} outputs committed, {len(values) - len(set(values))} duplicated",
          flush=True)


SCENARIOS = {
    "count": count,
    "seed-input": seed_input,
    "transform": transform,
    "verify-exactly-once": verify_exactly_once,
    "visibility": visibility,
    "timeout": timeout,
    "offsets": offsets,
    "fencing": fencing,
    "open-and-die": open_and_die,
    "after-restart": after_restart,
}

if __name__ == "__main__":
    boot, scenario = sys.argv[1], sys.argv[2]
    SCENARIOS[scenario](boot, sys.argv[3] if len(sys.argv) > 3 else scenario)
