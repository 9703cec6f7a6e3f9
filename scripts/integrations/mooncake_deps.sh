#!/usr/bin/env bash
# Installs what tests/integrations/test_mooncake.py needs into the dev venv: Mooncake's CPU build
# (the `mooncake_master` binary and the `mooncake.store` client; its few dependencies do not clash
# with the dev venv's) and the RDMA/NUMA runtime libraries its shared objects link against even
# when they only speak TCP. The libraries come from apt, and only when missing and we are root
# (CI on a fresh Debian machine is); otherwise the test skips and says why. Idempotent and quick
# when everything is there.
#   scripts/integrations/mooncake_deps.sh [venv]      (default: .venv)
set -euo pipefail
venv="${1:-.venv}"
cd "$(dirname "$0")/../.."

MOONCAKE_VERSION=0.3.13.post1
libs=(libibverbs.so.1 librdmacm.so.1 libnuma.so.1)
cache="$(ldconfig -p)"
missing=()
for lib in "${libs[@]}"; do
    if [[ "$cache" != *"$lib"* ]]; then
        missing+=("$lib")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        start=$(date +%s)
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1 libnuma1 >/dev/null
        echo "mooncake_deps: apt-get installed libibverbs1 librdmacm1 libnuma1 in $(( $(date +%s) - start )) s" >&2
    else
        echo "mooncake_deps: missing ${missing[*]} and cannot apt-get (not root or no apt); the Mooncake test will skip" >&2
    fi
fi
installed="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mooncake-transfer-engine-non-cuda"))' 2>/dev/null || true)"
if [ "$installed" != "$MOONCAKE_VERSION" ]; then
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION"
    echo "mooncake_deps: installed mooncake-transfer-engine-non-cuda $MOONCAKE_VERSION in $(( $(date +%s) - start )) s" >&2
fi
