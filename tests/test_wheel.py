"""The release wheel installs and routes where there is no Rust (``pytest -m wheel``).

``make wheel`` builds ``target/wheels/smetric_router-<version>-cp311-abi3-manylinux_*.whl``
(``make test``, and so CI, builds it before pytest; ``SMETRIC_WHEEL`` names another wheel).
These tests create a venv with ``python -m venv`` (no system site-packages), install the wheel
with ``pip install --no-index`` (the base install has no dependency, so pip needs no index and
fetches nothing), and, with every directory that holds ``cargo`` or ``rustc`` removed from
``PATH``, run ``examples/embed.py`` (the README's embedding example) from outside the source
tree. Without a wheel, or with one older than the sources, they skip (and fail under CI).

The venv is made from this test's interpreter (CPython 3.11, the wheel's floor) and from each
interpreter listed in ``SMETRIC_WHEEL_PYTHONS`` (``os.pathsep``-separated), to check that the one
abi3 wheel serves later CPythons too (``docs/wheel.md`` records a run with 3.12 and 3.13).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import smetric

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "target" / "wheels"
EXAMPLE = ROOT / "examples" / "embed.py"
RUST_TOOLS = ("cargo", "rustc")
SOURCES = ("python/smetric/**/*.py", "python/smetric/*.pyi", "rust/*/src/**/*.rs", "rust/*/Cargo.toml")
"""What goes into the wheel (with the manifests below): a newer one makes the wheel stale."""
MANIFESTS = ("Cargo.toml", "Cargo.lock", "pyproject.toml")
PYTHONS = [sys.executable, *filter(None, os.environ.get("SMETRIC_WHEEL_PYTHONS", "").split(os.pathsep))]


def find_wheel() -> Path:
    if named := os.environ.get("SMETRIC_WHEEL"):
        return Path(named)
    wheels = sorted(WHEELS.glob(f"smetric_router-{smetric.__version__}-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        problem = f"no smetric_router-{smetric.__version__} wheel in {WHEELS}"
    else:
        sources = [p for pattern in SOURCES for p in ROOT.glob(pattern)] + [ROOT / m for m in MANIFESTS]
        newest = max(sources, key=lambda p: p.stat().st_mtime)
        if newest.stat().st_mtime <= wheels[-1].stat().st_mtime:
            return wheels[-1]
        problem = f"{wheels[-1].name} is older than {newest.relative_to(ROOT)}"
    if os.environ.get("CI"):
        pytest.fail(f"{problem}: `make test` builds it (make wheel)")
    pytest.skip(f"{problem}: run `make wheel`")


@pytest.fixture(scope="module")
def wheel() -> Path:
    return find_wheel()


def without_rust(venv: Path) -> dict[str, str]:
    """This process's environment with the venv first on PATH and no Rust toolchain on it."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    kept = [d for d in env.get("PATH", "").split(os.pathsep) if not any((Path(d) / t).exists() for t in RUST_TOOLS)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *kept])
    env["PIP_CONFIG_FILE"] = os.devnull  # no index or find-links from a pip.conf
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module", params=PYTHONS, ids=lambda p: "this" if p == sys.executable else str(p))
def venv(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("wheel-venv")
    venv = root / "venv"
    env = without_rust(venv)
    # A venv made from inside this test's venv is based on its base interpreter and sees none of
    # this venv's site-packages (smetric editable, numpy, …).
    subprocess.run([request.param, "-m", "venv", str(venv)], check=True, env=env, cwd=root, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index", str(wheel)],
        check=True,
        env=env,
        cwd=root,
        timeout=120,
    )
    return venv, env


def run_in(venv: tuple[Path, dict[str, str]], code: str) -> subprocess.CompletedProcess[str]:
    path, env = venv
    return subprocess.run(
        [str(path / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=120,
        check=False,
    )


def test_the_wheel_is_abi3_manylinux_for_cpython_311_and_later(wheel: Path) -> None:
    name, version, python, abi, platform = wheel.stem.split("-")
    assert (name, version, python, abi) == ("smetric_router", smetric.__version__, "cp311", "abi3")
    assert all(re.fullmatch(r"manylinux(2014|_2_\d+)_x86_64|manylinux_2_\d+_aarch64", p) for p in platform.split("."))
    with zipfile.ZipFile(wheel) as z:
        files = z.namelist()
        metadata = z.read(f"smetric_router-{version}.dist-info/METADATA").decode()
    assert "smetric/_core.abi3.so" in files
    assert "smetric/py.typed" in files
    # Every requirement belongs to an extra: the base install pulls in nothing.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires
    assert all("extra ==" in line for line in requires), requires


def test_the_venv_has_no_rust_and_only_the_wheel(venv: tuple[Path, dict[str, str]]) -> None:
    out = run_in(venv, f"import shutil; print([shutil.which(t) for t in {RUST_TOOLS!r}])")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[None, None]"
    out = run_in(venv, "import sys; print(sys.prefix != sys.base_prefix, sys.flags.no_site)")
    assert out.stdout.split() == ["True", "0"]
    path, env = venv
    listed = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert installed - {"pip", "setuptools"} == {"smetric-router"}


def test_the_readme_embedding_example_runs_from_the_wheel(venv: tuple[Path, dict[str, str]]) -> None:
    code = f"""
import runpy, shutil, sys
from pathlib import Path
assert shutil.which("cargo") is None and shutil.which("rustc") is None
import smetric, smetric._core
prefix = Path(sys.prefix).resolve()
assert prefix in Path(smetric.__file__).resolve().parents, smetric.__file__
assert smetric._core.__file__.endswith("_core.abi3.so"), smetric._core.__file__
runpy.run_path({str(EXAMPLE)!r}, run_name="__main__")
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"matplotlib", "tqdm", "zmq", "numpy", "xxhash"}})
print("heavy:", heavy)
"""
    out = run_in(venv, code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("first turn -> http://gpu-")
    assert "follow-up: sticky" in lines[1]
    assert lines[2].startswith("sent 2 requests; the session stayed on http://gpu-")
    assert lines[3] == "heavy: []"


@pytest.mark.parametrize(("module", "extra"), [("smetric.events", "events"), ("smetric.sim", "sim")])
def test_modules_that_need_an_extra_name_it(venv: tuple[Path, dict[str, str]], module: str, extra: str) -> None:
    out = run_in(venv, f"import {module}")
    assert out.returncode == 1
    assert f"MissingExtraError: {module}" in out.stderr
    assert out.stderr.rstrip().endswith(f"pip install 'smetric-router[{extra}]'")


def test_the_readme_snippet_is_the_example() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
    assert "examples/embed.py" in section
    snippet = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert snippet
    example = {line.strip() for line in EXAMPLE.read_text().splitlines()}
    missing = [line for line in snippet.group(1).splitlines() if line.strip() and line.strip() not in example]
    assert missing == [], "README's snippet drifted from examples/embed.py"
