#!/usr/bin/env bash
# `weir-loadgen verify` against a 3-node weir cluster (replication factor 3,
# min.insync.replicas=2) while the node leading partition 0 is SIGKILLed and restarted on
# the same port every FAULT_EVERY (default 8s): an idempotent acks=all producer, then every
# acknowledged record read back. Prints the verdict (0 lost, 0 duplicated expected) and the
# fault log; JSON in $OUT/v.json, node logs in $OUT/node-N.log.
#
#   bash loadgen/scripts/cluster_verify.sh            # 40 s of produce, 2,000 records/s
#   DURATION=120s RATE=5000 bash loadgen/scripts/cluster_verify.sh
#
# Run from the repo root after `cargo build -p weir -p weir-loadgen` (PROFILE=release for
# release binaries). Needs kcat (it finds partition 0's leader with `kcat -L -J`).
set -uo pipefail
cd "$(dirname "$0")/../.."
PROFILE=${PROFILE:-debug}
OUT=${OUT:-$PWD/target/lg-cluster-verify}
W=${WEIR_BIN:-$PWD/target/$PROFILE/weir}
LG=${LOADGEN_BIN:-$PWD/target/$PROFILE/weir-loadgen}
DURATION=${DURATION:-40s}
RATE=${RATE:-2000}
FAULT_EVERY=${FAULT_EVERY:-8s}
TOPIC=${TOPIC:-verify-rf3}
command -v kcat >/dev/null || { echo "cluster_verify.sh needs kcat" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a PORT CPORT
for i in 1 2 3; do PORT[$i]=$(free_port); CPORT[$i]=$(free_port); done
VOTERS="1@127.0.0.1:${CPORT[1]},2@127.0.0.1:${CPORT[2]},3@127.0.0.1:${CPORT[3]}"

# start.sh N: starts node N in the background on its fixed ports, its pid in $OUT/pid-N.
cat > "$OUT/start.sh" <<EOS
#!/bin/sh
n=\$1
case \$n in 1) port=${PORT[1]} ;; 2) port=${PORT[2]} ;; 3) port=${PORT[3]} ;; esac
"$W" serve --data-dir "$OUT/data-\$n" --listen 127.0.0.1:\$port --node-id \$n --shards 1 \\
    --set controller.quorum.voters=$VOTERS \\
    --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=3000 \\
    --set controller.quorum.election.timeout.ms=500 \\
    --set default.replication.factor=3 --set min.insync.replicas=2 \\
    >> "$OUT/node-\$n.log" 2>&1 &
echo \$! > "$OUT/pid-\$n"
EOS
# fault.sh: SIGKILLs the leader of partition 0, waits until it is gone, restarts it. It
# exits non-zero when it injected no fault (no kcat, no leader), so verify counts it failed.
cat > "$OUT/fault.sh" <<EOS
#!/bin/sh
command -v kcat >/dev/null || { echo "\$(date +%T) kcat not found: no fault" >> "$OUT/faults.log"; exit 1; }
leader=\$(kcat -b 127.0.0.1:${PORT[1]},127.0.0.1:${PORT[2]},127.0.0.1:${PORT[3]} -L -t $TOPIC -J -m 5 2>/dev/null \\
    | python3 -c 'import json,sys; t=json.load(sys.stdin)["topics"][0]; print([p["leader"] for p in t["partitions"] if p["partition"]==0][0])')
case "\$leader" in 1|2|3) ;; *) echo "\$(date +%T) no leader for partition 0 (\$leader)" >> "$OUT/faults.log"; exit 1 ;; esac
P=\$(cat "$OUT/pid-\$leader"); kill -9 "\$P" 2>/dev/null
for i in \$(seq 1 200); do [ -e /proc/\$P ] && ! grep -qs zombie /proc/\$P/status || break; sleep 0.05; done
echo "\$(date +%T) SIGKILLed node \$leader (pid \$P), restarting" >> "$OUT/faults.log"
sleep 1
"$OUT/start.sh" \$leader
EOS
chmod +x "$OUT/start.sh" "$OUT/fault.sh"

stop_all() {
    for i in 1 2 3; do
        P=$(cat "$OUT/pid-$i" 2>/dev/null) || continue
        kill -9 "$P" 2>/dev/null
    done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

for i in 1 2 3; do "$OUT/start.sh" $i; done
for i in 1 2 3; do
    for _ in $(seq 1 300); do grep -qs "weir ready" "$OUT/node-$i.log" && break; sleep 0.1; done
done
BOOT=127.0.0.1:${PORT[1]}
# The cluster agrees once every node lists three brokers.
for _ in $(seq 1 300); do
    n=$(kcat -b "$BOOT" -L -J -m 5 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["brokers"]))' 2>/dev/null)
    [ "${n:-0}" = 3 ] && break; sleep 0.2
done
echo "== 3 nodes on ports ${PORT[*]}; verify --acks all --idempotent, fault every $FAULT_EVERY"
timeout 900 "$LG" verify --bootstrap "$BOOT" --topic "$TOPIC" --partitions 3 \
    --rate "$RATE" --duration "$DURATION" --acks all --idempotent --retries 1000000 --delivery-timeout-ms 300000 \
    --fault-cmd "$OUT/fault.sh" --fault-every "$FAULT_EVERY" --json "$OUT/v.json" --strict
rc=$?
echo "== faults:"; cat "$OUT/faults.log" 2>/dev/null
exit $rc
