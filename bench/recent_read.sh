#!/usr/bin/env bash
# Consumers a little behind: what reading recent data costs (docs/PERFORMANCE.md, "Recent
# data from memory"). One node (`--shards 2`), one topic of PARTITIONS partitions filled
# with MIB MiB by weir-loadgen (acks=1), then ROUNDS consumes from earliest with CONSUMERS
# consumers. Data that fits the node's `log.tail.cache.max.bytes` (WEIR_ARGS sets it) is
# answered from memory; the rest is read from the segment files. Prints each consume's
# MiB/s and the broker's CPU seconds per GiB read (utime+stime from /proc/PID/stat). The
# data dir is a temp dir under target/, deleted on exit.
#
# Usage: bench/recent_read.sh   (from the repo root; release binaries in BIN)
#   BIN=target/release MIB=384 PARTITIONS=2 CONSUMERS=2 ROUNDS=3 WEIR_ARGS="--set k=v" bench/recent_read.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release}
MIB=${MIB:-384}
PARTITIONS=${PARTITIONS:-2}
CONSUMERS=${CONSUMERS:-2}
ROUNDS=${ROUNDS:-3}
RECORD=1024

mkdir -p target
WORK=$(mktemp -d "$PWD/target/recent-read.XXXXXX")
WEIR_PID=
cleanup() {
    if [ -n "$WEIR_PID" ]; then kill -9 "$WEIR_PID" 2>/dev/null || true; wait "$WEIR_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=bench/cpu.sh
. bench/cpu.sh
trap 'exit 130' INT TERM

# shellcheck disable=SC2086
"$BIN/weir" serve --data-dir "$WORK/data" --listen 127.0.0.1:0 --shards 2 ${WEIR_ARGS:-} \
    > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 200); do grep -q "listening on" "$WORK/weir.log" && break; sleep 0.05; done
ADDR=$(grep -o "listening on [0-9.:]*" "$WORK/weir.log" | head -1 | awk '{print $3}')
[ -n "$ADDR" ] || { cat "$WORK/weir.log"; exit 1; }

RECORDS=$((MIB * 1024 * 1024 / RECORD))
"$BIN/weir-loadgen" produce --bootstrap "$ADDR" --topic recent --partitions "$PARTITIONS" \
    --record-size "$RECORD" --batch-size 65536 --linger-ms 5 --acks 1 --rate max \
    --records "$RECORDS" --quiet --json "$WORK/produce.json" > /dev/null
for r in $(seq 1 "$ROUNDS"); do
    b0=$(cpu_of "$WEIR_PID")
    "$BIN/weir-loadgen" consume --bootstrap "$ADDR" --topic recent --consumers "$CONSUMERS" \
        --from earliest --records "$RECORDS" --quiet --json "$WORK/consume-$r.json" > /dev/null
    b1=$(cpu_of "$WEIR_PID")
    python3 - "$WORK/consume-$r.json" "$b0" "$b1" "$RECORD" "$r" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
b0, b1, record, r = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
gib = max(j["consumed_records"] * record / 2**30, 1e-9)
print(f"consume {r}: {j['consumed_mb_per_sec']:,.0f} MiB/s, broker {(b1 - b0) / gib:.3f} CPU-s/GiB")
EOF
done
