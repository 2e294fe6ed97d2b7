#!/usr/bin/env bash
# A 3-node cluster on this machine, one topic of 3 partitions at replication factor RF
# (3 or 1), `weir-loadgen produce --acks all --rate max` for 14 s (2 s warm-up), and:
#   PERF=1 (default): a system-wide `perf record` of 6 s in the middle, reported by thread
#          and by symbol (idle shows as `swapper` / `pv_native_safe_halt`);
#   always: the three nodes' CPU ticks (utime + stime, 1/100 s) from 5 s in to the end.
# NODE_ARGS: more `weir serve` arguments for every node. Data dirs are deleted on exit.
#
#   RF=3 bash loadgen/scripts/rf_profile.sh
#   PERF=0 RF=1 NODE_ARGS="--set replica.fetch.min.bytes=1" bash loadgen/scripts/rf_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/target/rf-profile}
W=${WEIR_BIN:-$PWD/target/release/weir}
LG=${LOADGEN_BIN:-$PWD/target/release/weir-loadgen}
RF=${RF:-3}
PERF=${PERF:-1}
NODE_ARGS=(${NODE_ARGS:-})
mkdir -p "$OUT"; rm -rf "$OUT"/data-* "$OUT"/*.log
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a PORT CPORT PID
for i in 1 2 3; do PORT[$i]=$(free_port); CPORT[$i]=$(free_port); done
VOTERS="1@127.0.0.1:${CPORT[1]},2@127.0.0.1:${CPORT[2]},3@127.0.0.1:${CPORT[3]}"
BOOT="127.0.0.1:${PORT[1]},127.0.0.1:${PORT[2]},127.0.0.1:${PORT[3]}"
cleanup() {
    for i in 1 2 3; do [ -n "${PID[$i]:-}" ] && { kill -9 "${PID[$i]}" 2>/dev/null; wait "${PID[$i]}" 2>/dev/null; }; done
    rm -rf "$OUT"/data-* "$OUT"/perf.data
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for i in 1 2 3; do
    "$W" serve --data-dir "$OUT/data-$i" --listen "127.0.0.1:${PORT[$i]}" --node-id "$i" --shards 1 \
        --set weir.shard.cpus=none --set controller.quorum.voters="$VOTERS" \
        --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=3000 \
        --set controller.quorum.election.timeout.ms=500 "${NODE_ARGS[@]}" > "$OUT/node-$i.log" 2>&1 &
    PID[$i]=$!
done
for i in 1 2 3; do
    for _ in $(seq 1 300); do grep -qs "weir ready" "$OUT/node-$i.log" && break; sleep 0.1; done
done
for _ in $(seq 1 300); do
    n=$(kcat -b "$BOOT" -L -J -m 5 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["brokers"]))' 2>/dev/null)
    [ "${n:-0}" = 3 ] && break; sleep 0.2
done
[ "${n:-0}" = 3 ] || { echo "cluster did not form"; exit 1; }
MIN_ISR=$(( RF > 1 ? 2 : 1 ))
"$W" topics --bootstrap-server "127.0.0.1:${PORT[1]}" create p --partitions 3 --replication-factor "$RF" \
    --config min.insync.replicas="$MIN_ISR" --config retention.bytes=1073741824 --config segment.bytes=134217728 || exit 1
# Every partition led and fully in sync before measuring.
for _ in $(seq 1 300); do
    ok=$(kcat -b "$BOOT" -L -J -m 5 2>/dev/null | python3 -c '
import json, sys
ps = [t for t in json.load(sys.stdin)["topics"] if t["topic"] == "p"][0]["partitions"]
print(int(len(ps) == 3 and all(p["leader"] >= 0 and len(p.get("isrs", [])) == '"$RF"' for p in ps)))' 2>/dev/null)
    [ "${ok:-0}" = 1 ] && break; sleep 0.2
done
ticks() { for i in 1 2 3; do awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/${PID[$i]}/stat"; done | paste -sd+ | bc; }
"$LG" produce --bootstrap "127.0.0.1:${PORT[1]}" --topic p --partitions 3 --record-size 1024 --acks all \
    --rate max --warmup 2s --duration 14s > "$OUT/loadgen.txt" 2>&1 &
LGP=$!
sleep 5
C0=$(ticks)
[ "$PERF" = 1 ] && perf record -a -F 1999 -o "$OUT/perf.data" -- sleep 6 > /dev/null 2>&1
wait "$LGP"
C1=$(ticks)
grep 'records/sec' "$OUT/loadgen.txt" | grep -v warm-up
echo "nodes' CPU ticks from 5 s in to the end: $((C1 - C0))"
if [ "$PERF" = 1 ]; then
    perf report -i "$OUT/perf.data" --no-children --sort comm --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
    perf report -i "$OUT/perf.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
fi
