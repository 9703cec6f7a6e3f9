#!/usr/bin/env bash
# Creates the one torch install the two peer venvs share (.venv-torch): PyPI's torch 2.13.0 with its
# nvidia-* wheels, which import and run on CPU (PyPI hosts no CPU-only torch for Linux). Together they
# are ≈ 5 GB on disk, most of what the real-peer venvs need.
#
# Why shared, and how: LMCache (.venv-lmcache) and vLLM (.venv-vllm) must not share a venv (LMCache's
# token database takes vLLM's hash function when `vllm` is importable, docs/vllm-real.md), but both pin
# this torch. Two copies plus pip's cache of the wheels came to ≈ 15 GB and once filled a CI machine's
# disk. So torch lives here once, and each peer venv reads it through a `.pth` line (`link` below) that
# appends this site-packages after its own: a package the peer venv installs itself still wins.
# Downloads bypass pip's cache (--no-cache-dir: the cache would be a second copy) and are retried,
# since a stalled CDN transfer of one 200 MB nvidia wheel once failed a run.
#   scripts/torch/venv.sh [python] [venv]           create (idempotent; a stamp returns at once)
#   scripts/torch/venv.sh link <torch-venv> <venv>  make <venv> see the torch of <torch-venv>
set -euo pipefail
cd "$(dirname "$0")/../.."

site_packages() {
    "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

if [ "${1:-}" = "link" ]; then
    torch_venv="$(cd "$2" && pwd)"
    echo "$(site_packages "$torch_venv")" >"$(site_packages "$3")/smetric-shared-torch.pth"
    exit 0
fi

python_bin="${1:-python3.11}"
venv="${2:-.venv-torch}"
TORCH_VERSION=2.13.0
stamp="$venv/.smetric-torch-$TORCH_VERSION"
if [ -f "$stamp" ]; then
    exit 0
fi
start=$(date +%s)
rm -rf "$venv"
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
"${pip[@]}" --upgrade pip
for attempt in 1 2 3; do
    if "${pip[@]}" "torch==$TORCH_VERSION"; then
        break
    fi
    if [ "$attempt" = 3 ]; then
        echo "torch venv: torch==$TORCH_VERSION did not install after $attempt attempts" >&2
        exit 1
    fi
    echo "torch venv: install attempt $attempt failed; retrying in 20 s" >&2
    sleep 20
done
"$venv/bin/python" -c "import torch; assert float(torch.ones(2).sum()) == 2.0"
touch "$stamp"
echo "torch venv: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))" >&2
