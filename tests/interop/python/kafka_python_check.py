"""kafka-python: create a topic, list topics, produce with keys at acks=all, read it
all back by assignment (group_id=None)."""

import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

import common


def main(bootstrap, topic):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(topic, num_partitions=common.PARTITIONS, replication_factor=1)])
    if topic not in admin.list_topics():
        common.fail(f"{topic} not in list_topics()")
    admin.close()

    sent = common.records("kafka-python")
    # kafka-python 3.x's default: idempotence on, so this also runs its InitProducerId
    # and the sequenced produce path against weir.
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip", linger_ms=5)
    futures = [p.send(topic, key=k, value=v, headers=[("h", k)]) for k, v in sent]
    p.flush(30)
    for f in futures:
        f.get(timeout=30)
    # Idempotence really ran: the producer holds an id from weir's InitProducerId
    # (a private attribute of kafka-python 3.x, read only to check this).
    tm = p._transaction_manager
    if tm is None or tm.producer_id_and_epoch.producer_id < 0:
        common.fail("kafka-python producer has no producer id: idempotence did not run")
    p.close()

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    parts = [TopicPartition(topic, i) for i in range(common.PARTITIONS)]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    got, end = [], common.deadline()
    while len(got) < len(sent) and time.monotonic() < end:
        for tp, msgs in c.poll(timeout_ms=500).items():
            for m in msgs:
                if dict(m.headers).get("h") != m.key:
                    common.fail(f"header lost at {tp.partition}/{m.offset}")
                got.append((tp.partition, m.offset, m.key, m.value))
    c.close()
    common.check(sent, got)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
