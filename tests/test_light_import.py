"""``import smetric`` stays light, and every optional module names the extra it needs.

A router process that embeds only :class:`smetric.Router` installs no dependency
(``pyproject.toml``: ``dependencies = []``) and imports none of the simulator's, plotting or
event-stream packages. Each module that needs one raises :class:`smetric.errors.MissingExtraError`
on import, naming the ``smetric-router`` extra that installs it. Each check runs in a fresh
interpreter; a missing package is simulated with ``sys.modules[name] = None`` (which makes its
import fail as if it were not installed), and a control run without the block proves the
module imports when the package is there. ``tests/test_wheel.py`` repeats the checks where the
packages really are absent.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "tqdm", "zmq", "numpy", "xxhash", "aiohttp", "tokenizers")
"""Top-level modules that ``import smetric`` (and the embedding modules) must not import."""
EMBEDDING = ("smetric", "smetric.vllm", "smetric.engine_load", "smetric.metrics")
"""What a router process imports: the facade and the fleet wiring that needs no extra."""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def loaded_after(modules: tuple[str, ...]) -> set[str]:
    imports = "; ".join(f"import {m}" for m in modules)
    out = run(f"import sys; {imports}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))")
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_import_smetric_loads_no_simulator_plotting_or_event_dependency() -> None:
    assert not loaded_after(EMBEDDING) & set(HEAVY)


def test_the_serve_request_and_token_modules_load_no_extra() -> None:
    # A proxy that routes on ids or approximate tokens needs neither jinja2 nor tokenizers.
    assert not loaded_after(("smetric.serve.request", "smetric.serve.tokens")) & {*HEAVY, "jinja2"}


def test_the_import_check_sees_heavy_modules() -> None:
    # Negative control: the same probe does report them when a module that needs them is imported.
    assert {"matplotlib", "tqdm", "numpy"} <= loaded_after(("smetric.sim.report", "smetric.toy_fleet"))
    assert "zmq" in loaded_after(("smetric.events",))
    assert {"aiohttp", "zmq"} <= loaded_after(("smetric.fake_engine.run",))


EXTRA_CASES = [
    # (module, top-level module that goes missing, its distribution, the extra that installs it)
    ("smetric.events", "zmq", "pyzmq", "events"),
    ("smetric.sim", "tqdm", "tqdm", "sim"),
    ("smetric.sim.report", "matplotlib", "matplotlib", "sim"),
    ("smetric.toy_fleet", "numpy", "numpy", "sim"),
    ("smetric.fake_engine.run", "aiohttp", "aiohttp", "fake-engine"),
    ("smetric.fake_engine.server", "zmq", "pyzmq", "fake-engine"),
    ("smetric.serve.chat_template", "jinja2", "jinja2", "serve"),
    ("smetric.serve.piecewise", "tokenizers", "tokenizers", "serve"),
    ("smetric.integrations.ray_serve", "ray", "ray", "ray"),
]


@pytest.mark.parametrize(("module", "missing", "requirement", "extra"), EXTRA_CASES)
def test_a_missing_extra_is_named(module: str, missing: str, requirement: str, extra: str) -> None:
    code = f"""
import sys
sys.modules[{missing!r}] = None
from smetric.errors import MissingExtraError
try:
    import {module}
except MissingExtraError as e:
    print(e.module, e.requirement, e.extra, e.name)
    print(e)
"""
    out = run(code)
    assert out.returncode == 0, out.stderr
    attributes, message = out.stdout.splitlines()
    assert attributes.split()[1:] == [requirement, extra, missing]
    assert message.endswith(f"pip install 'smetric-router[{extra}]'")
    assert message.startswith(f"{attributes.split()[0]} needs {requirement}")
    # Control: with the package present, the same import succeeds.
    assert run(f"import {module}").returncode == 0


EVERY_EXTRA = (*HEAVY, "jinja2", "yaml", "uvloop")
"""Every top-level module an extra installs (of those the CLI's commands use)."""


def test_the_cli_and_each_commands_help_load_no_extra_but_their_own() -> None:
    # `smetric --help`, `smetric serve --help` and `smetric fake-engine --help` work with no extra:
    # the simulator's commands are imported only when one of them is chosen.
    code = """
import contextlib, io, sys
from smetric.cli import main
for argv in (["--help"], ["serve", "--help"], ["fake-engine", "--help"], ["toy-fleet", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
"""
    out = run(code)
    assert out.returncode == 0, out.stderr
    assert not set(out.stdout.split()) & set(EVERY_EXTRA)
    # Control: choosing a simulator command does load its extra.
    out = run(code.replace('["toy-fleet", "--help"]', '["simulate", "--help"]'))
    assert out.returncode == 0, out.stderr
    assert {"matplotlib", "tqdm", "numpy"} <= set(out.stdout.split())


@pytest.mark.parametrize(
    ("command", "missing", "extra"),
    [("simulate", "matplotlib", "sim"), ("sweep", "tqdm", "sim"), ("toy-fleet", "numpy", "sim")],
)
def test_a_command_whose_extra_is_missing_names_it_and_exits_2(command: str, missing: str, extra: str) -> None:
    out = run(
        f"import sys; sys.modules[{missing!r}] = None; from smetric.cli import main; sys.exit(main([{command!r}]))"
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"smetric {command}: smetric.")
    assert out.stderr.rstrip().endswith(f"pip install 'smetric-router[{extra}]'")


def test_the_reference_names_the_dev_extra() -> None:
    # smetric.reference imports nothing of smetric, so it raises a plain ImportError.
    out = run("import sys; sys.modules['xxhash'] = None; import smetric.reference")
    assert out.returncode == 1
    assert "ImportError: smetric.reference needs xxhash" in out.stderr
    assert "pip install 'smetric-router[dev]'" in out.stderr


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0] for r in requirements}


def test_the_extras_named_install_what_is_missing() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert project["dependencies"] == [], "routing needs no dependency: optional ones go to an extra"
    for _, _, requirement, extra in EXTRA_CASES:
        assert requirement in requirement_names(extras[extra]), (requirement, extra)
    assert "xxhash" in requirement_names(extras["dev"])
