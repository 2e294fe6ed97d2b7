#!/usr/bin/env bash
# CPU per byte, in one run on this machine (issue 14): the floors (fio O_DIRECT write
# throughput; the kernel's CPU seconds per GiB of O_DIRECT appends, WRITE_BS at queue depth
# 1; iperf3 loopback with the receiver's and sender's CPU seconds per GiB), then a
# single-node weir driven by weir-loadgen: produce acks=1, produce acks=all and consume,
# each with its MiB/s, the broker's CPU seconds per GiB (utime+stime from /proc/PID/stat)
# and the loadgen's own CPU seconds per GiB (its rusage). The broker's ratio is to the
# iperf3 receiver floor for produce (and to receiver + write floor), to the sender floor
# for consume; the loadgen's to the side of iperf3 it plays (sender when producing).
# Everything it writes on disk (fio files, weir data dir) lives in one temp dir that is
# deleted on exit.
#
# Usage: bench/efficiency.sh            (from the repo root; BUILD=0 skips cargo build)
#   SHARDS=2 DUR=10s RECORD=1024 BATCH=65536 PARTITIONS=2 CONNECTIONS=1 IN_FLIGHT=5 CONSUMERS=2 bench/efficiency.sh
#   IN_FLIGHT: produce requests in flight per connection (Kafka's default 5). With 5, a
#   2-partition produce is bound by the round trip, not by a CPU or the disk
#   (docs/PERFORMANCE.md, "Produce: the client's window").
#   WEIR_ARGS="--set key=value ..."  passed to weir serve (e.g. log.tail.cache.max.bytes)
#   FLOORS_ONLY=1 BUILD=0 bench/efficiency.sh   (only the fio and iperf3 lines, for other
#                                                benches to print beside their numbers)
set -euo pipefail
cd "$(dirname "$0")/.."

SHARDS=${SHARDS:-2}
DUR=${DUR:-10s}
RECORD=${RECORD:-1024}
BATCH=${BATCH:-65536}
PARTITIONS=${PARTITIONS:-2}
CONNECTIONS=${CONNECTIONS:-1}
IN_FLIGHT=${IN_FLIGHT:-5}
CONSUMERS=${CONSUMERS:-2}
BIN=${BIN:-target/release}

if [ "${BUILD:-1}" = 1 ]; then cargo build --release -p weir -p weir-loadgen --bins >/dev/null; fi
command -v fio >/dev/null || { echo "needs fio (apt-get install fio)"; exit 1; }
if ! command -v iperf3 >/dev/null; then
    echo "installing iperf3" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y iperf3 >/dev/null
fi

