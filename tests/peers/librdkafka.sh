#!/usr/bin/env bash
# librdkafka's own test suite against a weir (issue 15 "Show").
#
# Builds librdkafka's test-runner from the source the cargo registry already holds (the
# rdkafka-sys crate carries librdkafka with its tests/), starts a weir with librdkafka's
# test-cluster settings (its "default" scenario: auto-create on, num.partitions=4), runs
# each listed test in its own test-runner process with a time cap, and prints one line per
# test and "N passed, N failed". Not in CI (a full run takes far over 15 minutes).
#
#   bash tests/peers/librdkafka.sh                 # the single-broker list below
#   bash tests/peers/librdkafka.sh 0081 0102 0113  # chosen tests
#
# Environment: WEIR_BIN (default target/release/weir, else target/debug/weir),
# TEST_CAP_S (per-test cap, default 900: 0113 alone runs ~8 minutes), TEST_KAFKA_VERSION (the broker version the
# tests assume, default 3.7.0), WORK (build and log dir, default target/librdkafka-tests).
set -u -o pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${WORK:-$ROOT/target/librdkafka-tests}"
CAP="${TEST_CAP_S:-900}"
export TEST_KAFKA_VERSION="${TEST_KAFKA_VERSION:-3.7.0}"

# Single-broker tests that need no transactions, ACLs, SASL/SSL, Java, plugins, fork or a
# no-auto-create scenario (librdkafka's tests/test.c flags and comments). Left out after
# the recorded run (tests/README.md): 0052 0077 0109 call Kafka's Java tools (KAFKA_PATH),
# 0055 0061 0137 have a sub-test with transactions.
DEFAULT_TESTS="0001 0002 0003 0005 0007 0008 0011 0012 0013 0014 0015 0016 0017 0018 0019
0020 0021 0022 0026 0028 0029 0030 0031 0033 0034 0035 0036 0039 0040 0041 0042 0044 0045
0048 0049 0050 0051 0053 0054 0056 0057 0059 0060 0063 0064 0065 0067 0068 0069 0070 0073
0075 0076 0081 0082 0083 0084 0085 0086 0088 0089 0091 0092 0093 0099 0102 0110 0112 0113
0114 0118 0122 0123 0125 0127 0130 0132 0140 0153"
TESTS_LIST="${*:-$DEFAULT_TESTS}"

src="$(ls -d "$HOME"/.cargo/registry/src/*/rdkafka-sys-*/librdkafka 2>/dev/null | sort | tail -1)"
if [ -z "$src" ]; then
    echo "no rdkafka-sys source in ~/.cargo/registry (run a cargo build of weir-tests first)" >&2
    exit 2
fi
mkdir -p "$WORK"
lrk="$WORK/librdkafka"
if [ ! -x "$lrk/tests/test-runner" ]; then
    echo "building librdkafka's test-runner from $src (a few minutes)"
    rm -rf "$lrk" && cp -r "$src" "$lrk"
    (cd "$lrk" &&
        ./configure --disable-ssl --disable-gssapi --disable-zstd --disable-curl \
            --disable-sasl >"$WORK/configure.log" 2>&1 &&
        make -j"$(nproc)" libs >"$WORK/make.log" 2>&1 &&
        make -C tests -j"$(nproc)" build >"$WORK/make-tests.log" 2>&1) || {
        echo "build failed, see $WORK/*.log" >&2
        exit 2
    }
fi

bin="${WEIR_BIN:-}"
if [ -z "$bin" ]; then
    bin="$ROOT/target/release/weir"
    [ -x "$bin" ] || bin="$ROOT/target/debug/weir"
fi
[ -x "$bin" ] || { echo "no weir binary ($bin): cargo build -p weir --bins" >&2; exit 2; }

# WEIR_NODES=3 starts a 3-node cluster (controller.quorum.voters) instead of one node:
# librdkafka's transactional tests create topics with replication factor 3, as its own
# 3-broker test cluster has.
NODES="${WEIR_NODES:-1}"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
voters=""
if [ "$NODES" -gt 1 ]; then
    for i in $(seq 1 "$NODES"); do voters="$voters${voters:+,}$i@127.0.0.1:$(free_port)"; done
