#!/usr/bin/env bash
# The mission's benchmark (issue 11): `weir-loadgen sweep --acks 0,1,all` against a 3-node
# weir cluster on this machine, a topic with replication factor 3 (min.insync.replicas=2)
# beside one with replication factor 1, in the same run and the same cluster. Each node's
# Prometheus endpoint is scraped (`--metrics-url`), so the HTML reports chart follower lag
# (records and ms) over time. Phases:
#   1. the floors: fio O_DIRECT write and iperf3 loopback (bench/efficiency.sh FLOORS_ONLY=1)
#   2. closed loop (--rate max) sweep on the RF=1 topic, then on the RF=3 topic
#   3. open loop at half load: each topic at half of its own acks=all max throughput
#   4. the cluster's CPU per GiB: one more acks=all closed-loop run on each topic, with the
#      three nodes' CPU seconds (utime+stime from /proc/PID/stat) before and after, so the
#      ratio shows how much of the RF 3 / RF 1 gap is work (three copies of every byte on
#      the same cores) rather than waiting (CPU=0 skips it)
# then a ratio table: acks=all RF3 / RF1 throughput, and publish p99 at half load (the aims:
# ≥ 0.5 and ≤ 5 ms). Reports and JSON in $OUT; node logs in $OUT/node-N.log; data dirs
# are deleted on exit, as are the nodes.
#
#   bash loadgen/scripts/cluster_sweep.sh
#   DURATION=20s WARMUP=3s PARTITIONS=3 RECORD=1024 E2E=1 bash loadgen/scripts/cluster_sweep.sh
#
# Run from the repo root; builds release binaries unless BUILD=0. E2E=1 runs each sweep
# step as e2e (a consumer beside the producer) instead of --produce-only. FLOORS=0 skips
# fio/iperf3. PERF=1 records `perf record --call-graph dwarf` (release has no frame
# pointers, so plain -g loses the callers) of the leader of the RF=3 topic's partition 0
# during an extra acks=all RF=3 run ($OUT/perf.data, summary in $OUT/perf-report.txt;
# loadgen/scripts/perf_fetch_copies.py counts copies under the Fetch handler and send path).
# PHASES=1 scrapes every node's /metrics around the half-load RF=3 step and prints the
# acks=all round trip's phases from their histograms (loadgen/scripts/phase_hist.py).
# SCHED=1 records `perf sched` for SCHED_SECS (4) during that step and prints how long the
# nodes' threads waited for a CPU once runnable (loadgen/scripts/sched_delay.py).
# COUNTS=1 counts, system-wide during the CPU phase, O_DIRECT writes, io-wq punts, context
# switches, syscalls and loopback packets, and prints each per GiB acked; $OUT/cpu-rf*.trace
# has 2 s of `perf trace -s` (syscalls per thread) from the same run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/target/lg-cluster-sweep}
W=${WEIR_BIN:-$PWD/target/release/weir}
LG=${LOADGEN_BIN:-$PWD/target/release/weir-loadgen}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
PARTITIONS=${PARTITIONS:-3}
RECORD=${RECORD:-1024}
ACKS=${ACKS:-0,1,all}
SHARDS=${SHARDS:-1}
# weir.shard.cpus for every node: by default each node pins its shard s to CPU s, so the
# three nodes' shards would all share CPU 0 and leave CPU 1 to the load generator.
SHARD_CPUS=${SHARD_CPUS:-none}
E2E=${E2E:-0}
FLOORS=${FLOORS:-1}
PERF=${PERF:-0}
EXTRA=(${LOADGEN_ARGS:-})
# NODE_ARGS: more `weir serve` arguments for every node, e.g. "--set replica.fetch.min.bytes=65536".
NODE_ARGS=(${NODE_ARGS:-})

if [ "${BUILD:-1}" = 1 ]; then
    cargo build --release -p weir -p weir-loadgen --bins >/dev/null || exit 1
