#!/usr/bin/env bash
# Creates the separate virtualenv the LMCache integration test runs the real controller in
# (tests/integrations/test_lmcache.py): CPU-only torch, lmcache 0.5.6 without its dependency
# pins (they conflict with the dev venv's numpy/prometheus_client and pull CUDA packages), and
# the few packages the controller imports. Idempotent: a second run returns at once.
#   scripts/integrations/lmcache_venv.sh [python] [venv]      (defaults: python3.11 .venv-lmcache)
set -euo pipefail
python_bin="${1:-python3.11}"
venv="${2:-.venv-lmcache}"
cd "$(dirname "$0")/../.."

LMCACHE_VERSION=0.5.6
# PyPI has only the CUDA build of torch for Linux; it imports without a GPU once its nvidia-* wheels
# are installed (most of the 2.5 GB). lmcache imports torch at module level (lmcache.v1.metadata).
TORCH_VERSION=2.13.0
stamp="$venv/.lmcache-$LMCACHE_VERSION"
if [ -f "$stamp" ]; then
    exit 0
fi
start=$(date +%s)
rm -rf "$venv"
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" --no-deps "lmcache==$LMCACHE_VERSION"
# What the controller and its HTTP front end (`lmcache_controller`) import.
"${pip[@]}" msgspec pyzmq pyyaml requests prometheus_client transformers cachetools fastapi uvicorn \
    py-cpuinfo psutil aiohttp
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 "$venv/bin/python" -c "import lmcache.v1.api_server.__main__, lmcache.v1.token_database"
touch "$stamp"
echo "lmcache_venv: $venv ready in $(( $(date +%s) - start )) s" >&2
