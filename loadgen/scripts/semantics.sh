#!/usr/bin/env bash
# Delivery semantics on weir, shown by `weir-loadgen verify`: a single-node weir (2 shards)
# is SIGKILLed and restarted on the same port every 2 s while 20 000 records/s are produced
# for 10 s, for acks=0, acks=1 (retries), acks=all (retries), acks=all + idempotence and
# transactions of 100 records read back read_committed (`--transactional`).
# Prints each verdict; JSON in $OUT/<case>/v.json. Run from the repo root after
# `cargo build --release -p weir -p weir-loadgen`.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-target/lg-semantics}
W=$PWD/target/release/weir
LG=$PWD/target/release/weir-loadgen
rm -rf "$OUT" && mkdir -p "$OUT"
CUR=

# SIGKILLs the broker of case dir $1 (its pid file follows restarts), waits (bounded) until
# it is gone or a zombie, then deletes its data dir: a run can leave tens of GB there.
stop_broker() {
    local P
    P=$(cat "$1/pid" 2>/dev/null) || P=
    if [ -n "$P" ]; then
        kill -9 "$P" 2>/dev/null
        for _ in $(seq 1 200); do [ -e /proc/$P ] && ! grep -qs zombie /proc/$P/status || break; sleep 0.05; done
    fi
    rm -rf "$1/data"
}
trap 'if [ -n "$CUR" ]; then stop_broker "$CUR"; fi' EXIT
trap 'exit 130' INT TERM

case_run() {
    local name=$1; shift
    local D=$PWD/$OUT/$name
    mkdir -p "$D"
    CUR=$D
    "$W" serve --data-dir "$D/data" --listen 127.0.0.1:0 --shards 2 > "$D/log" 2>&1 &
    echo $! > "$D/pid"
    for _ in $(seq 1 100); do grep -qs "weir ready" "$D/log" && break; sleep 0.1; done
    local port
    port=$(grep -o "listening on [0-9.:]*" "$D/log" | head -1 | awk -F: '{print $NF}')
    cat > "$D/restart.sh" <<EOS
#!/bin/sh
# SIGKILL, then wait (bounded) until the process is gone or a zombie (fds closed): with SO_REUSEPORT a new
# broker could otherwise bind the port next to a dying one and share its data dir.
P=\$(cat $D/pid); kill -9 "\$P" 2>/dev/null
for i in \$(seq 1 200); do [ -e /proc/\$P ] && ! grep -qs zombie /proc/\$P/status || break; sleep 0.05; done
sleep 0.2
$W serve --data-dir $D/data --listen 127.0.0.1:$port --shards 2 >> $D/log 2>&1 &
echo \$! > $D/pid
EOS
    chmod +x "$D/restart.sh"
    echo "== $name: $*"
    timeout 300 "$LG" verify --bootstrap "127.0.0.1:$port" --topic sem --partitions 4 \
        --rate 20000 --duration 10s --fault-cmd "$D/restart.sh" --fault-every 2s --quiet \
        --json "$D/v.json" "$@" 2>"$D/stderr" | grep -v "^  partition"
    stop_broker "$D"
    CUR=
    wait 2>/dev/null
}

case_run acks0 --acks 0
case_run acks1 --acks 1 --retries 1000
case_run acksall --acks all --retries 1000
case_run idempotent --acks all --idempotent --retries 1000
case_run transactional --acks all --transactional --txn-records 100 --retries 1000
