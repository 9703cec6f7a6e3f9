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

**Each extra alone** (``serve``, ``fake-engine``, ``events``, ``sim``, and ``serve,fake-engine``):
one more venv per extra set, the wheel installed as ``<wheel>[extra]``. Those installs do need an
index (PyPI, or the one pip's configuration names); the versions are pinned to the ones of this
test's venv (a constraints file), so pip takes them from its cache when ``make setup`` has just
installed them. Each venv then runs its extra's command as a user would, from the console script:
``--help`` and a smoke run (a ``simulate`` and a ``toy-fleet`` run; a fake engine answering a
completion; a KV-event stream fed into a router; ``smetric serve`` in front of a fake engine).
These are marked ``slow`` (a minute or two, most of it pip), which CI runs like every test.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import smetric

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker: below the ephemeral range)

WHEELS = ROOT / "target" / "wheels"
EXAMPLE = ROOT / "examples" / "embed.py"
RUST_TOOLS = ("cargo", "rustc")
SOURCES = ("python/smetric/**/*.py", "python/smetric/*.pyi", "rust/*/src/**/*.rs", "rust/*/Cargo.toml")
"""What goes into the wheel (with the manifests below): a newer one makes the wheel stale."""
MANIFESTS = ("Cargo.toml", "Cargo.lock", "pyproject.toml")
PYTHONS = [sys.executable, *filter(None, os.environ.get("SMETRIC_WHEEL_PYTHONS", "").split(os.pathsep))]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
STARTUP_S = 60.0
"""How long a command started in a wheel venv may take to answer (a cold import on a busy machine)."""


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


def make_venv(python: str, root: Path) -> tuple[Path, dict[str, str]]:
    venv = root / "venv"
    env = without_rust(venv)
    # A venv made from inside this test's venv is based on its base interpreter and sees none of
    # this venv's site-packages (smetric editable, numpy, …).
    subprocess.run([python, "-m", "venv", str(venv)], check=True, env=env, cwd=root, timeout=120)
    return venv, env


@pytest.fixture(scope="module", params=PYTHONS, ids=lambda p: "this" if p == sys.executable else str(p))
def venv(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("wheel-venv")
    venv, env = make_venv(request.param, root)
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


# -- each extra alone ------------------------------------------------------------------------------

Venv = tuple[Path, dict[str, str]]


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].lower()


def extra_requirements(extras: str) -> set[str]:
    return {requirement_name(r) for extra in extras.split(",") for r in EXTRAS[extra]}


def constraints_of_this_venv(path: Path) -> Path:
    """``name==version`` of every distribution installed here, so that pip installs the versions
    ``make setup`` installed (and finds them in its cache) rather than whatever is newest."""
    pins = sorted(
        {
            f"{d.metadata['Name']}=={d.version}"
            for d in importlib.metadata.distributions()
            if d.metadata["Name"] and d.metadata["Name"].lower() != "smetric-router"
        }
    )
    path.write_text("\n".join(pins) + "\n")
    return path


@pytest.fixture(scope="module")
def venv_with(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Venv]:
    """A factory of venvs (this interpreter, no Rust) with the wheel and the extras named, each
    extra set made once for the module."""
    made: dict[str, Venv] = {}
    constraints = constraints_of_this_venv(tmp_path_factory.mktemp("constraints") / "constraints.txt")

    def make(extras: str) -> Venv:
        if extras not in made:
            root = tmp_path_factory.mktemp("wheel-" + extras.replace(",", "-"))
            venv, env = make_venv(sys.executable, root)
            # pip's configuration (an index, find-links) stays: the extras come from an index.
            install_env = {k: v for k, v in env.items() if k != "PIP_CONFIG_FILE"}
            done = subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "-c",
                    str(constraints),
                    f"{wheel}[{extras}]",
                ],
                env=install_env,
                cwd=root,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            made[extras] = (venv, env)
        return made[extras]

    return make


def installed(venv: Venv) -> set[str]:
    path, env = venv
    listed = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    return {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}


