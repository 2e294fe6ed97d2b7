#!/bin/bash
# trace.sh BIN TRACE: the workload hot-text.sh profiles, every node run traced into TRACE by
# $UFFD_PRELOAD (uffdtrace.c): an empty 2-shard node; 10 topics x 100 partitions created,
# produced to (500 records each, acks=all) and consumed with $LOADGEN; SIGTERM; restart;
# everything consumed again.
set -u
B=$1; T=$2; d=$(mktemp -d "${TRACE_TMP:-/tmp}/trace.XXXX"); trap 'rm -rf "$d"' EXIT; rm -f "$T"
start() {
  UFFD_TRACE=$T LD_PRELOAD=$UFFD_PRELOAD "$B" serve --data-dir "$d/data" --listen 127.0.0.1:0 --shards 2 > "$d/log" 2>&1 &
  p=$!
  for _ in $(seq 1 3000); do grep -q "weir ready" "$d/log" && break; sleep 0.01; done
  port=$(grep -o "listening on 127.0.0.1:[0-9]*" "$d/log" | tail -1 | cut -d: -f2)
}
each() { # each produce|consume
  for t in $(seq 0 9); do
    timeout 60 "$LOADGEN" "$1" --bootstrap "127.0.0.1:$port" --topic "scale-$t" --partitions 100 \
      --records 500 --record-size 100 --acks all --quiet > /dev/null 2>&1 || echo "$1 scale-$t failed" >&2
  done
}
start; each produce; each consume; kill "$p"; wait "$p"
: > "$d/log"; start; each consume; kill "$p"; wait "$p"
exit 0
