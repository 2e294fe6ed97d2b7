#!/usr/bin/env bash
# The append write path on one shard (issue 14): a `weir serve --shards 1` taking produce
# from weir-loadgen (1 partition by default), and, for that broker process during the
# measured run: MiB/s, its CPU seconds per GiB, the CPU seconds of its io_uring worker
# threads (`iou-wrk-*`, summed from /proc/PID/task/*/stat at the end of the run), and from
# `perf stat -p` (threads the broker starts later included): its O_DIRECT writes (the
# filesystem's iomap_dio_rw_begin: a produce-only run reads nothing), how many io_uring
# writes it punted to an io-wq worker (io_uring_queue_async_work for WRITE / WRITE_FIXED:
# a socket write that would block is polled, not punted, so these are the disk writes),
# the bytes per write, and its context switches. The data dir lives under target/ and is
# deleted on exit.
#
# Usage: BIN=target/release bench/append_iowq.sh        (from the repo root; no build)
#   ACKS=1 DUR=10s PARTITIONS=1 RECORD=1024 BATCH=65536 RATE=max CONFIG="" bench/append_iowq.sh
#   CONFIG is extra `weir serve` flags, e.g. CONFIG="--set log.preallocate=false".
# (The zeros-ahead writer it was written for was an experiment, not in main; see
# docs/PERFORMANCE.md "Appends: io-wq and doorbells".)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release}
ACKS=${ACKS:-1}
DUR=${DUR:-10s}
PARTITIONS=${PARTITIONS:-1}
RECORD=${RECORD:-1024}
BATCH=${BATCH:-65536}
RATE=${RATE:-max}
CONFIG=${CONFIG:-}
CLK_TCK=$(getconf CLK_TCK)

mkdir -p target
WORK=$(mktemp -d "$PWD/target/append-iowq.XXXXXX")
WEIR_PID=
cleanup() {
    if [ -n "$WEIR_PID" ]; then kill -9 "$WEIR_PID" 2>/dev/null || true; wait "$WEIR_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cpu_of() { awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
# CPU seconds of the process's io_uring worker threads alive now.
iowq_cpu() {
    local sum=0 f
    for f in /proc/"$1"/task/*/stat; do
        if grep -q '(iou-wrk' "$f" 2>/dev/null; then
            sum=$(awk -v s="$sum" -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); print s + ($12 + $13) / t }' "$f")
        fi
    done
    echo "$sum"
}

# shellcheck disable=SC2086
"$BIN/weir" serve --data-dir "$WORK/data" --listen 127.0.0.1:0 --shards 1 $CONFIG \
    > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 200); do grep -q "listening on" "$WORK/weir.log" && break; sleep 0.05; done
ADDR=$(grep -o "listening on [0-9.:]*" "$WORK/weir.log" | head -1 | awk '{print $3}')
[ -n "$ADDR" ] || { cat "$WORK/weir.log"; exit 1; }

LOAD0=$(cut -d' ' -f1 /proc/loadavg)
B0=$(cpu_of "$WEIR_PID")
W0=$(iowq_cpu "$WEIR_PID")
perf stat -x, -o "$WORK/perf.csv" -p "$WEIR_PID" \
    -e iomap:iomap_dio_rw_begin \
    -e io_uring:io_uring_queue_async_work --filter 'opcode == 23 || opcode == 5' \
    -e context-switches &
PERF_PID=$!
sleep 0.2 # perf attaches (bounded: one fixed pause, not a wait for a state)
"$BIN/weir-loadgen" produce --bootstrap "$ADDR" --topic t --partitions "$PARTITIONS" \
    --record-size "$RECORD" --batch-size "$BATCH" --linger-ms 5 --acks "$ACKS" \
    --rate "$RATE" --duration "$DUR" --quiet --json "$WORK/lg.json" > /dev/null
W1=$(iowq_cpu "$WEIR_PID")
B1=$(cpu_of "$WEIR_PID")
kill -INT "$PERF_PID"; wait "$PERF_PID" 2>/dev/null || true
LOAD1=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$WORK" "$B0" "$B1" "$W0" "$W1" "$LOAD0" "$LOAD1" "$ACKS" "$CONFIG" <<'EOF'
import json, sys
work, b0, b1, w0, w1, l0, l1, acks, config = sys.argv[1:]
j = json.load(open(f"{work}/lg.json"))
gib = j["bytes"] / 2**30
counts = {}
for line in open(f"{work}/perf.csv"):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[0].replace(".", "").isdigit():
        counts[parts[2]] = float(parts[0])
writes = counts.get("iomap:iomap_dio_rw_begin", 0)
punts = counts.get("io_uring:io_uring_queue_async_work", 0)
cs = counts.get("context-switches", 0)
print(f"acks={acks} {config or '(defaults)'}: {j['mb_per_sec']:,.0f} MiB/s, broker "
      f"{(float(b1) - float(b0)) / gib:.3f} CPU-s/GiB, iou-wrk {(float(w1) - float(w0)) / gib:.3f} CPU-s/GiB; "
      f"DMA writes {writes / gib:,.0f}/GiB ({j['bytes'] / max(writes, 1) / 1024:,.0f} KiB each), "
      f"punted to io-wq {punts / max(writes, 1):.0%}; context switches {cs / gib:,.0f}/GiB; "
      f"load {l0} -> {l1}")
EOF
