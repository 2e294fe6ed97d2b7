#!/usr/bin/env bash
# Mutation fuzzing of a live release-built weir over TCP for N minutes:
#   tests/tcp-fuzz.sh --minutes 10 [--seed S] [--connections C]
# Prints requests sent, crashes, RSS start/peak/end and the canary's p50/p99; exits
# non-zero on a crash, RSS growth past 256 MiB, or a failing canary or p99 > 50 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) export WEIR_FUZZ_SEED="$2"; shift 2 ;;
    --connections) export WEIR_FUZZ_CONNECTIONS="$2"; shift 2 ;;
    *) echo "usage: $0 --minutes N [--seed S] [--connections C]" >&2; exit 2 ;;
  esac
done
cargo build --release -p weir --bin weir
WEIR_BIN="$PWD/target/release/weir" WEIR_FUZZ_MINUTES="$minutes" \
  cargo test -p weir --test tcp_fuzz -- --ignored --nocapture long_fuzz_run
