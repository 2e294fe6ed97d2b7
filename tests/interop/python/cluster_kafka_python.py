"""kafka-python against a weir cluster (run by tests/tests/cluster_quorum.rs, not by
run.sh): create a replicated topic through one node, produce at acks=all through a second
node as the only bootstrap, read everything back through a third.

usage: cluster_kafka_python.py CREATE_BOOTSTRAP PRODUCE_BOOTSTRAP CONSUME_BOOTSTRAP TOPIC"""

import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

import common


def main(create_at, produce_at, consume_at, topic):
    admin = KafkaAdminClient(bootstrap_servers=create_at, request_timeout_ms=30000)
    admin.create_topics([NewTopic(topic, num_partitions=common.PARTITIONS, replication_factor=3)])
    admin.close()

    sent = common.records("kafka-python-cluster")
    p = KafkaProducer(bootstrap_servers=produce_at, acks="all", linger_ms=5, retries=20,
                      request_timeout_ms=30000)
    # The topic reaches the producer's node a moment after the controller commits it.
    end = common.deadline()
    while p.partitions_for(topic) is None or len(p.partitions_for(topic)) < common.PARTITIONS:
        if time.monotonic() > end:
            common.fail(f"{topic} never appeared in {produce_at}'s metadata")
        time.sleep(0.1)
    leaders = {p._metadata.leader_for_partition(TopicPartition(topic, i))
               for i in range(common.PARTITIONS)}
    futures = [p.send(topic, key=k, value=v) for k, v in sent]
    p.flush(30)
    for f in futures:
        f.get(timeout=30)
    p.close()
    if len(leaders) < 2:
        common.fail(f"partitions led by {leaders}: not spread over the cluster")

    c = KafkaConsumer(bootstrap_servers=consume_at, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    parts = [TopicPartition(topic, i) for i in range(common.PARTITIONS)]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    got, end = [], common.deadline()
    while len(got) < len(sent) and time.monotonic() < end:
        for tp, msgs in c.poll(timeout_ms=500).items():
            for m in msgs:
                got.append((tp.partition, m.offset, m.key, m.value))
    c.close()
    common.check(sent, got)
    print(f"ok: {len(got)} records through {len(leaders)} leaders")


if __name__ == "__main__":
    main(*sys.argv[1:5])
