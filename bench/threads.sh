#!/usr/bin/env bash
# Where a producing broker's CPU goes, by thread (issue 14): one `weir serve --shards
# SHARDS` under `weir-loadgen produce` (2 partitions, 1 KiB records, 64 KiB batches,
# acks=1, --rate max); over MEASURE seconds in the middle of the run, each thread's CPU
# seconds (utime+stime, /proc/PID/task/TID/stat) and voluntary / involuntary context
# switches per GiB the broker wrote (/proc/PID/io write_bytes). Shard threads are
# `weir-shard-S-*`; `iou-wrk-*` are io_uring's workers running the O_DIRECT writes ext4
# would not take without blocking. Data dir under target/, deleted on exit.
#
#   SHARDS=2 bash bench/threads.sh            (BIN=target/release; PREFIX="chrt -b 0" etc.
#                                              runs the broker under a wrapper)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDS=${SHARDS:-2}
MEASURE=${MEASURE:-6}
BIN=${BIN:-target/release}
mkdir -p target
W=$(mktemp -d "$PWD/target/threads.XXXXXX")
PID=
LG=
cleanup() {
    for p in $LG $PID; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT
# shellcheck disable=SC2086  # PREFIX is a command and its arguments
${PREFIX:-} "$BIN/weir" serve --data-dir "$W/data" --listen 127.0.0.1:0 --shards "$SHARDS" \
    > "$W/weir.log" 2>&1 &
PID=$!
for _ in $(seq 1 200); do grep -q "listening on" "$W/weir.log" && break; sleep 0.05; done
ADDR=$(grep -o "listening on [0-9.:]*" "$W/weir.log" | head -1 | awk '{print $3}')
[ -n "$ADDR" ] || { cat "$W/weir.log"; exit 1; }
"$BIN/weir-loadgen" produce --bootstrap "$ADDR" --partitions 2 --record-size 1024 \
    --batch-size 65536 --linger-ms 5 --quiet --topic t1 --acks 1 --rate max \
    --duration "$((MEASURE + 6))s" > /dev/null 2>&1 &
LG=$!
sleep 3
snap() {
    for t in /proc/"$PID"/task/*; do
        echo "$(basename "$t") $(cat "$t/comm") $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "$t/stat")" \
             "$(awk '/^voluntary_ctxt/ {v=$2} /^nonvoluntary_ctxt/ {n=$2} END {print v, n}' "$t/status")"
    done
    awk '/^write_bytes/ {print "io io", $2, 0, 0}' "/proc/$PID/io"
}
snap > "$W/s0"; sleep "$MEASURE"; snap > "$W/s1"
python3 - "$W/s0" "$W/s1" "$(getconf CLK_TCK)" "$MEASURE" <<'PY'
import sys
def read(f):
    return {p[0]: (p[1], int(p[2]), int(p[3]), int(p[4])) for p in (l.split() for l in open(f))}
a, b, tck, secs = read(sys.argv[1]), read(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
gib = (b["io"][1] - a["io"][1]) / 2**30
print(f"written {gib:.2f} GiB in {secs:.0f} s = {gib * 1024 / secs:,.0f} MiB/s")
print(f"{'thread':<18} {'CPU-s/GiB':>9} {'voluntary/GiB':>14} {'involuntary/GiB':>16}")
total = 0.0
for tid in sorted(b):
    if tid == "io" or tid not in a:
        continue
    cpu = (b[tid][1] - a[tid][1]) / tck
    vol, inv = b[tid][2] - a[tid][2], b[tid][3] - a[tid][3]
    if cpu == 0 and vol + inv < 10:
        continue
    total += cpu
    print(f"{b[tid][0]:<18} {cpu / gib:>9.3f} {vol / gib:>14,.0f} {inv / gib:>16,.0f}")
print(f"{'total':<18} {total / gib:>9.3f}")
PY
