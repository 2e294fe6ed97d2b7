"""aiokafka: create a topic, list topics, produce with keys at acks=all, read it all
back by assignment (group_id=None)."""

import asyncio
import sys
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import common


async def main(bootstrap, topic):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=common.PARTITIONS, replication_factor=1)])
    topics = await admin.list_topics()
    await admin.close()
    if topic not in topics:
        common.fail(f"{topic} not in list_topics(): {topics}")

    sent = common.records("aiokafka")
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="lz4", linger_ms=5)
    await p.start()
    try:
        futs = [await p.send(topic, key=k, value=v, headers=[("h", k)]) for k, v in sent]
        await asyncio.wait_for(asyncio.gather(*futs), 30)
    finally:
        await p.stop()

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest")
    await c.start()
    got = []
    try:
        parts = [TopicPartition(topic, i) for i in range(common.PARTITIONS)]
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        end = common.deadline()
        while len(got) < len(sent) and time.monotonic() < end:
            batch = await c.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for m in msgs:
                    if dict(m.headers).get("h") != m.key:
                        common.fail(f"header lost at {tp.partition}/{m.offset}")
                    got.append((tp.partition, m.offset, m.key, m.value))
    finally:
        await c.stop()
    common.check(sent, got)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 120))
