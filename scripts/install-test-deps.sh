#!/usr/bin/env bash
# Installs the system packages and client libraries the test suite uses. Safe to re-run.
set -euo pipefail
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v fio >/dev/null || need_apt+=(fio)
if [ ${#need_apt[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
