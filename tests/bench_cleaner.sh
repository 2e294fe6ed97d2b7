#!/usr/bin/env bash
# A producer's throughput to a compacted topic with the log cleaner off and on, in the same
# run, interleaved (off, on, off, on, ...): RUNS runs each (default 3) of DURATION seconds
# (default 20) after a 3 s warm-up; one line per run, then the medians. weir-loadgen
# produces 1 KiB values over KEYS keyed records (default 1000; a compacted topic refuses
# keyless records), acks=1, closed loop (--rate max), to one partition of a fresh one-shard
# broker whose logs are all `cleanup.policy=compact` with 8 MiB segments, so the cleaner
# (every 200 ms, unthrottled) has freshly sealed dirty segments to clean all along. The
# "cleaner" columns come from its "log cleaner compacted" lines.
# CLEANER_IO=BYTES sets log.cleaner.io.max.bytes.per.second (Kafka's throttle; default
# unlimited, as Kafka's).
# Usage: tests/bench_cleaner.sh [RUNS] [DURATION_S] [KEYS]
#   (needs target/release/weir and target/release/weir-loadgen, or WEIR_RELEASE_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DUR=${2:-20}
KEYS=${3:-1000}
BIN=${WEIR_RELEASE_DIR:-target/release}
work=$(mktemp -d -p "${BENCH_TMPDIR:-target}")
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

one() { # ENABLE RUN
    local d="$work/$1-$2" addr
    mkdir -p "$d"
    "$BIN/weir" serve --data-dir "$d/data" --shards 1 --listen 127.0.0.1:0 \
        --set log.cleaner.enable="$1" --set log.cleaner.backoff.ms=200 \
        ${CLEANER_IO:+--set log.cleaner.io.max.bytes.per.second=$CLEANER_IO} \
        --set log.cleanup.policy=compact --set log.segment.bytes=8388608 >"$d/weir.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do grep -q "weir ready" "$d/weir.log" && break; sleep 0.1; done
    addr=$(grep "weir ready" "$d/weir.log" | sed -E 's/.*listening on ([0-9.:]+).*/\1/')
    "$BIN/weir-loadgen" produce --bootstrap "$addr" --topic c --partitions 1 --record-size 1024 \
        --keys "$KEYS" --rate max --duration "${DUR}s" --warmup 3s --acks 1 \
        --json "$d/out.json" --quiet >/dev/null
    local log_mib
    log_mib=$(du -sm "$d/data/c-0" | cut -f1)
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
    python3 - "$1" "$2" "$d/out.json" "$d/weir.log" "$log_mib" <<'EOF'
import json, re, sys
enable, run, out, log, log_mib = sys.argv[1:]
o = json.load(open(out))
cleans, before, after = 0, 0, 0
for line in open(log):
    if "log cleaner compacted" in line:
        cleans += 1
        before += int(re.search(r"bytes_before=(\d+)", line).group(1))
        after += int(re.search(r"bytes_after=(\d+)", line).group(1))
errors = sum(o.get("errors", {}).values())
print(f"cleaner={enable:<5} run={run} mb_per_sec={o['mb_per_sec']:.1f} "
      f"records_per_sec={o['records_per_sec']:.0f} p99_ms={(o['publish_latency_ms'] or {}).get('p99', float('nan')):.1f} "
      f"errors={errors} cleans={cleans} cleaned_mib={before / 2**20:.0f}->{after / 2**20:.1f} "
      f"log_mib_at_end={log_mib}")
EOF
}

for run in $(seq 1 "$RUNS"); do
    for enable in false true; do
        one "$enable" "$run" | tee -a "$work/lines"
    done
done
python3 - "$work/lines" <<'EOF'
import re, statistics, sys
rows = {"false": [], "true": []}
for line in open(sys.argv[1]):
    m = re.search(r"cleaner=(\w+).*mb_per_sec=([\d.]+)", line)
    rows[m.group(1)].append(float(m.group(2)))
off, on = statistics.median(rows["false"]), statistics.median(rows["true"])
print(f"median mb_per_sec: cleaner off {off:.1f}, cleaner on {on:.1f} ({(on / off - 1) * 100:+.1f} %)")
EOF
