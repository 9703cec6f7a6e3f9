"""The Codex-like generator through the Python surface: loader options, the trace spec, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smetric._core import load_workload
from smetric.cli import main
from smetric.errors import InvalidArgumentError
from smetric.sim.config import TraceSpec


def test_loader_generates_seeded_sessions() -> None:
    a = load_workload([], "codex", codex={"sessions": 12, "seed": 3})
    b = load_workload([], "codex", codex={"sessions": 12, "seed": 3})
    c = load_workload([], "codex", codex={"sessions": 12, "seed": 4})
    assert a.sessions == 12
    assert len(a) == len(b) and len(a) > 12 * 2
    assert len(a) != len(c) or a.name != c.name
    with pytest.raises(InvalidArgumentError):
        load_workload(["x.jsonl"], "codex")
    with pytest.raises(InvalidArgumentError):
        load_workload([], "synthetic", codex={"seed": 1})


def test_trace_spec_names_the_seed_and_rejects_unknown_options() -> None:
    spec = TraceSpec.codex_sessions(seed=7, sessions=5)
    assert spec.name == "codex(seed=7,sessions=5)"
    assert spec.loader_options() == {"codex": {"seed": 7, "sessions": 5}}
    with pytest.raises(ValueError, match="unknown codex options"):
        TraceSpec.codex_sessions(turns=3)


def test_cli_simulates_the_codex_format(tmp_path: Path) -> None:
    argv = ["simulate", "--format", "codex", "--codex-seed", "11", "--policies", "bailian_top3", "--ladder", "1"]
    main([*argv, "--instances", "2", "--feed-policies", "", "--no-progress", "--out", str(tmp_path / "a")])
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert "codex(seed=11)" in json.dumps(run)
