#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need, then runs
# every Rust test in the workspace and the client interop suite against a real weir.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests need that a fresh machine lacks (idempotent; quick when present).
bash scripts/install-test-deps.sh

cargo build --workspace --bins
cargo test --workspace --no-fail-fast
if [ -x tests/interop/run.sh ]; then
    bash tests/interop/run.sh
fi
