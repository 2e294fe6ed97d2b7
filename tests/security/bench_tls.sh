#!/usr/bin/env bash
# PLAINTEXT beside SSL on one broker, in the same run: produce and consume MIB MiB of
# 1 KiB records through confluent-kafka (weir-loadgen does not speak TLS yet) on each
# listener, and the broker's CPU seconds per GiB moved (utime+stime from /proc).
# Usage: tests/security/bench_tls.sh [MIB]   (needs target/release/weir and the venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
MIB=${1:-1024}
WEIR=${WEIR_BIN:-target/release/weir}
PY=${WEIR_TEST_PYTHON:-target/interop-venv/bin/python}
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
run plaintext "{\"bootstrap.servers\":\"$plain\"}" bench-produce
run plaintext "{\"bootstrap.servers\":\"$plain\"}" bench-consume
sslconf="{\"bootstrap.servers\":\"$ssl\",\"security.protocol\":\"SSL\",\"ssl.ca.location\":\"$work/pki/ca.pem\"}"
run ssl "$sslconf" bench-produce
run ssl "$sslconf" bench-consume
