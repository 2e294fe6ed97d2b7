#!/usr/bin/env bash
# The "whole system" numbers of docs/PERFORMANCE.md, in one run on this machine:
# fio (direct sequential write and read), iperf3 over loopback, then a single-node weir
# driven by weir-loadgen: max produce MB/s at acks 0/1/all, consume MB/s, and publish/e2e
# latency at 50% of the max rate. Writes JSON and HTML under $OUT (default
# target/whole-system) and prints a summary. Needs fio and iperf3 (apt-get install fio iperf3).
#
# Usage: loadgen/scripts/whole_system.sh [SHARDS]     (run from the repo root)
set -euo pipefail
cd "$(dirname "$0")/../.."

SHARDS=${1:-2}
OUT=${OUT:-target/whole-system}
DUR=${DUR:-15s}
WARM=${WARM:-3s}
BIN=target/release
rm -rf "$OUT" && mkdir -p "$OUT"
DATA=$OUT/weir-data
FIOFILE=$OUT/fio.dat
WEIR_PID=
# On any exit: kill the broker, then delete its data dir and the fio file. A run leaves
# tens of GB there (once 32 GB), enough to fill the disk; the JSON results are kept.
cleanup() {
    if [ -n "$WEIR_PID" ]; then
        kill -9 "$WEIR_PID" 2>/dev/null || true
        wait "$WEIR_PID" 2>/dev/null || true
    fi
    rm -rf "$DATA" "$FIOFILE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# BUILD=0 uses the binaries already in target/release.
if [ "${BUILD:-1}" = 1 ]; then cargo build --release -p weir -p weir-loadgen >/dev/null; fi

echo "== fio (O_DIRECT, 1 MiB blocks, iodepth 16, 2 GiB file on the repo's disk)"
fio --name=seqwrite --filename="$FIOFILE" --rw=write --bs=1M --size=2G --direct=1 \
    --ioengine=libaio --iodepth=16 --runtime=15 --time_based --output-format=json \
    > "$OUT/fio-write.json"
fio --name=seqread --filename="$FIOFILE" --rw=read --bs=1M --size=2G --direct=1 \
    --ioengine=libaio --iodepth=16 --runtime=15 --time_based --output-format=json \
    > "$OUT/fio-read.json"
rm -f "$FIOFILE"

echo "== iperf3 loopback (1 stream, 10 s)"
iperf3 -s -1 -p 15201 >/dev/null 2>&1 &
sleep 0.5
iperf3 -c 127.0.0.1 -p 15201 -t 10 -J > "$OUT/iperf3.json"
wait || true

echo "== weir --shards $SHARDS"
mkdir -p "$DATA"
"$BIN/weir" serve --data-dir "$DATA" --listen 127.0.0.1:0 --shards "$SHARDS" > "$OUT/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 100); do grep -q "weir ready" "$OUT/weir.log" && break; sleep 0.1; done
ADDR=$(grep -o "listening on [0-9.:]*" "$OUT/weir.log" | head -1 | awk '{print $3}')
echo "weir at $ADDR (pid $WEIR_PID)"

LG="$BIN/weir-loadgen"
COMMON=(--bootstrap "$ADDR" --partitions 2 --record-size 1024 --batch-size 65536 --linger-ms 5 --quiet)
for ACKS in 0 1 all; do
    echo "== produce, closed loop, acks=$ACKS"
    "$LG" produce "${COMMON[@]}" --topic "max-acks-$ACKS" --acks "$ACKS" --rate max \
        --duration "$DUR" --warmup "$WARM" --json "$OUT/produce-acks-$ACKS.json"
done

echo "== consume everything the acks=all run wrote, from earliest"
"$LG" consume --bootstrap "$ADDR" --topic max-acks-all --consumers 2 --from earliest \
    --quiet --json "$OUT/consume.json"

for ACKS in 1 all; do
    MAX=$(python3 -c "import json;print(json.load(open('$OUT/produce-acks-$ACKS.json'))['records_per_sec'])")
    HALF=$(python3 -c "print(int($MAX/2))")
    echo "== e2e at 50% of max ($HALF records/s), acks=$ACKS"
    "$LG" e2e "${COMMON[@]}" --topic "half-acks-$ACKS" --acks "$ACKS" --rate "$HALF" \
        --duration "$DUR" --warmup "$WARM" --json "$OUT/e2e-half-acks-$ACKS.json" \
        --report "$OUT/e2e-half-acks-$ACKS.html"
done

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
j = lambda n: json.load(open(f"{out}/{n}"))
w = j("fio-write.json")["jobs"][0]["write"]["bw_bytes"] / 2**20
r = j("fio-read.json")["jobs"][0]["read"]["bw_bytes"] / 2**20
net = j("iperf3.json")["end"]["sum_received"]["bits_per_second"] / 8 / 2**20
print(f"\nfio direct seq write {w:.0f} MiB/s, read {r:.0f} MiB/s; iperf3 loopback {net:.0f} MiB/s")
for a in ["0", "1", "all"]:
    p = j(f"produce-acks-{a}.json")
    print(f"produce acks={a}: {p['records_per_sec']:.0f} rec/s, {p['mb_per_sec']:.1f} MiB/s "
          f"= {p['mb_per_sec']/w:.2f} x fio write; errors {p['errors']}")
c = j("consume.json")
print(f"consume: {c['consumed_records_per_sec']:.0f} rec/s, {c['consumed_mb_per_sec']:.1f} MiB/s "
      f"= {c['consumed_mb_per_sec']/net:.2f} x loopback")
for a in ["1", "all"]:
    e = j(f"e2e-half-acks-{a}.json")
    # A latency without samples is null in the JSON: NaN here.
    nan = {"p50": float("nan"), "p99": float("nan"), "p999": float("nan")}
    pl, el = e["publish_latency_ms"] or nan, e["e2e_latency_ms"] or nan
    print(f"50% load acks={a}: {e['records_per_sec']:.0f} rec/s; publish p50 {pl['p50']:.2f} "
          f"p99 {pl['p99']:.2f} p99.9 {pl['p999']:.2f} ms; e2e p50 {el['p50']:.2f} "
          f"p99 {el['p99']:.2f} p99.9 {el['p999']:.2f} ms; max lag {e['lag_max_records'] if e['lag_max_records'] is not None else '-'}")
EOF