fi
pids=()
datas=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    for d in "${datas[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT
addrs=""
for i in $(seq 1 "$NODES"); do
    data="$(mktemp -d "$WORK/data.XXXXXX")"
    datas+=("$data")
    out="$WORK/weir-$i.out"
    cluster_args=()
    if [ -n "$voters" ]; then
        cluster_args=(--node-id "$i" --set "controller.quorum.voters=$voters")
    fi
    "$bin" serve --data-dir "$data" --listen 127.0.0.1:0 "${cluster_args[@]}" \
        --set num.partitions=4 --set auto.create.topics.enable=true \
        --set group.initial.rebalance.delay.ms=3000 >"$out" 2>"$WORK/weir-$i.log" &
    pids+=($!)
    addr=""
    for _ in $(seq 1 300); do
        addr="$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$out")"
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "weir node $i did not start, see $WORK/weir-$i.log" >&2; exit 2; }
    addrs="$addrs${addrs:+,}$addr"
done
addr="$addrs"
# A cluster answers Metadata before its nodes have registered with the controller (each
# names itself, under its own cluster id): the tests start once every node is listed
# with a controller, as they would against a running Kafka cluster.
if [ "$NODES" -gt 1 ]; then
    ready=""
    for _ in $(seq 1 600); do
        md="$(kcat -b "$addr" -L -m 5 2>/dev/null)"
        if [ "$(printf '%s\n' "$md" | grep -c '^  broker [0-9]* at ')" -eq "$NODES" ] &&
            printf '%s\n' "$md" | grep -q '(controller)'; then
            ready=1
            break
        fi
        sleep 0.2
    done
    [ -n "$ready" ] || { echo "the $NODES nodes did not form a cluster, see $WORK/weir-*.log" >&2; exit 2; }
fi
echo "weir $addr ($NODES node(s), logs $WORK/weir-*.log), TEST_KAFKA_VERSION=$TEST_KAFKA_VERSION, cap ${CAP}s per test"

printf 'metadata.broker.list=%s\ntest.timeout.multiplier=2\n' "$addr" >"$WORK/test.conf"
export RDKAFKA_TEST_CONF="$WORK/test.conf"
# The test-runner links the just-built librdkafka and librdkafka++ (as run-test.sh does).
export LD_LIBRARY_PATH="$lrk/src:$lrk/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
passed=0
failed=0
skipped=0
failed_list=""
for t in $TESTS_LIST; do
    log="$WORK/$t.log"
    start=$(date +%s)
    (cd "$lrk/tests" && TESTS="$t" timeout -k 10 "$CAP" ./test-runner -L >"$log" 2>&1)
    rc=$?
    secs=$(($(date +%s) - start))
    # A test counts as skipped only if none of its variants ran (a `_local` variant
    # filtered out beside a run that passed is a pass).
    if [ $rc -eq 0 ] && ! grep -q "|[^|]*$t[^|]*| *[^|]*PASSED" "$log" &&
        grep -q "|[^|]*$t[^|]*| *[^|]*SKIPPED" "$log"; then
        skipped=$((skipped + 1))
        why="$(grep -m1 "|[^|]*$t[^|]*| *[^|]*SKIPPED" "$log" | sed 's/\x1b\[[0-9;]*m//g' | awk -F'|' '{print $5}' | cut -c1-120)"
        echo "SKIP $t ${secs}s$why"
    elif [ $rc -eq 0 ] && ! grep -q "TESTS FAILED\|FAILED TESTS" "$log"; then
        passed=$((passed + 1))
        echo "PASS $t ${secs}s"
    else
        failed=$((failed + 1))
        failed_list="$failed_list $t"
        # The line after librdkafka's "### Test ... failed at ..." banner says why.
        why="$(grep -m1 -A1 '^.*### Test' "$log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)"
        [ $rc -eq 124 ] && why="time cap ${CAP}s; $why"
        echo "FAIL $t ${secs}s $why"
    fi
done
echo "$passed passed, $failed failed, $skipped skipped${failed_list:+ (failed:$failed_list)}"
[ "$failed" -eq 0 ]
