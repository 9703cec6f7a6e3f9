"""The test suite's own configuration: what CI runs is every test.

``make test`` (CI's command) runs ``pytest`` with the options of ``pyproject.toml``; neither may
deselect a marker, so the ``slow`` tests (and the ``wheel`` ones) run in CI, and a test that is
slow says so with ``@pytest.mark.slow`` rather than being left out.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recipe(makefile: str, target: str) -> list[str]:
    """The command lines of a Makefile target's recipe."""
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE)
    assert match, f"no target {target}"
    return [line.strip() for line in match.group(1).splitlines()]


def deselects(argv: list[str]) -> list[str]:
    """The options of a pytest command line (what follows ``pytest``) that leave tests out."""
    if "pytest" in argv:
        argv = argv[argv.index("pytest") + 1 :]
    return [a for a in argv if a in ("-m", "-k") or a.startswith(("-m=", "-k=", "--deselect", "--ignore"))]


def test_ci_runs_every_marker_including_slow() -> None:
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = re.search(r"^test:([^\n]*)$", makefile, re.MULTILINE)
    assert prerequisites and "test-python" in prerequisites.group(1).split()
    commands = [shlex.split(line) for line in recipe(makefile, "test-python")]
    pytest_runs = [c for c in commands if "pytest" in c]
    assert pytest_runs, commands
    assert all(deselects(c) == [] for c in pytest_runs), pytest_runs
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert deselects(shlex.split(options["addopts"])) == []
    assert any(m.startswith("slow:") for m in options["markers"])
    # Negative control: the check does see a deselection.
    assert deselects(shlex.split("python -m pytest -m 'not slow'")) == ["-m"]
    assert deselects(shlex.split("python -m pytest --deselect tests/x.py")) == ["--deselect"]


def test_the_slow_marker_is_in_use() -> None:
    marked = [p for p in (ROOT / "tests").rglob("test_*.py") if "pytest.mark.slow" in p.read_text()]
    assert len(marked) >= 3, marked


def test_test_modules_have_unique_names() -> None:
    # pytest's default import mode imports each test module under its basename: two test files
    # with one name in different folders stop the whole run at collection (it happened once:
    # tests/serve/test_responses.py beside tests/vllm_real/test_responses.py).
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) > 50, "the scan sees no test modules: the check is broken"
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
