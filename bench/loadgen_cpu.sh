#!/usr/bin/env bash
# weir-loadgen's own CPU per GiB produced (issue 14), binaries side by side: for each round,
# an iperf3 loopback run (the receiver's and sender's CPU-s per GiB: the floors), then for
# each loadgen binary a fresh single-node weir and one `produce --acks 1 --rate max` on the
# shape of the Iggy comparison (1 producer, 1 partition, 1,000 B records, 1,000 records =
# 1 MB of values a batch: a 1 MiB batch.size would exceed message.max.bytes with overhead).
# Prints per run: MiB/s, the loadgen's CPU-s per GiB (its rusage: user + system), its ratio
# to the receiver floor, the broker's CPU-s per GiB; then the median per binary. Binaries
# alternate within each round, so a noisy neighbour hits both alike. Each run's weir data
# dir is deleted as soon as the run ends.
#
# Usage (repo root): bench/loadgen_cpu.sh LOADGEN [LOADGEN...]
#   ROUNDS=3 DUR=8s RECORD=1000 BATCH=1000000 PARTITIONS=1 SHARDS=1 WEIR=target/release/weir
#   PERF=DIR: also `perf record --call-graph dwarf` each loadgen for 4 s mid-run into DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { sed -n 2,14p "$0"; exit 2; }
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-8s}
RECORD=${RECORD:-1000}
BATCH=${BATCH:-1000000}
PARTITIONS=${PARTITIONS:-1}
SHARDS=${SHARDS:-1}
WEIR=${WEIR:-target/release/weir}
PERF=${PERF:-}
command -v iperf3 >/dev/null || { echo "needs iperf3 (apt-get install iperf3)"; exit 1; }

mkdir -p target
WORK=$(mktemp -d "$PWD/target/lg-cpu.XXXXXX")
PIDS=
cleanup() {
    for p in $PIDS; do
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=bench/cpu.sh
. bench/cpu.sh  # the repo root is the working directory (cd above)
trap 'exit 130' INT TERM

wait_listen() {
    for _ in $(seq 1 200); do ss -ltn "sport = :$1" | grep -q LISTEN && return 0; sleep 0.05; done
    return 1
}

floor() {
    local port=$((20000 + RANDOM % 20000)) pid r0 r1 send
    iperf3 -s -p "$port" >/dev/null 2>&1 &
    pid=$!; PIDS="$PIDS $pid"
    wait_listen "$port"
    r0=$(cpu_of "$pid")
    send=$(rusage iperf3 -c 127.0.0.1 -p "$port" -t 5 -J 3>&1 >"$WORK/iperf3.json")
    r1=$(cpu_of "$pid")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    PIDS=
    python3 - "$WORK/iperf3.json" "$r0" "$r1" "$send" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["end"]
r0, r1, send = map(float, sys.argv[2:5])
GiB = 2**30
print(f"{e['sum_received']['bits_per_second'] / 8 / 2**20:.0f}",
      f"{(r1 - r0) / (e['sum_received']['bytes'] / GiB):.3f}",
      f"{send / (e['sum_sent']['bytes'] / GiB):.3f}")
EOF
}

# run LOADGEN: fresh broker, one produce; prints "MiB/s loadgen-CPU-s/GiB broker-CPU-s/GiB".
# Both functions run in this shell (output to a file), so the trap sees their PIDS.
run() {
    local lg=$1 data="$WORK/data" wpid addr b0 b1 cpu ppid
    mkdir -p "$data"
    "$WEIR" serve --data-dir "$data" --listen 127.0.0.1:0 --shards "$SHARDS" \
        > "$WORK/weir.log" 2>&1 &
    wpid=$!; PIDS="$PIDS $wpid"
    for _ in $(seq 1 200); do grep -q "listening on" "$WORK/weir.log" && break; sleep 0.05; done
    addr=$(grep -o "listening on [0-9.:]*" "$WORK/weir.log" | head -1 | awk '{print $3}')
    [ -n "$addr" ] || { cat "$WORK/weir.log" >&2; exit 1; }
    b0=$(cpu_of "$wpid")
    local perf_pid=
    if [ -n "$PERF" ]; then
        (
            # The loadgen is the newest process of that binary's name once it has a topic.
            for _ in $(seq 1 100); do
                ppid=$(pgrep -n -f "^$lg produce" || true)
                [ -n "$ppid" ] && break; sleep 0.05
            done
            sleep 2
            perf record -q --call-graph dwarf,16384 -F "${PERF_HZ:-499}" -p "$ppid" \
                -o "$PERF/$(basename "$(dirname "$lg")")-$(date +%s).data" -- sleep 4 \
                >/dev/null 2>&1 || true
        ) &
        perf_pid=$!
    fi
    cpu=$(rusage "$lg" produce --bootstrap "$addr" --topic t --partitions "$PARTITIONS" \
        --record-size "$RECORD" --batch-size "$BATCH" --linger-ms 5 --acks 1 --rate max \
        --duration "$DUR" --quiet --json "$WORK/run.json" 3>&1 >/dev/null)
    b1=$(cpu_of "$wpid")
    [ -z "$perf_pid" ] || wait "$perf_pid" 2>/dev/null || true
    kill -9 "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true
    rm -rf "$data"
    python3 - "$WORK/run.json" "$cpu" "$b0" "$b1" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
cpu, b0, b1 = map(float, sys.argv[2:5])
gib = max(j["bytes"] / 2**30, 1e-9)
print(f"{j['mb_per_sec']:.0f} {cpu / gib:.3f} {(b1 - b0) / gib:.3f}")
EOF
    PIDS=
}

declare -A ALL
printf '%-5s %-40s %8s %14s %8s %8s %14s %6s\n' round binary MiB/s "loadgen s/GiB" "x recv" "x send" "broker s/GiB" load1
for r in $(seq 1 "$ROUNDS"); do
    floor > "$WORK/floor"
    read -r net recv send < "$WORK/floor"
    echo "      iperf3 $net MiB/s; floors: receiver $recv, sender $send CPU-s/GiB"
    for lg in "$@"; do
        run "$lg" > "$WORK/result"
        read -r mibs lgc brk < "$WORK/result"
        load=$(cut -d' ' -f1 /proc/loadavg)
        ratio=$(python3 -c "print(f'{$lgc / $recv:.1f} {$lgc / $send:.1f}')")
        printf '%-5s %-40s %8s %14s %8s %8s %14s %6s\n' "$r" "$lg" "$mibs" "$lgc" $ratio "$brk" "$load"
        ALL[$lg]="${ALL[$lg]:-} $mibs,$lgc,$brk,$recv"
    done
done
echo "medians over $ROUNDS rounds (ratio: median of each run's loadgen / its round's receiver floor)"
for lg in "$@"; do
    python3 - "$lg" ${ALL[$lg]} <<'EOF'
import statistics, sys
rows = [tuple(map(float, a.split(","))) for a in sys.argv[2:]]
m = lambda k: statistics.median(r[k] for r in rows)
ratio = statistics.median(r[1] / r[3] for r in rows)
print(f"  {sys.argv[1]:<40} {m(0):8.0f} MiB/s  loadgen {m(1):.3f} CPU-s/GiB = {ratio:.1f} x receiver floor  broker {m(2):.3f} CPU-s/GiB")
EOF
done
