#!/usr/bin/env bash
# Creates the virtualenv (if missing), installs the Python tools, and builds the extension
# in release mode into it. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
python_bin="${1:-python3.11}"
venv="${2:-.venv}"
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
    echo "cargo is required (https://rustup.rs)" >&2
    exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python_bin" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
stamp="$venv/.deps-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet "maturin>=1.8,<2"
    touch "$stamp"
fi
# The extension is abi3 (`_core.abi3.so`); a version-tagged `_core.cpython-*.so` left in the
# source tree by an older build would be imported before it.
rm -f python/smetric/_core.cpython-*.so
# maturin develop builds the Rust extension (release profile), installs the package editable
# and, with it, what the tests need: the dev tools and every extra (pyproject.toml lists them;
# `ray` is Ray Serve for tests/integrations/test_ray_serve.py, about 15 s and 400 MB).
VIRTUAL_ENV="$(cd "$venv" && pwd)" "$venv/bin/maturin" develop --release --quiet --extras dev,sim,events,fake-engine,serve,ray
