#!/usr/bin/env bash
# Creates the separate virtualenv the LMCache integration test runs the real controller in
# (tests/integrations/test_lmcache.py): lmcache 0.5.6 without its dependency pins (they conflict
# with the dev venv's numpy/prometheus_client and pull CUDA packages), the few packages the
# controller imports, and torch read from the shared torch venv (scripts/torch/venv.sh).
# Idempotent: a second run returns at once.
#   scripts/integrations/lmcache_venv.sh [python] [venv] [torch-venv]
#   (defaults: python3.11 .venv-lmcache .venv-torch)
set -euo pipefail
python_bin="${1:-python3.11}"
venv="${2:-.venv-lmcache}"
torch_venv="${3:-.venv-torch}"
cd "$(dirname "$0")/../.."

LMCACHE_VERSION=0.5.6
# lmcache imports torch at module level (lmcache.v1.metadata).
stamp="$venv/.lmcache-$LMCACHE_VERSION-shared-torch"
if [ -f "$stamp" ]; then
    exit 0
fi
start=$(date +%s)
bash scripts/torch/venv.sh "$python_bin" "$torch_venv"
rm -rf "$venv"
"$python_bin" -m venv "$venv"
bash scripts/torch/venv.sh link "$torch_venv" "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --no-cache-dir)
"${pip[@]}" --upgrade pip
"${pip[@]}" --no-deps "lmcache==$LMCACHE_VERSION"
# What the controller and its HTTP front end (`lmcache_controller`) import.
"${pip[@]}" msgspec pyzmq pyyaml requests prometheus_client transformers cachetools fastapi uvicorn \
    py-cpuinfo psutil aiohttp
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 "$venv/bin/python" -c "import lmcache.v1.api_server.__main__, lmcache.v1.token_database"
touch "$stamp"
echo "lmcache_venv: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1) beside the shared torch)" >&2
