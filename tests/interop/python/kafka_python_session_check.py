"""kafka-python: a consumer of 24 partitions uses KIP-227 incremental fetch sessions
against weir (its FetchSessionHandler logs every session step at DEBUG), reads back every
record sent in two rounds — the second while the session is open, so those records arrive
in incremental responses — and infers a current Kafka from weir's versions (it inferred
"2.8" while weir stopped at Fetch 12 / ListOffsets 6). kafka-python 3.0.12's fetcher itself
still sends Fetch ≤ 12 (its own cap), so its sessions name topics by name."""

import logging
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest

import common

PARTITIONS = 24


class Seen(logging.Handler):
    """Counts kafka-python's fetch-session log lines."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.created = 0
        self.incremental = 0
        self.refused = []

    def emit(self, record):
        msg = record.getMessage()
        if "created a new incremental fetch session" in msg:
            self.created += 1
        elif "sent an incremental fetch response for session" in msg:
            self.incremental += 1
        elif "was unable to process the fetch request" in msg or "invalid" in msg:
            self.refused.append(msg)


def produce(bootstrap, topic, tag):
    sent = [(f"key-{i % 31}".encode(), f"{tag}-{i}".encode()) for i in range(240)]
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    futures = [p.send(topic, key=k, value=v) for k, v in sent]
    p.flush(30)
    for f in futures:
        f.get(timeout=30)
    p.close()
    return sent


def main(bootstrap, topic):
    seen = Seen()
    fetcher_log = logging.getLogger("kafka.consumer.fetcher")
    fetcher_log.setLevel(logging.DEBUG)
    fetcher_log.addHandler(seen)

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    admin.close()

    sent = produce(bootstrap, topic, "first")
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100)
    parts = [TopicPartition(topic, i) for i in range(PARTITIONS)]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    got, end = [], common.deadline()

    def read_until(n):
        while len(got) < n and time.monotonic() < end:
            for tp, msgs in c.poll(timeout_ms=300).items():
                for m in msgs:
                    got.append((tp.partition, m.offset, m.key, m.value))

    read_until(len(sent))
    # A few idle rounds: incremental fetches with nothing new.
    idle_end = time.monotonic() + 2
    while time.monotonic() < idle_end:
        c.poll(timeout_ms=200)
    more = produce(bootstrap, topic, "second")
    read_until(len(sent) + len(more))
    # What kafka-python negotiated and inferred (private attributes, read only to check).
    versions = c._client._manager.broker_version_data
    fetch_version = versions.api_version(FetchRequest)
    broker_version = versions.broker_version
    c.close()

    if seen.created < 1:
        common.fail("no fetch session was created (weir answered session id 0)")
    if seen.incremental < 3:
        common.fail(f"only {seen.incremental} incremental fetch responses")
    if seen.refused:
        common.fail(f"session errors: {seen.refused[:3]}")
    if fetch_version < 13 or broker_version < (3, 9):
        common.fail(f"kafka-python sees Fetch v{fetch_version}, infers Kafka {broker_version}")
    # Offsets dense per partition across both rounds, every record once.
    common.check(sent + more, got)
    print(f"sessions created {seen.created}, incremental responses {seen.incremental}, "
          f"Fetch v{fetch_version}, kafka-python infers broker {broker_version}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
