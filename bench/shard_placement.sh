#!/usr/bin/env bash
# Shards pinned (weir.shard.cpus=spread, the default) against unpinned (none), alternating:
# one `weir serve --shards 2`, a topic of 2 partitions, one producer of 1 KiB records in
# 64 KiB batches, acks=1. MODE=rate (default): publish latency at RATE records/s (issue
# 14's "half of max" shape) and the broker's own append histogram
# (weir_produce_local_seconds, from /metrics); MODE=max: closed loop, records/s and the
# broker's CPU ticks (utime + stime, warm-up included). Data dirs are deleted after each run.
#
#   cargo build --release -p weir -p weir-loadgen --bins
#   ROUNDS=4 bash bench/shard_placement.sh
#   MODE=max ROUNDS=3 bash bench/shard_placement.sh
set -u
cd "$(dirname "$0")/.."
W=${WEIR_BIN:-$PWD/target/release/weir}
LG=${LOADGEN_BIN:-$PWD/target/release/weir-loadgen}
MODE=${MODE:-rate}
RATE=${RATE:-170000}
SHARDS=${SHARDS:-2}
ROUNDS=${ROUNDS:-4}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
for r in $(seq "$ROUNDS"); do
    for placement in spread none; do
        D=$(mktemp -d "${TMPDIR:-/tmp}/shard-placement.XXXX")
        P=$(free_port)
        M=$(free_port)
        "$W" serve --data-dir "$D/data" --listen "127.0.0.1:$P" --shards "$SHARDS" \
            --set weir.shard.cpus="$placement" --set metrics.listener="127.0.0.1:$M" > "$D/log" 2>&1 &
        WP=$!
        for _ in $(seq 100); do grep -qs "weir ready" "$D/log" && break; sleep 0.1; done
        "$W" topics --bootstrap-server "127.0.0.1:$P" create t --partitions 2 --replication-factor 1 >/dev/null
        common=(--bootstrap "127.0.0.1:$P" --topic t --partitions 2 --producers 1 --record-size 1024
            --batch-size 65536 --acks 1)
        if [ "$MODE" = max ]; then
            c0=$(ticks "$WP")
            out=$("$LG" produce "${common[@]}" --rate max --warmup 2s --duration 8s 2>&1 | grep "records acked in")
            echo "$placement round $r: $out; broker CPU ticks $(( $(ticks "$WP") - c0 ))"
        else
            out=$("$LG" produce "${common[@]}" --rate "$RATE" --warmup 3s --duration 10s 2>&1 \
                | grep -A1 "records acked in" | tail -1)
            mkdir -p "$D/phases"
            : > "$D/phases/before-1.txt"
            curl -s "http://127.0.0.1:$M/metrics" > "$D/phases/after-1.txt"
            local_append=$(python3 loadgen/scripts/phase_hist.py "$D/phases" | awk '/^weir_produce_local/ {print "p50 " $4 " p99 " $5}')
            echo "$placement round $r: $out; broker append (ms) $local_append"
        fi
        kill -9 "$WP"
        wait "$WP" 2>/dev/null
        rm -rf "$D"
    done
done
