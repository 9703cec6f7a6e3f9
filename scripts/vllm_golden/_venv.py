"""Create the CPU-only vLLM 0.33.0 virtualenv that the golden-data scripts run in.

The recipe is the minimal CPU-only install measured for smetric (vLLM integration notes, section 6):
``import vllm`` always imports torch, so vllm is installed with ``--no-deps`` and exactly the packages
that ``kv_cache_utils``, ``kv_events``, ``Request``, ``SamplingParams`` and ``LoRARequest`` import.
It takes one to two minutes and about 2.2 GB, from PyPI only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.33.0"

# Each entry is one `pip install` invocation, in order.
RECIPE: tuple[tuple[str, ...], ...] = (
    # vllm pins torch 2.14.0, but the CPU wheel of 2.13.0 works and is 5 GB smaller.
    ("torch==2.13.0",),
    # --no-deps on xgrammar avoids about 1 GB of triton.
    ("--no-deps", f"vllm=={VLLM_VERSION}", "xgrammar==0.2.8", "apache-tvm-ffi"),
    (
        "packaging",
        "pydantic",
        "regex",
        "numpy",
        "cbor2",
        "psutil",
        "pyzmq",
        "urllib3",
        "transformers>=5.16.1,<5.21.0",
        "aiohttp",
        "requests",
        "oss-harmony>=0.0.11",
        "openai>=2.25.0",
        "pillow",
        "pybase64",
        "cachetools",
        "msgspec",
        "cloudpickle",
        "uvloop",
        "py-cpuinfo",
        "prometheus_client",
        "fastapi>=0.133.0,<0.137.0",
        "partial_json_parser",
        "llguidance>=1.7.0,<1.8.0",
        "xxhash",
    ),
)

_MARKER = ".smetric-vllm-recipe"


def _recipe_text() -> str:
    return "\n".join(" ".join(step) for step in RECIPE) + "\n"


def ensure_venv(venv: Path) -> Path:
    """Create ``venv`` with the recipe unless it already holds it; return its python."""
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    if python.exists() and marker.exists() and marker.read_text() == _recipe_text():
        return python
    base = shutil.which("python3.11") or sys.executable
    print(f"creating vLLM {VLLM_VERSION} venv at {venv} with {base}", file=sys.stderr)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    for step in RECIPE:
        print(f"pip install {' '.join(step)}", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *step], check=True)
    marker.write_text(_recipe_text())
    return python


def package_versions(python: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` inside the venv of ``python``."""
    code = "import importlib.metadata as m, json, sys\nprint(json.dumps({n: m.version(n) for n in sys.argv[1:]}))\n"
    out = subprocess.run([str(python), "-c", code, *names], check=True, capture_output=True, text=True)
    versions: dict[str, str] = json.loads(out.stdout)
    return versions
