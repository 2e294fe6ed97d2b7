#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine (run as root in CI):
# - apt: a C and C++ toolchain and cmake (the rdkafka crate compiles librdkafka from source),
#   fio (disk baseline for benchmarks), kcat, openssl (test certificates), Python's venv,
#   Node and npm;
# - PyPI: confluent-kafka, kafka-python, aiokafka into a venv at target/interop-venv;
# - npm: kafkajs into tests/interop/node/node_modules (versions pinned by its lock file).
# Idempotent: each step is skipped when what it installs is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

# Client versions the interop suite is pinned to.
CONFLUENT_KAFKA_VERSION=2.16.1
KAFKA_PYTHON_VERSION=3.0.12
AIOKAFKA_VERSION=0.14.0
VENV=target/interop-venv

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v fio >/dev/null || need_apt+=(fio)
command -v kcat >/dev/null || need_apt+=(kcat)
command -v chattr >/dev/null || need_apt+=(e2fsprogs)
# The security tests make their certificates with the openssl CLI.
command -v openssl >/dev/null || need_apt+=(openssl)
command -v cc >/dev/null || need_apt+=(build-essential)
# librdkafka's build needs a C++ compiler too, which a bare `cc` does not bring.
command -v c++ >/dev/null || need_apt+=(g++)
# procps (ps, pgrep): to look at a stuck test run; minimal images lack it.
command -v pgrep >/dev/null || need_apt+=(procps)
command -v make >/dev/null || need_apt+=(make)
command -v perl >/dev/null || need_apt+=(perl)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v python3 >/dev/null || need_apt+=(python3)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
# Python's venv module is split into its own package on Debian.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need_apt+=(python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Python clients: a venv under target/ works as root and never touches the system Python.
# aiokafka needs its lz4 extra (cramjam) for the lz4 codec the interop check uses.
want_py="confluent-kafka==$CONFLUENT_KAFKA_VERSION kafka-python==$KAFKA_PYTHON_VERSION aiokafka[lz4]==$AIOKAFKA_VERSION"
stamp="$VENV/.weir-installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want_py" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $want_py
    echo "$want_py" > "$stamp"
fi

# kafkajs, exactly as pinned by tests/interop/node/package-lock.json.
node_dir=tests/interop/node
if [ ! -f "$node_dir/node_modules/kafkajs/package.json" ] \
    || ! cmp -s "$node_dir/package-lock.json" "$node_dir/node_modules/.package-lock.json.weir"; then
    (cd "$node_dir" && npm ci --no-audit --no-fund --silent)
    cp "$node_dir/package-lock.json" "$node_dir/node_modules/.package-lock.json.weir"
fi
