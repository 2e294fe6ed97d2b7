#!/bin/bash
# Start-to-ready time and RSS of an empty weir node, alternating between the binaries given
# (docs/PERFORMANCE.md, "One node with 1,000 partitions"). RUNS (default 5) rounds.
# usage: startup.sh BIN... ; prints per run: bin ms_to_ready VmRSS RssAnon RssFile threads (empty node, 2 shards)
# Each binary is dropped from the page cache before its run: how many of its code pages the
# kernel maps per fault depends on the page-cache folios the file is in (a file just
# written by `cp` sits in larger ones than the linker's output or one read back from disk:
# +1.4 MiB RssFile for the same binary), so every run starts from the file read back from
# disk by a `--version` run (which also keeps the disk read out of the time to ready).
for i in $(seq 1 ${RUNS:-5}); do for b in "$@"; do
  d=$(mktemp -d /tmp/st.XXXX); log=$d/log
  dd if=$b iflag=nocache count=0 status=none; $b --version > /dev/null
  s=$(date +%s%N); $b serve --data-dir $d/data --listen 127.0.0.1:0 --shards 2 > $log 2>&1 & p=$!
  for j in $(seq 1 2000); do grep -q "weir ready" $log && break; sleep 0.002; done; e=$(date +%s%N)
  sleep 0.5
  r=$(grep -E "VmRSS|RssAnon|RssFile|Threads" /proc/$p/status | awk '{printf "%s=%s ", $1, $2}')
  echo "$(basename $(dirname $(dirname $b)))/$(basename $b) ready_ms=$(( (e-s)/1000000 )) $r"
  kill $p; wait $p 2>/dev/null; rm -rf $d
done; done
