"""confluent-kafka (librdkafka inside the wheel): create a topic, list topics, produce
with keys and headers at acks=all, read it all back by assignment (no group)."""

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic

import common


def main(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, common.PARTITIONS, 1)]).values():
        f.result(timeout=30)
    listed = admin.list_topics(timeout=30).topics
    if topic not in listed or len(listed[topic].partitions) != common.PARTITIONS:
        common.fail(f"{topic} not listed with {common.PARTITIONS} partitions: {sorted(listed)}")

    sent = common.records("confluent")
    acked, errors = [], []

    def on_delivery(err, msg):
        (errors if err else acked).append(err or msg)

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": "zstd", "linger.ms": 5})
    for k, v in sent:
        p.produce(topic, key=k, value=v, headers=[("h", k)], on_delivery=on_delivery)
    if p.flush(30) != 0 or errors or len(acked) != len(sent):
        common.fail(f"produce: {len(acked)} acked, errors {errors[:3]}")

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "interop-confluent",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(common.PARTITIONS)])
    got, end = [], common.deadline()
    while len(got) < len(sent) and time.monotonic() < end:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        if dict(m.headers() or []).get("h") != m.key():
            common.fail(f"header lost at {m.partition()}/{m.offset()}")
        got.append((m.partition(), m.offset(), m.key(), m.value()))
    c.close()
    common.check(sent, got)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
