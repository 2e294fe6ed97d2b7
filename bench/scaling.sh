#!/usr/bin/env bash
# Scaling (issue 14): produce acks=1 at max rate on a single node for every combination of
# shards (1, 2), partitions (2, 100, 1,000) and record size (100 B, 1 KiB, 16 KiB), each
# with its records/s, MiB/s and the broker's CPU seconds per GiB (utime+stime from
# /proc/PID/stat over the measured run only: the topic is created by a short run first),
# beside the machine's floors (fio, iperf3) taken in the same run. One fresh broker and data
# dir per row, deleted after it.
#
# Usage: bench/scaling.sh                     (from the repo root; BUILD=0 skips cargo build)
#   DUR=6s SHARDS_LIST="1 2" PARTITIONS_LIST="2 100 1000" RECORDS_LIST="100 1024 16384" \
#   BATCH=65536 PRODUCERS=1 bench/scaling.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DUR=${DUR:-6s}
BATCH=${BATCH:-65536}
PRODUCERS=${PRODUCERS:-1}
SHARDS_LIST=${SHARDS_LIST:-"1 2"}
PARTITIONS_LIST=${PARTITIONS_LIST:-"2 100 1000"}
RECORDS_LIST=${RECORDS_LIST:-"100 1024 16384"}
BIN=${BIN:-target/release}

if [ "${BUILD:-1}" = 1 ]; then cargo build --release -p weir -p weir-loadgen --bins >/dev/null; fi
FLOORS=$(FLOORS_ONLY=1 BUILD=0 bash bench/efficiency.sh | tail -n 2)
RECV_FLOOR=$(echo "$FLOORS" | sed -n 's/.*receiver \([0-9.]*\) CPU-s\/GiB.*/\1/p')

mkdir -p target
WORK=$(mktemp -d "$PWD/target/scaling.XXXXXX")
WEIR_PID=
cleanup() {
    if [ -n "$WEIR_PID" ]; then
        kill -9 "$WEIR_PID" 2>/dev/null || true
        wait "$WEIR_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=bench/cpu.sh
. bench/cpu.sh
trap 'exit 130' INT TERM

echo "$FLOORS"
printf '%-7s %-11s %-8s %12s %9s %18s %8s\n' shards partitions record "records/s" "MiB/s" "broker CPU-s/GiB" "x floor"
for shards in $SHARDS_LIST; do
    for parts in $PARTITIONS_LIST; do
        for record in $RECORDS_LIST; do
            rm -rf "$WORK/data" "$WORK/weir.log"
            "$BIN/weir" serve --data-dir "$WORK/data" --listen 127.0.0.1:0 --shards "$shards" \
                > "$WORK/weir.log" 2>&1 &
            WEIR_PID=$!
            for _ in $(seq 1 200); do grep -q "listening on" "$WORK/weir.log" && break; sleep 0.05; done
            ADDR=$(grep -o "listening on [0-9.:]*" "$WORK/weir.log" | head -1 | awk '{print $3}')
            [ -n "$ADDR" ] || { cat "$WORK/weir.log"; exit 1; }
            COMMON=(--bootstrap "$ADDR" --topic s --partitions "$parts" --record-size "$record"
                    --linger-ms 5 --acks 1 --producers "$PRODUCERS" --quiet)
            # Creates the topic and opens every partition outside the measured run: one
            # record a batch and batches go round-robin, so each partition gets two (with
            # full batches only the first few dozen partitions were touched, and the
            # measured run paid for creating the rest).
            "$BIN/weir-loadgen" produce "${COMMON[@]}" --batch-size "$record" \
                --records $((parts * 2)) >/dev/null
            b0=$(cpu_of "$WEIR_PID")
            "$BIN/weir-loadgen" produce "${COMMON[@]}" --batch-size "$BATCH" --rate max --duration "$DUR" \
                --json "$WORK/run.json" >/dev/null
            b1=$(cpu_of "$WEIR_PID")
            python3 - "$WORK/run.json" "$b0" "$b1" "$RECV_FLOOR" "$shards" "$parts" "$record" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
b0, b1, floor = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
gib = max(j["bytes"] / 2**30, 1e-9)
cpu = (b1 - b0) / gib
print(f"{sys.argv[5]:<7} {sys.argv[6]:<11} {sys.argv[7]:<8} {j['records_per_sec']:>12,.0f} {j['mb_per_sec']:>9,.0f} {cpu:>18.3f} {cpu / floor:>8.1f}")
EOF
            kill "$WEIR_PID"; wait "$WEIR_PID" 2>/dev/null || true; WEIR_PID=
        done
    done
done
