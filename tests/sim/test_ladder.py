"""Load ladders past saturation: ``run_until_collapse`` extends each policy's ladder until its
attainment collapses, and ``summarize`` says which peaks the ladder brackets."""

from __future__ import annotations

from pathlib import Path

import pytest

from smetric.sim import (
    COLLAPSE_ATTAINMENT,
    RunResult,
    RunSpec,
    SimulationConfig,
    TraceSpec,
    Window,
    run_until_collapse,
    summarize,
)
from smetric.sim.config import embedded_trace_path

WINDOW = Window(duration_s=400.0, warmup_s=50.0, max_think_s=60.0)


def _spec(policy: str, load: float, seed: int = 1) -> RunSpec:
    return RunSpec(
        trace=TraceSpec(paths=(str(embedded_trace_path()),), format="weka"),
        config=SimulationConfig(instances=2),
        window=WINDOW,
        policy=policy,
        load=load,
        seed=seed,
    )


def test_ladders_climb_until_every_policy_collapses() -> None:
    # Far below saturation at 0.01 sessions/s on 2 instances; doubling a rung at a time.
    specs = [_spec(p, 0.01) for p in ("least_load", "smetric_paper")]
    results = run_until_collapse(specs, step=2.0, max_extra_rungs=7, jobs=1, progress=False)
    assert [r.spec for r in results[:2]] == specs
    for s in summarize(results):
        ladder = [round(0.01 * 2**k, 10) for k in range(len(s.loads))]
        assert [round(x, 10) for x in s.loads] == ladder, "each rung doubles the last"
        assert len(s.loads) > 1, "0.01 sessions/s is not saturation"
        # Every rung below the top had not collapsed (else the ladder would have stopped there).
        assert all(a >= COLLAPSE_ATTAINMENT for a in s.attainment[:-1]), s.attainment
        if len(s.loads) < 8:
            assert s.attainment[-1] < COLLAPSE_ATTAINMENT and s.collapsed_at == s.loads[-1]
        assert s.collapsed_at is None or s.collapsed_at >= s.load_at_peak


def test_rungs_are_bounded_and_bad_steps_refused() -> None:
    results = run_until_collapse([_spec("least_load", 0.01)], step=2.0, max_extra_rungs=1, jobs=1, progress=False)
    assert sorted(r.spec.load for r in results) == [0.01, 0.02]
    with pytest.raises(ValueError, match="step > 1"):
        run_until_collapse([_spec("least_load", 0.01)], step=1.0, jobs=1, progress=False)


def _fake(load: float, tps: float, attainment: float) -> RunResult:
    spec = RunSpec(TraceSpec(("x",), "weka"), SimulationConfig(), Window(), "p", load)
    slo = {"tps_under_slo": tps, "attainment": attainment, "met": round(100 * attainment)}
    return RunResult(spec, {"measured": 100, "measured_rejected": 0}, [slo], 0.0)


def test_collapsed_at_is_the_first_collapse_at_or_past_the_peak() -> None:
    runs = [_fake(1.0, 10.0, 0.4), _fake(2.0, 50.0, 0.95), _fake(3.0, 40.0, 0.6), _fake(4.0, 5.0, 0.2)]
    (s,) = summarize(runs)
    assert (s.load_at_peak, s.collapsed_at) == (2.0, 4.0), "the collapse before the peak does not count"
    (s,) = summarize(runs[:3])
    assert s.collapsed_at is None, "the ladder stopped before the collapse: the peak is not bracketed"


def test_sweep_cli_until_collapse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from smetric.cli import main

    out = tmp_path / "sweep"
    argv = ["sweep", "--trace", str(embedded_trace_path()), "--policies", "least_load", "--loads", "0.05"]
    tiny = ["--instances", "2", "--duration-s", "300", "--warmup-s", "30", "--jobs", "1", "--no-progress"]
    assert (
        main([*argv, *tiny, "--until-collapse", "--ladder-step", "3", "--max-extra-rungs", "4", "--out", str(out)]) == 0
    )
    table = capsys.readouterr().out
    assert "collapsed at" in table
    with pytest.raises(SystemExit):
        main([*argv, *tiny, "--until-collapse", "--ladder-step", "1", "--out", str(out)])
