#!/bin/bash
# Regenerates node/hot-text.ld (issue 12, RSS): which functions a single node runs, exactly.
#
#   bash scripts/hot-text/hot-text.sh            # from the repository root; ~1 release build
#   REPRO=/path/repro.tar LOADGEN=/path/weir-loadgen bash scripts/hot-text/hot-text.sh  # reuse
#
# 1. Builds the release `weir` once more with lld's `--reproduce` (the link's inputs and
#    command line in a tar), so the code can be relinked in seconds with other layouts.
# 2. Relinks without node/hot-text.ld and runs the workload (trace.sh: start, 10 topics x 100
#    partitions created, produced to and consumed, restart, consumed again) with uffdtrace.so
#    preloaded: the node's code is served page by page through userfaultfd, so the pages
#    recorded are exactly the pages run, with no fault-around or read-around. The candidates
#    are the functions on those pages (pages.py).
# 3. Relinks with every candidate on pages of its own (a profiling layout) and runs the
#    workload again: now a page touched is a function run. Those, in the order first run,
#    become node/hot-text.ld (patterns.py free: names without their hash).
# OUT=FILE writes there instead of node/hot-text.ld. Needs gcc, python3, binutils (nm, readelf), root or vm.unprivileged_userfaultfd=1.
set -euo pipefail
root=$(pwd); here=$root/scripts/hot-text
w=$(mktemp -d "$root/target/hot-text.XXXX"); trap 'rm -rf "$w"' EXIT
lld=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/host: //p')/bin/rust-lld
gcc -O2 -shared -fPIC -o "$w/uffdtrace.so" "$here/uffdtrace.c" -lpthread
if [ -z "${LOADGEN:-}" ]; then
  cargo build --release -p weir-loadgen --bin weir-loadgen
  LOADGEN=$root/target/release/weir-loadgen
fi
if [ -z "${REPRO:-}" ]; then
  REPRO=$w/repro.tar
  cargo rustc --release -p weir --bin weir -- -C link-arg=-Wl,--reproduce="$REPRO"
fi
mkdir "$w/r" && tar xf "$REPRO" -C "$w/r"
r=$(dirname "$(find "$w/r" -name response.txt | head -1)")
cp "$root/node/cold-text.ld" "$r/cold.ld"
grep -v -e '^-plugin' -e '^--script' "$r/response.txt" | grep -v '^-o ' > "$r/base.txt"
link() { # link OUT SCRIPT...
  local out=$1; shift
  { cat "$r/base.txt"; for s in "$@"; do echo "--script $s"; done; echo "-o $out"; } > "$r/args.txt"
  (cd "$r" && "$lld" -flavor gnu @args.txt)
}
layout() { # layout PATTERNS ALIGN > script
  echo "SECTIONS { .text.hot : {"
  while read -r l; do echo "$l"; [ "$2" = 1 ] && echo "    . = ALIGN(4096);"; done < "$1"
  echo "} } INSERT BEFORE .text;"
}
trace() { # trace BIN TRACE
  TRACE_TMP=$w UFFD_PRELOAD=$w/uffdtrace.so LOADGEN=$LOADGEN bash "$here/trace.sh" "$1" "$2"
}
link plain cold.ld
trace "$r/plain" "$w/t0"
python3 "$here/pages.py" "$r/plain" "$w/t0" > "$w/n0"
python3 "$here/patterns.py" exact "$w/n0" > "$w/p0"
layout "$w/p0" 1 > "$r/spread.ld"
link spread spread.ld cold.ld
trace "$r/spread" "$w/t1"
python3 "$here/pages.py" "$r/spread" "$w/t1" > "$w/n1"
{ sed -n '1,/^SECTIONS/{/^SECTIONS/!p}' "$root/node/hot-text.ld"
  echo "SECTIONS"; echo "{"; echo "  .text.hot :"; echo "  {"
  python3 "$here/patterns.py" free "$w/n1"
  echo "  }"; echo "}"; echo "INSERT BEFORE .text;"; } > "$w/hot-text.ld"
out=${OUT:-$root/node/hot-text.ld}
mv "$w/hot-text.ld" "$out"
echo "$out: $(grep -c '^    \*(' "$out") patterns from $(wc -l < "$w/n1") functions run"
