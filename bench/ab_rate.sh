#!/usr/bin/env bash
# Two builds of weir, A/B, at one fixed produce rate (issue 14): the broker's CPU seconds
# per GiB (utime + stime from /proc/PID/stat over warm-up and run, bench/cpu.sh) and the publish
# latency, alternating A and B each round. At a fixed rate both builds do the same work,
# so per-turn costs (wakes, parks, timers, syscalls) show in CPU per GiB without the
# closed loop's throughput moving the denominator. `weir serve --shards $SHARDS`,
# PARTITIONS partitions, one producer of RECORD-byte records in BATCH-byte batches, acks
# $ACKS. Data dirs are deleted after each run.
#
#   A=target/bench-bin/base B=target/release ROUNDS=4 RATE=150000 bash bench/ab_rate.sh
set -u
cd "$(dirname "$0")/.."
A=${A:?A=dir holding the first build\'s weir and weir-loadgen}
B=${B:?B=dir holding the second build\'s weir and weir-loadgen}
RATE=${RATE:-150000}
SHARDS=${SHARDS:-2}
PARTITIONS=${PARTITIONS:-2}
RECORD=${RECORD:-1024}
BATCH=${BATCH:-65536}
ACKS=${ACKS:-1}
ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# shellcheck source=bench/cpu.sh
. bench/cpu.sh  # cpu_of PID: CPU seconds so far (the repo root is the working directory)
mkdir -p target
for r in $(seq "$ROUNDS"); do
    for side in A B; do
        dir=${!side}
        D=$(mktemp -d "$PWD/target/ab-rate.XXXX")
        P=$(free_port)
        "$dir/weir" serve --data-dir "$D/data" --listen "127.0.0.1:$P" --shards "$SHARDS" > "$D/log" 2>&1 &
        WP=$!
        for _ in $(seq 100); do grep -qs "weir ready" "$D/log" && break; sleep 0.1; done
        "$dir/weir" topics --bootstrap-server "127.0.0.1:$P" create t --partitions "$PARTITIONS" \
            --replication-factor 1 >/dev/null
        c0=$(cpu_of "$WP")
        "$dir/weir-loadgen" produce --bootstrap "127.0.0.1:$P" --topic t --partitions "$PARTITIONS" \
            --producers 1 --record-size "$RECORD" --batch-size "$BATCH" --acks "$ACKS" \
            --rate "$RATE" --warmup "${WARMUP}s" --duration "${DURATION}s" --json "$D/out.json" \
            > "$D/lg.txt" 2>&1
        c1=$(cpu_of "$WP")
        python3 - "$D/out.json" "$c0" "$c1" "$RECORD" "$RATE" "$WARMUP" "$DURATION" "$side" "$r" <<'PY'
import json, sys
out, c0, c1, record, rate, warm, dur, side, r = sys.argv[1:]
d = json.load(open(out))
# CPU covers warm-up and run; so do the bytes: the offered rate over both.
gib = int(rate) * int(record) * (int(warm) + int(dur)) / 2**30
cpu = float(c1) - float(c0)
lat = d.get("publish_latency_ms") or {}
p50, p99 = lat.get("p50"), lat.get("p99")
print(f"{side} round {r}: {d['records_per_sec']:,.0f} records/s acked, broker {cpu:.2f} CPU-s = "
      f"{cpu / gib:.3f} CPU-s/GiB, publish p50 {p50} p99 {p99} ms")
PY
        kill -9 "$WP"
        wait "$WP" 2>/dev/null
        rm -rf "$D"
    done
done
