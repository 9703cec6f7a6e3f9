"""The synthetic agent-session format: defaults from Rust, statistics on target, runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smetric._core import load_workload, synthetic_defaults, workload_reuse_stats
from smetric._types import SyntheticOptions
from smetric.cli import main
from smetric.errors import InvalidArgumentError, InvalidConfigError
from smetric.sim import SYNTHETIC_DEFAULTS, RunSpec, SimulationConfig, TraceSpec, Window, run_one


def test_defaults_come_from_rust_and_match_the_typed_dict() -> None:
    defaults = synthetic_defaults()
    assert defaults == SYNTHETIC_DEFAULTS
    assert set(defaults) == set(SyntheticOptions.__annotations__)
    assert defaults["kv_tokens"] > 0 and 0.0 < defaults["context_ratio"] <= 1.0


def test_generated_statistics_hit_the_bailian_targets() -> None:
    w = load_workload([], "synthetic")
    s = workload_reuse_stats(w, SYNTHETIC_DEFAULTS["kv_tokens"])
    assert w.arrival == "closed_loop" and w.root_sessions == SYNTHETIC_DEFAULTS["sessions"]
    assert s["reusable_share"] == pytest.approx(0.815, abs=0.02)
    assert s["same_session_reuse_share"] == pytest.approx(0.67, abs=0.03)
    assert s["think_within_100s"] == pytest.approx(0.9, abs=0.03)
    assert s["followup_share"] == pytest.approx(0.935, abs=0.01)
    assert s["final_context_ratio"] == pytest.approx(SYNTHETIC_DEFAULTS["context_ratio"], rel=0.15)


def test_options_override_and_are_validated() -> None:
    small = load_workload([], "synthetic", synthetic={"sessions": 10, "context_ratio": 0.5, "seed": 3})
    assert small.root_sessions == 10
    stats = workload_reuse_stats(small, SYNTHETIC_DEFAULTS["kv_tokens"])
    assert stats["final_context_ratio"] == pytest.approx(0.5, rel=0.25)
    again = load_workload([], "synthetic", synthetic={"sessions": 10, "context_ratio": 0.5, "seed": 3})
    assert workload_reuse_stats(again, SYNTHETIC_DEFAULTS["kv_tokens"]) == stats, "seeded"
    with pytest.raises(InvalidConfigError):
        load_workload([], "synthetic", synthetic={"no_such_option": 1})
    with pytest.raises(InvalidConfigError):
        load_workload([], "synthetic", synthetic={"context_ratio": -1.0})
    with pytest.raises(InvalidArgumentError):
        load_workload(["x.jsonl"], "synthetic")
    with pytest.raises(ValueError, match="unknown synthetic options"):
        TraceSpec.synthetic_sessions(no_such_option=1)


def test_a_run_on_the_synthetic_sessions() -> None:
    trace = TraceSpec.synthetic_sessions(sessions=40)
    assert trace.name == "synthetic(sessions=40)"
    spec = RunSpec(trace, SimulationConfig(instances=2), Window(duration_s=600, warmup_s=120), "smetric", load=0.05)
    result = run_one(spec)
    assert result.metrics["measured"] > 0
    assert result.metrics["tps_under_slo"] > 0


def test_simulate_cli_on_the_synthetic_format(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--format", "synthetic", "--policies", "least_load,smetric", "--instances", "2"]
    tiny = ["--duration-s", "300", "--warmup-s", "30", "--jobs", "1", "--no-progress", "--load", "0.05"]
    assert main([*argv, *tiny, "--ladder", "1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results
