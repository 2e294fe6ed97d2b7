#!/usr/bin/env bash
# Single-producer 1 MiB appends (issue 14's aim: >= 0.8 x fio at the same block size).
# The storage bench's 1 MiB cases (one appender, 16 appenders) beside fio sequential
# O_DIRECT 1 MiB writes at queue depth 1 to a fresh file, alternating, ROUNDS times.
# Prints criterion's throughput lines and fio's WRITE line per round; the ratio is
# tasks1 / fio of the same round. fio's file is deleted after each round.
#
#   bash bench/append_1mib.sh            # ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
cargo bench -p weir-bench --bench storage_log --no-run 2>&1 | grep -E '^error' && exit 1
BIN=$(ls -t target/release/deps/storage_log-* | grep -v '\.d$' | head -1)
mkdir -p target/tmp
trap 'rm -f target/tmp/fio-seqwrite.dat' EXIT
for r in $(seq "$ROUNDS"); do
  echo "== round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd bench && "../$BIN" --bench 'storage_append/tasks(1|16)/1MiB' 2>&1 | grep -E '^storage_append|thrpt:' | grep -v '%')
  fio --name=seqwrite --filename=target/tmp/fio-seqwrite.dat --rw=write --direct=1 --bs=1m \
    --size=4G --ioengine=io_uring --iodepth=1 --numjobs=1 --fallocate=none 2>&1 | grep -E 'WRITE:'
  rm -f target/tmp/fio-seqwrite.dat
done
