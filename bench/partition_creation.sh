#!/usr/bin/env bash
# Partition creation on the shard's thread (issue 14): how long a 1-shard node answers
# nothing while one producer first writes to 1,000 new partitions. One run per binary
# directory given, alternating ROUNDS times: a fresh node and data dir, an ApiVersions
# probe on its own connection every 10 ms, then `weir-loadgen produce` of RECORDS records
# (acks=1) to a new PARTITIONS-partition topic. Prints the producer's wall time and the
# probe's longest round trip (the longest time the shard answered nothing) per run.
#
# Usage: bench/partition_creation.sh DIR [DIR ...]   (each DIR holds weir and weir-loadgen)
#   ROUNDS=3 PARTITIONS=1000 RECORDS=128000 bench/partition_creation.sh target/before target/release
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
PARTITIONS=${PARTITIONS:-1000}
RECORDS=${RECORDS:-128000}
[ $# -ge 1 ] || { sed -n '2,11p' "$0"; exit 2; }

mkdir -p target
WORK=$(mktemp -d "$PWD/target/partition-creation.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat > "$WORK/probe.py" <<'PY'
# ApiVersions v0 every 10 ms on one connection until SIGTERM; writes the longest round trip.
import signal, socket, struct, sys, time
host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
stop, rtts, cid = False, [], 0
def done(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, done)
def recv_exact(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b
while not stop:
    cid += 1
    body = struct.pack(">hhih", 18, 0, cid, 5) + b"probe"
    t0 = time.monotonic()
    s.sendall(struct.pack(">i", len(body)) + body)
    recv_exact(struct.unpack(">i", recv_exact(4))[0])
    rtts.append(time.monotonic() - t0)
    time.sleep(0.01)
rtts.sort()
with open(out, "w") as f:
    f.write("probes %d, longest wait %.0f ms, p99 %.1f ms\n"
            % (len(rtts), rtts[-1] * 1000, rtts[int(len(rtts) * 0.99)] * 1000))
PY

one_run() {
    local bin=$1 data="$WORK/data" log="$WORK/weir.log" addr weir probe t0 t1
    rm -rf "$data"
    "$bin/weir" serve --shards 1 --data-dir "$data" --listen 127.0.0.1:0 > "$log" 2>&1 &
    weir=$!; PIDS+=("$weir")
    for _ in $(seq 1 300); do grep -q "weir ready" "$log" && break; sleep 0.1; done
    addr=$(grep -o "listening on [0-9.:]*" "$log" | head -1 | awk '{print $3}')
    [ -n "$addr" ] || { cat "$log"; exit 1; }
    python3 "$WORK/probe.py" 127.0.0.1 "${addr##*:}" "$WORK/probe.out" &
    probe=$!; PIDS+=("$probe")
    t0=$(date +%s.%N)
    "$bin/weir-loadgen" produce --bootstrap "$addr" --topic t --partitions "$PARTITIONS" \
        --records "$RECORDS" --acks 1 --consumers 0 --quiet > "$WORK/loadgen.out" 2>&1
    t1=$(date +%s.%N)
    kill -TERM "$probe"; wait "$probe" || true
    kill -TERM "$weir"; wait "$weir" || true
    printf '%-24s produce %6.2f s; %s\n' "$bin" "$(echo "$t1 - $t0" | bc)" "$(cat "$WORK/probe.out")"
}

for _ in $(seq 1 "$ROUNDS"); do
    for bin in "$@"; do one_run "$bin"; done
done
