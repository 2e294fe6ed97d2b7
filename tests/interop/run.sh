#!/usr/bin/env bash
# Client interop suite: starts a real weir on an ephemeral port (data on the real disk,
# under target/), then each client — kcat (Debian's librdkafka 2.0.2), confluent-kafka,
# kafka-python, aiokafka, kafkajs — creates or auto-creates a topic, lists topics,
# produces keyed records and reads them all back, checked record by record.
# Clients come from scripts/install-test-deps.sh. Every python/*_check.py and
# node/*_check.js found is run. Prints `N passed, M failed` last and
# exits non-zero on any failure. WEIR_BIN overrides the broker binary.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

WEIR=${WEIR_BIN:-$root/target/debug/weir}
PY=$root/target/interop-venv/bin/python
NODE_DIR=$root/tests/interop/node
CHECK_TIMEOUT_S=120
READY_TIMEOUT_S=60

passed=0
failed=0
failures=()
weir_pid=
work=

cleanup() {
    if [ -n "$weir_pid" ] && kill -0 "$weir_pid" 2>/dev/null; then
        kill -TERM "$weir_pid" 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$weir_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$weir_pid" 2>/dev/null
        wait "$weir_pid" 2>/dev/null
    fi
    [ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT

if [ ! -x "$WEIR" ]; then
    echo "weir binary missing at $WEIR: run 'cargo build --workspace --bins' first (or set WEIR_BIN)" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

# Starts weir and sets BOOTSTRAP from its ready line.
start_weir() {
    mkdir -p "$root/target/interop-data"
    work=$(mktemp -d "$root/target/interop-data/run-XXXXXX")
    # Unpinned: pinned shards would sit on CPUs 0 and 1 beside the clients under test.
    "$WEIR" serve --data-dir "$work/data" --listen 127.0.0.1:0 --shards 2 \
        --set weir.shard.cpus=none >"$work/weir.log" 2>&1 &
    weir_pid=$!
    for _ in $(seq 1 $((READY_TIMEOUT_S * 10))); do
        if grep -q "weir ready" "$work/weir.log" 2>/dev/null; then
            BOOTSTRAP=$(grep -o "listening on 127\.0\.0\.1:[0-9]*" "$work/weir.log" | head -1 | sed 's/listening on //')
            [ -n "$BOOTSTRAP" ] && return 0
        fi
        kill -0 "$weir_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "weir did not become ready; log:" >&2
    tail -20 "$work/weir.log" >&2
    return 1
}

# check NAME COMMAND...: runs one client check (bounded in time), records pass/fail.
check() {
    local name=$1
    shift
    local out="$work/$name.out"
    local start=$SECONDS
    if timeout "$CHECK_TIMEOUT_S" "$@" >"$out" 2>&1; then
        passed=$((passed + 1))
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAIL $name ($((SECONDS - start)) s):"
        tail -25 "$out" | sed 's/^/    /'
    fi
}

# kcat: produce to a topic it auto-creates (Metadata with auto-create) once per codec,
# list it, consume everything.
kcat_check() {
    local topic=interop-kcat
    local want="$work/kcat.want" got="$work/kcat.got" all="$work/kcat.all"
    for i in $(seq 1 300); do echo "key-$((i % 17)):kcat-value-$i"; done >"$want"
    : >"$all"
    for codec in none gzip snappy lz4 zstd; do
        kcat -P -b "$BOOTSTRAP" -t "$topic" -K: -z "$codec" -X request.required.acks=-1 <"$want" || return 1
        cat "$want" >>"$all"
    done
    kcat -L -b "$BOOTSTRAP" -t "$topic" | grep -q "topic \"$topic\" with 1 partitions" || {
        echo "kcat -L does not list $topic with 1 partition:"; kcat -L -b "$BOOTSTRAP"; return 1; }
    kcat -L -b "$BOOTSTRAP" | grep -q "topic \"$topic\"" || { echo "$topic missing from the full listing"; return 1; }
    kcat -C -b "$BOOTSTRAP" -t "$topic" -o beginning -e -q -f '%o %k:%s\n' >"$got" || return 1
    # One partition: offsets 0..1499 in send order, each line as sent.
    if ! diff <(awk '{print NR-1 " " $0}' "$all") "$got" >"$work/kcat.diff"; then
        echo "consumed records differ from the produced ones:"; head -20 "$work/kcat.diff"; return 1
    fi
}

start_weir || { echo "0 passed, 1 failed"; exit 1; }
# `timeout` runs programs, not shell functions: export what kcat_check needs.
export BOOTSTRAP work
export -f kcat_check
echo "weir $("$WEIR" --version 2>/dev/null | head -1) at $BOOTSTRAP"

if command -v kcat >/dev/null; then
    check kcat bash -c kcat_check
else
    check kcat sh -c 'echo "kcat not installed: run scripts/install-test-deps.sh"; exit 1'
fi
# Every python/<name>_check.py and node/<name>_check.js is one check, run as
# `<script> BOOTSTRAP TOPIC` against this broker (a new client check needs no edit here).
for script in "$root"/tests/interop/python/*_check.py; do
    name=$(basename "$script" _check.py)
    if [ -x "$PY" ]; then
        check "$name" "$PY" "$script" "$BOOTSTRAP" "interop-$name"
    else
        check "$name" sh -c "echo 'no venv at $PY: run scripts/install-test-deps.sh'; exit 1"
    fi
done
for script in "$NODE_DIR"/*_check.js; do
    name=$(basename "$script" _check.js)
    if [ -d "$NODE_DIR/node_modules/kafkajs" ]; then
        check "$name" node "$script" "$BOOTSTRAP" "interop-$name"
    else
        check "$name" sh -c "echo 'kafkajs not installed: run scripts/install-test-deps.sh'; exit 1"
    fi
done

if ! kill -0 "$weir_pid" 2>/dev/null; then
    failed=$((failed + 1))
    echo "FAIL weir exited during the suite; log:"
    tail -20 "$work/weir.log" | sed 's/^/    /'
fi
[ "$failed" -gt 0 ] && echo "failed: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