fi
mkdir -p "$OUT"
rm -rf "$OUT"/data-* "$OUT"/*.json "$OUT"/*.html "$OUT"/node-*.log

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a PORT CPORT MPORT PID
for i in 1 2 3; do PORT[$i]=$(free_port); CPORT[$i]=$(free_port); MPORT[$i]=$(free_port); done
VOTERS="1@127.0.0.1:${CPORT[1]},2@127.0.0.1:${CPORT[2]},3@127.0.0.1:${CPORT[3]}"
BOOT="127.0.0.1:${PORT[1]},127.0.0.1:${PORT[2]},127.0.0.1:${PORT[3]}"

cleanup() {
    for i in 1 2 3; do
        [ -n "${PID[$i]:-}" ] || continue
        kill -9 "${PID[$i]}" 2>/dev/null
        wait "${PID[$i]}" 2>/dev/null
    done
    rm -rf "$OUT"/data-*
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$FLOORS" = 1 ]; then
    echo "== floors (bench/efficiency.sh FLOORS_ONLY=1)"
    FLOORS_ONLY=1 BUILD=0 bash bench/efficiency.sh 2>&1 | grep -E '^(fio|iperf3)' | tee "$OUT/floors.txt"
fi

for i in 1 2 3; do
    "$W" serve --data-dir "$OUT/data-$i" --listen "127.0.0.1:${PORT[$i]}" --node-id "$i" \
        --shards "$SHARDS" --set weir.shard.cpus="$SHARD_CPUS" \
        --set controller.quorum.voters="$VOTERS" \
        --set metrics.listener="127.0.0.1:${MPORT[$i]}" \
        --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=3000 \
        --set controller.quorum.election.timeout.ms=500 \
        --set log.retention.check.interval.ms=5000 \
        --set default.replication.factor=3 --set min.insync.replicas=2 "${NODE_ARGS[@]}" \
        > "$OUT/node-$i.log" 2>&1 &
    PID[$i]=$!
done
for i in 1 2 3; do
    for _ in $(seq 1 300); do grep -qs "weir ready" "$OUT/node-$i.log" && break; sleep 0.1; done
done
# The cluster agrees once every node lists three brokers.
for _ in $(seq 1 300); do
    n=$(kcat -b "$BOOT" -L -J -m 5 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["brokers"]))' 2>/dev/null)
    [ "${n:-0}" = 3 ] && break; sleep 0.2
done
[ "${n:-0}" = 3 ] || { echo "cluster did not form"; tail -5 "$OUT"/node-*.log; exit 1; }

# A sweep at max writes tens of GB (RF 3 writes every byte three times): retention keeps
# each partition replica near RETAIN_BYTES (1 GiB), checked every 5 s, so the disk cannot fill.
BOUND=(--config retention.bytes="${RETAIN_BYTES:-1073741824}" --config segment.bytes=134217728)
"$W" topics --bootstrap-server "127.0.0.1:${PORT[1]}" create sweep-rf3 --partitions "$PARTITIONS" \
    --replication-factor 3 --config min.insync.replicas=2 "${BOUND[@]}" || exit 1
# min.insync.replicas=1: the broker default (2) would refuse acks=all on a single replica.
"$W" topics --bootstrap-server "127.0.0.1:${PORT[1]}" create sweep-rf1 --partitions "$PARTITIONS" \
    --replication-factor 1 --config min.insync.replicas=1 "${BOUND[@]}" || exit 1
# Every partition led and (RF=3) fully in sync before measuring.
for _ in $(seq 1 300); do
    ok=$(kcat -b "$BOOT" -L -J -m 5 2>/dev/null | python3 -c '
import json, sys
t = {x["topic"]: x for x in json.load(sys.stdin)["topics"]}
def ready(name, rf):
    ps = t.get(name, {}).get("partitions", [])
    return len(ps) == '"$PARTITIONS"' and all(p["leader"] >= 0 and len(p.get("isrs", [])) == rf for p in ps)
print(int(ready("sweep-rf3", 3) and ready("sweep-rf1", 1)))' 2>/dev/null)
    [ "${ok:-0}" = 1 ] && break; sleep 0.2
done
"$W" topics --bootstrap-server "127.0.0.1:${PORT[1]}" describe sweep-rf3 sweep-rf1

METRICS=()
for i in 1 2 3; do METRICS+=(--metrics-url "http://127.0.0.1:${MPORT[$i]}/metrics"); done
MODE=(--produce-only)
[ "$E2E" = 1 ] && MODE=()
# sweep NAME TOPIC RATE: one `weir-loadgen sweep` over $ACKS, JSON and HTML in $OUT.
sweep() {
    local name=$1 topic=$2 rate=$3
    echo "== $name: sweep --acks $ACKS on $topic, --rate $rate"
    timeout 900 "$LG" sweep --bootstrap "127.0.0.1:${PORT[1]}" --topic "$topic" --partitions "$PARTITIONS" \
        --acks "$ACKS" --record-sizes "$RECORD" --rate "$rate" --duration "$DURATION" \
        --warmup "$WARMUP" "${MODE[@]}" "${METRICS[@]}" --quiet "${EXTRA[@]}" \
        --json "$OUT/$name.json" --report "$OUT/$name.html"
}
# The acks=all row's records/s of a sweep's JSON.
all_rate() {
    python3 -c 'import json,sys; r=[x for x in json.load(open(sys.argv[1]))["rows"] if x["label"].startswith("acks=all")]; print(r[0]["records_per_sec"] if r else 0)' "$1"
}
sweep max-rf1 sweep-rf1 max || exit 1
sweep max-rf3 sweep-rf3 max || exit 1
HALF1=$(python3 -c "print(max(1, int($(all_rate "$OUT/max-rf1.json") / 2)))")
HALF3=$(python3 -c "print(max(1, int($(all_rate "$OUT/max-rf3.json") / 2)))")
sweep half-rf1 sweep-rf1 "$HALF1" || exit 1
# scrape_all TAG: every node's /metrics into $OUT/phases/TAG-N.txt.
scrape_all() {
    mkdir -p "$OUT/phases"
    for i in 1 2 3; do curl -s "http://127.0.0.1:${MPORT[$i]}/metrics" > "$OUT/phases/$1-$i.txt"; done
}
[ "${PHASES:-0}" = 1 ] && scrape_all before
if [ "${SCHED:-0}" = 1 ]; then
    # How long the nodes' runnable threads wait for a CPU during the half-load RF 3 step:
    # an acks=all produce needs the leader, then each follower, then the leader again to
    # be scheduled, so these waits add up along the round trip.
    ( sleep "${WARMUP%s}"; perf sched record -a -o "$OUT/sched.data" -- sleep "${SCHED_SECS:-4}" \
        > "$OUT/sched-record.log" 2>&1 ) &
    SCHED_PID=$!
fi
sweep half-rf3 sweep-rf3 "$HALF3" || exit 1
if [ "${SCHED:-0}" = 1 ]; then
    wait "$SCHED_PID"
    perf sched timehist -i "$OUT/sched.data" 2>/dev/null > "$OUT/sched-timehist.txt"
    echo "== scheduler delay of every thread during the half-load RF 3 step (perf sched timehist)"
    python3 loadgen/scripts/sched_delay.py "$OUT/sched-timehist.txt" "${PID[1]}" "${PID[2]}" "${PID[3]}" \
        | tee "$OUT/sched.txt"
    rm -f "$OUT/sched.data"
fi
if [ "${PHASES:-0}" = 1 ]; then
    scrape_all after
    echo "== the acks=all round trip's phases during the half-load RF 3 step (all nodes)"
    python3 loadgen/scripts/phase_hist.py "$OUT/phases" | tee "$OUT/phases.txt"
fi

# cpu_of PID: CPU seconds (user + system) the process has used so far.
CLK_TCK=$(getconf CLK_TCK)
cpu_of() { awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
nodes_cpu() { local s=0; for i in 1 2 3; do s=$(python3 -c "print($s + $(cpu_of "${PID[$i]}"))"); done; echo "$s"; }
# machine_cpu: CPU seconds the whole machine has been busy (every CPU's non-idle time from
# /proc/stat): the nodes, the load generator and the kernel's own threads (ext4's
# unwritten-extent conversion, softirqs), which the nodes' /proc/PID/stat does not count.
machine_cpu() { awk -v t="$CLK_TCK" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8) / t }' /proc/stat; }
# storage_counts: "<name> <sum over the nodes>" for the storage counters COUNTS=1 prints.
storage_counts() {
    for m in weir_storage_appends_total weir_storage_leader_writes_total weir_storage_follower_writes_total; do
        local sum=0 v
        for i in 1 2 3; do
            v=$(curl -s "http://127.0.0.1:${MPORT[$i]}/metrics" | awk -v m="$m" '$1 == m { print $2 }')
            sum=$(( sum + ${v:-0} ))
        done
        echo "$m $sum"
    done
}
# cpu_phase NAME TOPIC: acks=all at max on TOPIC; writes "<node CPU-s> <bytes acked>" to $OUT/NAME.cpu.
cpu_phase() {
    local name=$1 topic=$2 c0 c1 m0 m1 line
    c0=$(nodes_cpu)
    m0=$(machine_cpu)
    if [ "${COUNTS:-0}" = 1 ]; then
        storage_counts > "$OUT/$name.storage0"
        # System-wide event counts over the same run (all nodes, their io-wq workers and
        # the load generator): O_DIRECT writes, writes punted to io-wq, context switches,
        # syscalls. Per GiB acked they say which per-operation cost grows with RF.
        perf stat -a -x, -o "$OUT/$name.counts" -e iomap:iomap_dio_rw_begin \
            -e io_uring:io_uring_queue_async_work -e sched:sched_switch -e raw_syscalls:sys_enter \
            -e net:net_dev_xmit -- sleep "${DURATION%s}" > /dev/null 2>&1 &
        local stat_pid=$!
        # Which threads make the syscalls, and which ones: 2 s of `perf trace -s`.
        ( sleep 2; perf trace -s -a -o "$OUT/$name.trace" -- sleep 2 > /dev/null 2>&1 ) &
        local trace_pid=$!
    fi
    line=$("$LG" produce --bootstrap "127.0.0.1:${PORT[1]}" --topic "$topic" --partitions "$PARTITIONS" --acks all \
        --record-size "$RECORD" --rate max --duration "$DURATION" "${EXTRA[@]}" 2>&1 | grep -m1 'records acked in')
    c1=$(nodes_cpu)
    m1=$(machine_cpu)
    echo "$(python3 -c "print($c1 - $c0)") $(( ${line%% records*} * RECORD )) $(python3 -c "print($m1 - $m0)")" > "$OUT/$name.cpu"
    echo "== $name: $line; nodes used $(cut -d' ' -f1 "$OUT/$name.cpu") CPU-s, the machine $(python3 -c "print(round($m1 - $m0, 2))") CPU-s"
    if [ "${COUNTS:-0}" = 1 ]; then
        storage_counts > "$OUT/$name.storage1"
        # The nodes' own counters: a leader's segment writes against a follower's.
        paste "$OUT/$name.storage0" "$OUT/$name.storage1" | awk -v acked="$(( ${line%% records*} * RECORD ))" \
            '{ printf "   %-40s %12.0f per GiB acked\n", $1, ($4 - $2) / (acked / 2^30) }'
        wait "$stat_pid" "$trace_pid"
        python3 - "$OUT/$name.counts" "$(( ${line%% records*} * RECORD ))" <<'PY'
import sys
path, acked = sys.argv[1], int(sys.argv[2])
gib = acked / 2**30 or 1
for row in open(path):
    f = row.strip().split(",")
    if len(f) < 3 or not f[0].replace(".", "").isdigit():
        continue
    # perf counts over the sleep; the produce ran about as long, so scale per GiB acked.
    print(f"   {f[2]:<40} {float(f[0]) / gib:>12,.0f} per GiB acked")
PY
    fi
}
if [ "${CPU:-1}" = 1 ]; then
    cpu_phase cpu-rf1 sweep-rf1
    cpu_phase cpu-rf3 sweep-rf3
fi

if [ "$PERF" = 1 ]; then
    leader=$(kcat -b "$BOOT" -L -t sweep-rf3 -J -m 5 2>/dev/null \
        | python3 -c 'import json,sys; t=json.load(sys.stdin)["topics"][0]; print([p["leader"] for p in t["partitions"] if p["partition"]==0][0])')
    echo "== perf record -g on node $leader (pid ${PID[$leader]}) during acks=all RF=3 at max"
    perf record --call-graph dwarf,16384 -F 499 -p "${PID[$leader]}" -o "$OUT/perf.data" -- sleep "${PERF_SECS:-12}" \
        > "$OUT/perf-record.log" 2>&1 &
    PERF_PID=$!
    "$LG" produce --bootstrap "127.0.0.1:${PORT[1]}" --topic sweep-rf3 --partitions "$PARTITIONS" --acks all \
        --record-size "$RECORD" --rate max --duration "${PERF_SECS:-12}s" "${METRICS[@]}" --quiet "${EXTRA[@]}"
    wait "$PERF_PID"
    perf report -i "$OUT/perf.data" --no-children --no-inline --percent-limit 1 --stdio -G 2>/dev/null \
        > "$OUT/perf-report.txt"
    echo "perf report in $OUT/perf-report.txt"
fi

echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/loadavg.txt"
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
def rows(name):
    return {r["label"].split()[0]: r for r in json.load(open(f"{out}/{name}.json"))["rows"]}
m1, m3, h1, h3 = rows("max-rf1"), rows("max-rf3"), rows("half-rf1"), rows("half-rf3")
print()
print(f"{'acks':<10} {'RF1 rec/s':>11} {'RF3 rec/s':>11} {'RF3/RF1':>8} "
      f"{'RF1 MB/s':>9} {'RF3 MB/s':>9} {'half RF1 p99':>13} {'half RF3 p99':>13} "
      f"{'RF3 flw lag':>12} {'flw ms':>7}")
for a in m1:
    r1, r3 = m1[a], m3.get(a)
    if r3 is None:
        continue
    ratio = r3["records_per_sec"] / max(r1["records_per_sec"], 1e-9)
    # A latency without samples is null in the JSON: NaN here.
    p1 = (h1.get(a, {}).get("publish_latency_ms") or {}).get("p99", float("nan"))
    p3 = (h3.get(a, {}).get("publish_latency_ms") or {}).get("p99", float("nan"))
    lag = max(r3.get("follower_lag_max_records") or 0, h3.get(a, {}).get("follower_lag_max_records") or 0)
    lag_ms = max(r3.get("follower_lag_max_ms") or 0, h3.get(a, {}).get("follower_lag_max_ms") or 0)
    print(f"{a:<10} {r1['records_per_sec']:>11,.0f} {r3['records_per_sec']:>11,.0f} {ratio:>8.2f} "
          f"{r1['mb_per_sec']:>9.1f} {r3['mb_per_sec']:>9.1f} {p1:>10.2f} ms {p3:>10.2f} ms "
          f"{lag:>12} {lag_ms:>7.0f}")
a1, a3 = m1.get("acks=all"), m3.get("acks=all")
if a1 and a3:
    ratio = a3["records_per_sec"] / max(a1["records_per_sec"], 1e-9)
    p99 = (h3.get("acks=all", {}).get("publish_latency_ms") or {}).get("p99", float("nan"))
    print(f"\naims: acks=all RF3/RF1 throughput {ratio:.2f} (aim >= 0.5: {'met' if ratio >= 0.5 else 'missed'}); "
          f"acks=all RF3 publish p99 at half load {p99:.2f} ms (aim <= 5 ms: {'met' if p99 <= 5 else 'missed'})")
errs = {n: sum(r["errors"] for r in rows(n).values()) for n in ("max-rf1", "max-rf3", "half-rf1", "half-rf3")}
print(f"errors per sweep: {errs}")
import os
GiB = 1 << 30
costs, machine = {}, {}
for n in ("cpu-rf1", "cpu-rf3"):
    f = f"{out}/{n}.cpu"
    if os.path.exists(f):
        cpu_s, nbytes, machine_s = open(f).read().split()
        if int(nbytes) > 0:
            costs[n] = float(cpu_s) / (int(nbytes) / GiB)
            machine[n] = float(machine_s) / (int(nbytes) / GiB)
if len(costs) == 2:
    r = costs["cpu-rf1"] / costs["cpu-rf3"]
    print(f"cluster CPU per GiB acked, acks=all: RF1 {costs['cpu-rf1']:.2f} CPU-s, RF3 {costs['cpu-rf3']:.2f} CPU-s "
          f"(RF1/RF3 = {r:.2f}: the RF3/RF1 throughput a CPU-bound machine allows); the whole machine "
          f"(nodes, load generator, kernel threads): RF1 {machine['cpu-rf1']:.2f}, RF3 {machine['cpu-rf3']:.2f} CPU-s")
    # The least an RF 3 byte can add, from this run's floors: each follower copy is one
    # send (leader), one receive and one O_DIRECT append (follower), at the kernel's own cost.
    import re
    floors = open(f"{out}/floors.txt").read() if os.path.exists(f"{out}/floors.txt") else ""
    m = re.search(r"receiver ([0-9.]+) CPU-s/GiB, sender ([0-9.]+)", floors)
    w = re.search(r"kernel ([0-9.]+) CPU-s/GiB \(the write floor\)", floors)
    if m and w:
        copy = float(m.group(1)) + float(m.group(2)) + float(w.group(1))
        c1 = costs["cpu-rf1"]
        print(f"floors: a follower copy costs at least {copy:.2f} CPU-s/GiB (send + receive + append); "
              f"with RF1 at {c1:.2f}, RF3 >= {c1 + 2 * copy:.2f} CPU-s/GiB, so on shared cores "
              f"RF3/RF1 <= {c1 / (c1 + 2 * copy):.2f} even with followers at the kernel's floor")
    # With COUNTS=1: what each follower round costs. RF 3 adds the followers' copies, and
    # each copy is written once per fetch round, so (RF3 - RF1) CPU per GiB over the
    # follower writes per GiB is the CPU one round costs the cluster, both ends together.
    def counted(n, metric):
        f = f"{out}/{n}.storage0", f"{out}/{n}.storage1"
        if not all(os.path.exists(x) for x in f):
            return None
        v = [dict(l.split() for l in open(x) if l.strip()) for x in f]
        return int(v[1][metric]) - int(v[0][metric])
    rounds = counted("cpu-rf3", "weir_storage_follower_writes_total")
    if rounds:
        nbytes = open(f"{out}/cpu-rf3.cpu").read().split()[1]
        per_gib = rounds / (int(nbytes) / GiB)
        extra = costs["cpu-rf3"] - costs["cpu-rf1"]
        print(f"follower rounds: {per_gib:,.0f} writes per GiB acked ({2 * GiB / per_gib / 1024:.0f} KiB each: two followers); "
              f"(RF3 - RF1) CPU per round: {extra / per_gib * 1e6:.0f} us")
print(f"reports: {out}/max-rf1.html max-rf3.html half-rf1.html half-rf3.html")
EOF
