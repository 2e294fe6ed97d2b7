"""kafka-python group consumers: two members of one group split a 3-partition topic and
read every record (committing after each poll); after they leave, a new member of the
group resumes at the committed offsets and reads exactly the records produced since."""

import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition, errors
from kafka.admin import KafkaAdminClient, NewTopic

import common


def produce(bootstrap, topic, first, n):
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    futures = [p.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
               for i in range(first, first + n)]
    p.flush(30)
    for f in futures:
        f.get(timeout=30)
    p.close()


def member(bootstrap, topic, group):
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      session_timeout_ms=10000, heartbeat_interval_ms=1000,
                      max_poll_records=20)
    return c


def poll_into(c, got):
    for tp, msgs in c.poll(timeout_ms=200).items():
        for m in msgs:
            got.append((tp.partition, m.offset, m.value))
    if got:
        try:
            c.commit()
        except (errors.RebalanceInProgressError, errors.CommitFailedError,
                errors.IllegalGenerationError, errors.UnknownMemberIdError):
            # A rebalance is under way (Kafka answers the same): these records may be
            # delivered again to the partition's next owner.
            pass


def main(bootstrap, topic):
    group = topic + "-group"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(topic, num_partitions=common.PARTITIONS, replication_factor=1)])
    admin.close()
    produce(bootstrap, topic, 0, 300)

    a, b = member(bootstrap, topic, group), member(bootstrap, topic, group)
    got_a, got_b, end = [], [], common.deadline()
    split = False
    while time.monotonic() < end:
        poll_into(a, got_a)
        poll_into(b, got_b)
        pa, pb = a.assignment(), b.assignment()
        split = split or (pa and pb and not (pa & pb) and len(pa | pb) == common.PARTITIONS)
        if split and len({(p, o) for p, o, _ in got_a + got_b}) >= 300:
            break
    if not split:
        common.fail(f"members never split the partitions: {a.assignment()} / {b.assignment()}")
    seen = {(p, o) for p, o, _ in got_a + got_b}
    if len(seen) != 300:
        common.fail(f"read {len(seen)} distinct records of 300")
    a.close()
    b.close()

    produce(bootstrap, topic, 300, 60)
    c = member(bootstrap, topic, group)
    got_c, end = [], common.deadline()
    while len(got_c) < 60 and time.monotonic() < end:
        poll_into(c, got_c)
    time.sleep(1)
    poll_into(c, got_c)
    values = sorted(int(v[1:]) for _, _, v in got_c)
    if values != list(range(300, 360)):
        common.fail(f"resumed member read {len(got_c)} records, not exactly the 60 new ones")
    for i in range(common.PARTITIONS):
        tp = TopicPartition(topic, i)
        if c.committed(tp) != c.end_offsets([tp])[tp]:
            common.fail(f"partition {i}: committed {c.committed(tp)} != end")
    c.close()
    print(f"ok: 2 members split {common.PARTITIONS} partitions, "
          f"{len(got_a) + len(got_b) - 300} duplicates, resumed with 60 new records")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