def run_command(venv: Venv, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs the venv's ``smetric`` console script to completion."""
    path, env = venv
    return subprocess.run(
        [str(path / "bin" / "smetric"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=timeout,
        check=False,
    )


def http(url: str, body: object | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET (or POST ``body`` as JSON) on loopback: status, lowercased headers, body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            if http(url + "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.1)  # poll interval of a deadline loop, not a wait for a fixed time
    raise AssertionError(f"{url} not healthy within {STARTUP_S} s")


@contextmanager
def started(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """A long-running command; on exit SIGTERM, and it must exit cleanly."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


@contextmanager
def fake_engine_running(argv0: list[str], env: dict[str, str], cwd: Path, *flags: str) -> Iterator[str]:
    """Runs ``smetric fake-engine`` (``argv0`` is the command) on an ephemeral port; yields its
    URL once it answers ``/health``."""
    argv = [*argv0, "fake-engine", "--port", "0", "--speedup", "1000", *flags]
    with started(argv, env, cwd) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the engine prints its URL first
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        url = f"http://127.0.0.1:{match.group(1)}"
        wait_healthy(url, proc)
        yield url


def decision(headers: dict[str, str]) -> dict[str, str]:
    parts = (p.partition("=") for p in headers["x-smetric-decision"].split("; "))
    return {k: v.strip('"') for k, _, v in parts}


def chat(proxy: str, messages: list[dict[str, str]]) -> tuple[str, str]:
    """One chat completion through the proxy: the instance it chose and the answer's text."""
    status, headers, body = http(proxy + "/v1/chat/completions", {"messages": messages, "max_tokens": 4})
    assert status == 200, body
    return decision(headers)["instance"], json.loads(body)["choices"][0]["message"]["content"]


@pytest.mark.slow
@pytest.mark.parametrize("extras", ["serve", "fake-engine", "events", "sim", "serve,fake-engine"])
def test_an_extra_installs_its_packages_and_not_the_simulators(venv_with: Callable[[str], Venv], extras: str) -> None:
    have = installed(venv_with(extras))
    own = extra_requirements(extras)
    assert own <= have, own - have
    # The packages of another extra may come in as dependencies of this one's (huggingface-hub
    # brings tqdm); the simulator's plotting must not, since it is what `smetric serve` once needed.
    assert ("matplotlib" in have) == ("sim" in extras.split(","))


@pytest.mark.slow
def test_the_sim_extra_alone_runs_simulate_and_the_toy_fleet(venv_with: Callable[[str], Venv]) -> None:
    venv = venv_with("sim")
    for command in ("simulate", "sweep", "toy-fleet"):
        out = run_command(venv, command, "--help")
        assert out.returncode == 0 and out.stdout.startswith(f"usage: smetric {command}"), out.stderr
    toy = run_command(venv, "toy-fleet", "--sessions", "12", "--instances", "2", "--policies", "least_load,smetric")
    assert toy.returncode == 0, toy.stderr
    assert re.search(r"^smetric +\d+ ", toy.stdout, re.MULTILINE), toy.stdout
    results = venv[0].parent / "simulate"
    tiny = ["--instances", "2", "--duration-s", "120", "--warmup-s", "20", "--jobs", "1", "--no-progress"]
    one = ["--policies", "smetric", "--load", "0.05", "--ladder", "1", "--feed-policies", ""]
    run = run_command(venv, "simulate", *one, *tiny, "--out", str(results))
    assert run.returncode == 0, run.stderr
    assert "smetric" in run.stdout and "peak TPS<=SLO" in run.stdout
    assert list(json.loads((results / "results.json").read_text())) == ["smetric"]
    assert any(results.glob("*.png")), "the plots need matplotlib, which the sim extra installs"


EVENTS_SMOKE = """
import time, zmq
from smetric import Router, RouterConfig
from smetric._core import encode_kv_batch
from smetric.events import KvEventSource, KvEventSubscriber

ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)  # an XPUB sees the subscription arrive: no message is sent too early
pub.setsockopt(zmq.LINGER, 0)
port = pub.bind_to_random_port("tcp://127.0.0.1")
router = Router(["gpu-0"], config=RouterConfig(index_mode="exact"))
tokens = list(range(1000, 1064))  # four blocks of 16
stored = ("BlockStored", [11, 12, 13, 14], None, tokens, 16, None, "GPU")
with KvEventSubscriber(router, [KvEventSource("gpu-0", f"tcp://127.0.0.1:{port}")]) as sub:
    assert pub.poll(30_000), "no subscription within 30 s"
    pub.recv()
    pub.send_multipart([b"", (0).to_bytes(8, "big"), encode_kv_batch(time.time(), [stored])])
    deadline = time.monotonic() + 30
    while router.stats()["index_local_blocks"].get("gpu-0", 0) < 4:
        assert time.monotonic() < deadline, sub.stats()
        time.sleep(0.01)
    print("blocks", router.stats()["index_local_blocks"]["gpu-0"])
    print("hit", router.route([*tokens, 1]).local_hit_tokens)
"""


@pytest.mark.slow
def test_the_events_extra_alone_feeds_a_router_from_a_kv_event_stream(venv_with: Callable[[str], Venv]) -> None:
    out = run_in(venv_with("events"), EVENTS_SMOKE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["blocks", "4", "hit", "64"]


@pytest.mark.slow
def test_the_fake_engine_extra_alone_serves_completions_and_kv_events(venv_with: Callable[[str], Venv]) -> None:
    venv = venv_with("fake-engine")
    out = run_command(venv, "fake-engine", "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: smetric fake-engine"), out.stderr
    path, env = venv
    flags = ("--kv-events-port", "0", "--kv-replay-port", "0")
    with fake_engine_running([str(path / "bin" / "smetric")], env, path.parent, *flags) as url:
        status, _, body = http(url + "/v1/completions", {"prompt": "ping", "max_tokens": 2})
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 2
        status, _, body = http(url + "/kv_event_sources")
        assert status == 200 and json.loads(body)["0"]["enable_kv_cache_events"] is True


def serve_in_front(serve: list[str], engines: list[str], env: dict[str, str], cwd: Path) -> None:
    """Starts ``smetric serve`` (``serve`` is the command) in front of ``engines`` and routes a
    conversation of two turns: both answered, the follow-up on the first turn's instance."""
    port = free_port()
    argv = [*serve, "serve", "--port", str(port), *(f"--instance={e}" for e in engines)]
    with started(argv, env, cwd) as proc:
        proxy = f"http://127.0.0.1:{port}"
        wait_healthy(proxy, proc)
        turn = [{"role": "system", "content": "You are a careful agent. " * 40}, {"role": "user", "content": "go"}]
        first, answer = chat(proxy, turn)
        assert first in engines and answer
        home, _ = chat(proxy, [*turn, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}])
        assert home == first


@pytest.mark.slow
def test_the_serve_extra_alone_routes_to_a_fleet(venv_with: Callable[[str], Venv]) -> None:
    venv = venv_with("serve")
    out = run_command(venv, "serve", "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: smetric serve"), out.stderr
    # The fleet: fake engines run by this test's own environment, so that the serve venv runs
    # only the proxy.
    path, env = venv
    here = [sys.executable, "-m", "smetric"]
    with (
        fake_engine_running(here, dict(os.environ), ROOT) as a,
        fake_engine_running(here, dict(os.environ), ROOT) as b,
    ):
        serve_in_front([str(path / "bin" / "smetric")], [a, b], env, path.parent)


@pytest.mark.slow
def test_serve_in_front_of_fake_engines_with_only_serve_and_fake_engine(venv_with: Callable[[str], Venv]) -> None:
    path, env = venv_with("serve,fake-engine")
    command = [str(path / "bin" / "smetric")]
    flags = ("--kv-events-port", "0", "--kv-replay-port", "0")
    with (
        fake_engine_running(command, env, path.parent, *flags) as a,
        fake_engine_running(command, env, path.parent, *flags) as b,
    ):
        serve_in_front(command, [a, b], env, path.parent)