# Real disk under target/, not /tmp (which may be tmpfs and refuses O_DIRECT).
mkdir -p target
WORK=$(mktemp -d "$PWD/target/efficiency.XXXXXX")
WEIR_PID=
IPERF_PID=
cleanup() {
    for p in $WEIR_PID $IPERF_PID; do
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck source=bench/cpu.sh
. bench/cpu.sh  # the repo root is the working directory (cd above)
trap 'exit 130' INT TERM


echo "== fio: O_DIRECT sequential write, 1 MiB blocks, iodepth 16, 1 GiB file, 10 s"
fio --name=seqwrite --filename="$WORK/fio.dat" --rw=write --bs=1M --size=1G --direct=1 \
    --ioengine=libaio --iodepth=16 --runtime=10 --time_based --output-format=json \
    > "$WORK/fio.json"
# The read ceiling for a consumer of data older than the broker's memory (weir reads with
# O_DIRECT: no page cache holds it), read back from the file just written.
echo "== fio: O_DIRECT sequential read, 1 MiB blocks, iodepth 16, the same file, 5 s"
fio --name=seqread --filename="$WORK/fio.dat" --rw=read --bs=1M --size=1G --direct=1 \
    --ioengine=libaio --iodepth=16 --runtime=5 --time_based --output-format=json \
    > "$WORK/fio-read.json"
rm -f "$WORK/fio.dat"
FIO=$(python3 -c "import json;print(json.load(open('$WORK/fio.json'))['jobs'][0]['write']['bw_bytes']/2**20)")

# The write floor: the kernel's own CPU per GiB for O_DIRECT appends the size a broker's
# writes are, at queue depth 1, each extending the file (as a log's appends do). fio's
# system time covers the syscalls, ext4, the block layer and the io-wq workers it is
# handed to (threads of fio); its user time is fio's own bookkeeping and is left out.
# (fio's own sys_cpu is its main thread's alone, so the system time comes from rusage.)
# WRITE_BS: 128k is about what a 2-shard weir writes in this script's produce phase
# (~140 KiB a write at ~750 MiB/s, counted with perf's iomap:iomap_dio_rw_begin).
WRITE_BS=${WRITE_BS:-128k}
echo "== fio: O_DIRECT appends, $WRITE_BS blocks, iodepth 1, 2 GiB, fresh file (the write floor)"
WRITE_SYS=$(python3 -c '
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime)
sys.exit(rc)' fio --name=appends --filename="$WORK/fio.dat" --rw=write --bs="$WRITE_BS" --size=2G \
    --direct=1 --ioengine=io_uring --iodepth=1 --fallocate=none --output-format=json \
    --output="$WORK/fio-appends.json")
rm -f "$WORK/fio.dat"

echo "== iperf3: loopback, 1 stream, 10 s"
PORT=$((20000 + RANDOM % 20000))
iperf3 -s -p "$PORT" >/dev/null 2>&1 &
IPERF_PID=$!
for _ in $(seq 1 100); do ss -ltn "sport = :$PORT" | grep -q LISTEN && break; sleep 0.05; done
RECV0=$(cpu_of "$IPERF_PID")
SEND_CPU=$(rusage iperf3 -c 127.0.0.1 -p "$PORT" -t 10 -J 3>&1 >"$WORK/iperf3.json")
RECV1=$(cpu_of "$IPERF_PID")
kill "$IPERF_PID"; wait "$IPERF_PID" 2>/dev/null || true; IPERF_PID=

FLOORS_ONLY=${FLOORS_ONLY:-0}
if [ "$FLOORS_ONLY" != 1 ]; then
echo "== weir --shards $SHARDS"
mkdir -p "$WORK/data"
"$BIN/weir" serve --data-dir "$WORK/data" --listen 127.0.0.1:0 --shards "$SHARDS" ${WEIR_ARGS:-} \
    > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 200); do grep -q "listening on" "$WORK/weir.log" && break; sleep 0.05; done
ADDR=$(grep -o "listening on [0-9.:]*" "$WORK/weir.log" | head -1 | awk '{print $3}')
[ -n "$ADDR" ] || { cat "$WORK/weir.log"; exit 1; }

LG="$BIN/weir-loadgen"
COMMON=(--bootstrap "$ADDR" --partitions "$PARTITIONS" --record-size "$RECORD"
        --batch-size "$BATCH" --linger-ms 5 --quiet)
# phase NAME ARGS...: runs the loadgen, records broker and loadgen CPU seconds.
phase() {
    local name=$1; shift
    echo "== $name"
    local b0 b1 lg
    b0=$(cpu_of "$WEIR_PID")
    lg=$(rusage "$LG" "$@" --json "$WORK/$name.json" 3>&1 >/dev/null)
    b1=$(cpu_of "$WEIR_PID")
    echo "$b0 $b1 $lg" > "$WORK/$name.cpu"
}
phase produce-acks-1 produce "${COMMON[@]}" --topic t1 --acks 1 --rate max --duration "$DUR" \
    --connections "$CONNECTIONS" --max-in-flight "$IN_FLIGHT"
phase produce-acks-all produce "${COMMON[@]}" --topic tall --acks all --rate max \
    --duration "$DUR" --connections "$CONNECTIONS" --max-in-flight "$IN_FLIGHT"
