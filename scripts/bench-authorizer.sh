#!/bin/bash
# Produce/consume throughput (confluent-kafka, 64 MiB of 1 KiB records, 3 runs) with the
# authorizer off and on (ANONYMOUS allowed by ACLs, not as a super user), same binary,
# one node on 127.0.0.1:19093. Usage: scripts/bench-authorizer.sh (WEIR=path/to/weir).
set -ef
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${WEIR:-$ROOT/target/debug/weir}
PY=${WEIR_TEST_PYTHON:-$ROOT/target/interop-venv/bin/python}
CL=$ROOT/tests/security/kafka_client.py
# Waits (at most 30 s) for the node's ready line in log $1.
ready() { for _ in $(seq 300); do grep -q "weir ready" "$1" && return 0; sleep 0.1; done; echo "not ready: $1" >&2; exit 1; }
for mode in off on; do
  d=$(mktemp -d "$ROOT/target/aclbench.XXXX")
  extra=""
  if [ $mode = on ]; then
    # ANONYMOUS may do everything through ACLs (not super.users): added before the
    # authorizer is on, then the node restarts with it.
    $W serve --data-dir $d --listen 127.0.0.1:19093 --shards 2 > $d.log 2>&1 &
    pid=$!; ready $d.log
    for r in "--topic *" "--cluster" "--group *"; do
      $W acls --bootstrap-server 127.0.0.1:19093 add --principal User:ANONYMOUS --operation All $r
    done
    $W acls --bootstrap-server 127.0.0.1:19093 list
    kill $pid; wait $pid 2>/dev/null || true
    extra="--set authorizer.class.name=x"
  fi
  $W serve --data-dir $d --listen 127.0.0.1:19093 --shards 2 $extra > $d.log 2>&1 &
  pid=$!
  ready $d.log
  for i in 1 2 3; do
    t=bench-$mode-$i
    p=$($PY $CL bench-produce '{"bootstrap.servers":"127.0.0.1:19093"}' $t 64 | tail -1)
    c=$($PY $CL bench-consume '{"bootstrap.servers":"127.0.0.1:19093"}' $t 64 | tail -1)
    echo "authorizer=$mode run=$i $p $c"
  done
  kill $pid; wait $pid 2>/dev/null || true
  rm -rf $d $d.log
done
