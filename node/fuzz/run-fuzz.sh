#!/usr/bin/env bash
# Runs each fuzz target for $1 seconds (default 300), one after the other, logging to
# node/fuzz/logs/<target>.log. Stable toolchain: RUSTC_BOOTSTRAP=1 unlocks -Z flags.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-300}"
mkdir -p logs
for target in sasl_exchange tls_records; do
  mkdir -p "corpus/$target"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$secs" -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 \
    > "logs/$target.log" 2>&1 || echo "$target exited $?" >> "logs/$target.log"
done
