"""Answers re-sent: the blocks of an answer that the next turn re-renders stay cached on the
instance that generated them (``answer_rerender_share``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from smetric._core import load_workload, simulate
from smetric.cli import main
from smetric.errors import InvalidConfigError
from smetric.sim.config import ENGINE_DEFAULTS, SimulationConfig

TraceWriter = Callable[..., Path]


def test_a_larger_share_hits_more_of_each_session_at_home(weka_trace: TraceWriter) -> None:
    assert ENGINE_DEFAULTS["answer_rerender_share"] == SimulationConfig().answer_rerender_share == 1.0
    workload = load_workload([str(weka_trace())], "weka")
    hits = []
    for share in (0.0, 1.0):
        core, _, _ = SimulationConfig(instances=2, answer_rerender_share=share).core_config()
        hits.append(simulate(workload, "smetric", config=core)["local_hit_ratio"])
    assert hits[1] > hits[0]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InvalidConfigError) as e:
            simulate(workload, "smetric", config={"answer_rerender_share": bad})
        assert e.value.field == "answer_rerender_share"


def test_cli_answer_rerender_share(weka_trace: TraceWriter, tmp_path: Path) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "round_robin", "--feed-policies", ""]
    tiny = ["--instances", "2", "--duration-s", "200", "--warmup-s", "20", "--jobs", "1", "--no-progress"]
    out = tmp_path / "out"
    assert main([*argv, *tiny, "--ladder", "1", "--answer-rerender-share", "0.5", "--out", str(out)]) == 0
    assert '"answer_rerender_share": 0.5' in (out / "run.json").read_text()
    with pytest.raises(SystemExit):
        main([*argv, *tiny, "--answer-rerender-share", "2", "--out", str(tmp_path / "bad")])
