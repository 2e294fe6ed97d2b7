"""Throughput of a confluent-kafka producer against a running weir: idempotent only, or
transactions of PER_TXN records (each committed).

    python txn_perf.py BOOTSTRAP idem|txn PER_TXN TOTAL
"""
import sys, time
from confluent_kafka import Producer
boot, mode, per_txn, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conf = {"bootstrap.servers": boot, "linger.ms": 5, "enable.idempotence": True}
if mode == "txn":
    conf["transactional.id"] = f"perf-{per_txn}"
p = Producer(conf)
topic = f"perf-{mode}-{per_txn}"
payload = b"x" * 100
if mode == "txn":
    p.init_transactions(30)
start = time.monotonic()
sent = 0
while sent < total:
    if mode == "txn":
        p.begin_transaction()
    for _ in range(per_txn):
        while True:
            try:
                p.produce(topic, payload, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    sent += per_txn
    if mode == "txn":
        p.commit_transaction(30)
p.flush(60)
el = time.monotonic() - start
print(f"{mode} per_txn={per_txn} records={total} seconds={el:.2f} records_per_s={total/el:.0f}")
