#!/usr/bin/env bash
# PLAINTEXT beside SSL on one broker, in the same run: produce and consume MIB MiB of
# 1 KiB records on each listener, and the broker's CPU seconds per GiB moved (utime+stime
# from /proc). The client is weir-loadgen (CLIENT=loadgen, the default: a release client
# that can push the broker; its own CPU per GiB is printed too) or confluent-kafka from
# Python (CLIENT=python, one thread of 1 KiB produce() calls: it bounds the rate itself).
# Usage: tests/security/bench_tls.sh [MIB]
#   needs target/release/weir and target/release/weir-loadgen (or the venv for python)
set -euo pipefail
cd "$(dirname "$0")/../.."
MIB=${1:-1024}
WEIR=${WEIR_BIN:-target/release/weir}
PY=${WEIR_TEST_PYTHON:-target/interop-venv/bin/python}
LOADGEN=${LOADGEN_BIN:-target/release/weir-loadgen}
CLIENT=${CLIENT:-loadgen}
work=$(mktemp -d -p target)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/pki" && cd "$work/pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
    -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile server.ext -out server.pem 2>/dev/null
cat server.key server.pem > keystore.pem
cd - >/dev/null
"$WEIR" serve --data-dir "$work/data" --shards 1 --listen 127.0.0.1:0 \
    --set listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0 \
    --set ssl.keystore.location="$work/pki/keystore.pem" >"$work/weir.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q "weir ready" "$work/weir.log" && break; sleep 0.1; done
line=$(grep "weir ready" "$work/weir.log")
plain=$(sed -E 's/.*PLAINTEXT=([0-9.:]+).*/\1/' <<<"$line")
ssl=$(sed -E 's/.* SSL=([0-9.:]+).*/\1/' <<<"$line")
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
run() { # NAME CONF ACTION
    local before after out
    before=$(cpu)
    out=$("$PY" tests/security/kafka_client.py "$3" "$2" "t-$1" "$MIB" | tail -1)
    after=$(cpu)
    awk -v o="$out" -v n="$1" -v a="$3" -v d=$((after - before)) -v t="$tick" -v m="$MIB" \
        'BEGIN { printf "%-9s %-13s %s  broker_cpu_s_per_gib=%.2f\n", n, a, o, d / t / (m / 1024) }'
}
# weir-loadgen: produce MIB MiB (acks=1, 960 KiB batches: under max.message.bytes, one partition), then read them back
# from offset 0; MiB/s from its JSON summary, its own CPU from its rusage.
lg() { # NAME BOOTSTRAP PHASE SECURITY...
    local name=$1 boot=$2 phase=$3; shift 3
    local n=$((MIB * 1024)) before after t0 t1 lgcpu json="$work/$name-$phase.json"
    local args=(--bootstrap "$boot" --topic "t-$name" --partitions 1 --record-size 1024 \
        --records "$n" --quiet --json "$json" "$@")
    [ "$phase" = produce ] && args+=(--acks 1 --batch-size 983040 --linger-ms 5)
    [ "$phase" = consume ] && args+=(--from earliest)
    before=$(cpu)
    lgcpu=$( { /usr/bin/time -f "%U %S" "$LOADGEN" "$phase" "${args[@]}" >/dev/null; } 2>&1 | tail -1)
    after=$(cpu)
    local key=mb_per_sec; [ "$phase" = consume ] && key=consumed_mb_per_sec
    local mbs; mbs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$json" "$key")
    awk -v n="$name" -v p="$phase" -v mbs="$mbs" -v d=$((after - before)) -v t="$tick" -v m="$MIB" -v lg="$lgcpu" \
        'BEGIN { split(lg, c, " "); printf "%-9s %-8s MB/s=%.1f  broker_cpu_s_per_gib=%.2f  loadgen_cpu_s_per_gib=%.2f\n", n, p, mbs, d / t / (m / 1024), (c[1] + c[2]) / (m / 1024) }'
}
if [ "$CLIENT" = loadgen ]; then
    tls=(--security-protocol SSL --ssl-ca-location "$work/pki/ca.pem")
    lg plaintext "$plain" produce
    lg plaintext "$plain" consume
    lg ssl "$ssl" produce "${tls[@]}"
    lg ssl "$ssl" consume "${tls[@]}"
    exit 0
fi
run plaintext "{\"bootstrap.servers\":\"$plain\"}" bench-produce
run plaintext "{\"bootstrap.servers\":\"$plain\"}" bench-consume
sslconf="{\"bootstrap.servers\":\"$ssl\",\"security.protocol\":\"SSL\",\"ssl.ca.location\":\"$work/pki/ca.pem\"}"
run ssl "$sslconf" bench-produce
run ssl "$sslconf" bench-consume