phase consume consume --bootstrap "$ADDR" --topic tall --consumers "$CONSUMERS" --from earliest --quiet
fi

python3 - "$WORK" "$FIO" "$RECV0" "$RECV1" "$SEND_CPU" "$RECORD" "$FLOORS_ONLY" "$WRITE_BS" "$WRITE_SYS" <<'EOF'
import json, sys
work, fio, r0, r1, send_cpu, record = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
floors_only = sys.argv[7] == "1"
write_bs = sys.argv[8]
GiB = 2**30
aj = json.load(open(f"{work}/fio-appends.json"))["jobs"][0]
write_floor = float(sys.argv[9]) / (aj["write"]["io_bytes"] / GiB)
ip = json.load(open(f"{work}/iperf3.json"))["end"]
net_bytes = ip["sum_received"]["bytes"]
net = ip["sum_received"]["bits_per_second"] / 8 / 2**20
recv_floor = (r1 - r0) / (net_bytes / GiB)
send_floor = send_cpu / (ip["sum_sent"]["bytes"] / GiB)
print()
fio_read = json.load(open(f"{work}/fio-read.json"))["jobs"][0]["read"]["bw_bytes"] / 2**20
print(f"fio O_DIRECT seq write 1 MiB qd16: {fio:,.0f} MiB/s")
print(f"fio O_DIRECT seq read 1 MiB qd16: {fio_read:,.0f} MiB/s (a consumer's ceiling for data not in memory)")
print(f"iperf3 loopback: {net:,.0f} MiB/s; receiver {recv_floor:.3f} CPU-s/GiB, sender {send_floor:.3f} CPU-s/GiB (the floors)")
print(f"fio O_DIRECT appends {write_bs} qd1: {aj['write']['bw_bytes'] / 2**20:,.0f} MiB/s; kernel {write_floor:.3f} CPU-s/GiB (the write floor)")
if floors_only:
    sys.exit(0)
# x floor: the broker against the iperf3 receiver floor (produce) or sender floor
# (consume), as issue 14 states its aims; x recv+write: a produce against what receiving
# a byte from TCP and appending it with O_DIRECT cost this machine's kernel, the least a
# broker that does both can spend. The loadgen sends when it produces and receives when
# it consumes, so its floor is iperf3's sender, resp. receiver, side.
print(f"{'phase':<18} {'MiB/s':>8} {'x fio':>6} {'broker CPU-s/GiB':>17} {'x floor':>8} {'x recv+write':>12} {'loadgen CPU-s/GiB':>18} {'x floor':>8}")
for name, floor, lg_floor in [("produce-acks-1", recv_floor, send_floor), ("produce-acks-all", recv_floor, send_floor), ("consume", send_floor, recv_floor)]:
    j = json.load(open(f"{work}/{name}.json"))
    b0, b1, lg = map(float, open(f"{work}/{name}.cpu").read().split())
    if name == "consume":
        nbytes = j["consumed_records"] * record
        mibs = j["consumed_mb_per_sec"]
    else:
        nbytes = j["bytes"]
        mibs = j["mb_per_sec"]
    gib = max(nbytes / GiB, 1e-9)
    broker, loadgen = (b1 - b0) / gib, lg / gib
    both = f"{broker / (recv_floor + write_floor):>12.1f}" if name != "consume" else f"{'':>12}"
    print(f"{name:<18} {mibs:>8,.0f} {mibs / fio:>6.2f} {broker:>17.3f} {broker / floor:>8.1f} {both} {loadgen:>18.3f} {loadgen / lg_floor:>8.1f}")
    if name == "consume":
        consumed_mibs = mibs
print(f"consume: {consumed_mibs / net:.2f} x iperf3 loopback, {consumed_mibs / fio_read:.2f} x the disk's O_DIRECT read "
      f"(issue 14's 0.7 x iperf3 = {0.7 * net:,.0f} MiB/s; for data read from disk the disk allows {fio_read / net:.2f} x)")
EOF
