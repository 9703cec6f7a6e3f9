"""The simulator's typed results: each ``TypedDict`` of ``smetric._types`` has exactly the keys
``simulate()`` and ``sim_config_defaults()`` return, and the ``Literal``s the values they use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args, is_typeddict

from smetric._core import load_workload, sim_config_defaults, simulate
from smetric._types import (
    ArrivalKind,
    GlobalTierSettings,
    IndexFeed,
    LoadSeries,
    Percentiles,
    Reason,
    RequestRecords,
    SimConfigDefaults,
    SimReport,
    SloResult,
    SloSettings,
    TraceFormat,
    TurnFeed,
)
from smetric.sim import FORMATS, INDEX_FEEDS, TURN_FEEDS
from smetric.sim.report import instance_rows, verdict_line
from smetric.sim.runner import PolicySummary

TraceWriter = Callable[..., Path]


def keys(typed: Any) -> set[str]:
    assert is_typeddict(typed)
    return set(typed.__required_keys__ | typed.__optional_keys__)


def test_config_defaults_have_the_declared_keys() -> None:
    defaults = sim_config_defaults()
    assert set(defaults) == keys(SimConfigDefaults)
    assert set(defaults["global_tier"]) == keys(GlobalTierSettings)
    assert set(defaults["slo"]) == keys(SloSettings)
    assert defaults["index_feed"] in get_args(IndexFeed)
    assert get_args(TraceFormat) == FORMATS and get_args(IndexFeed) == INDEX_FEEDS
    assert defaults["turns"] == TURN_FEEDS[0] == get_args(TurnFeed)[0] == "request"


def test_report_has_the_declared_keys(weka_trace: TraceWriter) -> None:
    w = load_workload(weka_trace(), "weka")
    assert w.arrival in get_args(ArrivalKind)
    config = {"instances": 2, "series_interval_s": 5.0, "keep_records": True, "index_feed": "events"}
    report = simulate(w, "smetric", config=config, slo_variants=[{"tpot_s": [0.2]}])
    assert set(report) == keys(SimReport)
    assert SimReport.__optional_keys__ == {"records"}
    assert "records" not in simulate(w, "smetric", config={"instances": 2})
    assert set(report["ttft"]) == set(report["tpot"]) == keys(Percentiles)
    assert all(set(s) == keys(SloResult) for s in [*report["slo"], *report["slo_variants"][0]])
    assert set(report["load_series"]) == keys(LoadSeries)
    assert set(report["records"]) == keys(RequestRecords)
    assert set(report["reasons"]) <= set(get_args(Reason))
    assert set(report["records"]["reason"]) <= {*get_args(Reason), ""}
    assert report["index_feed"] in get_args(IndexFeed)
    assert report["turns"] == "request"


def test_the_load_heat_map_rows_are_instances_by_mean_load_in_the_window() -> None:
    series: LoadSeries = {
        "instances": 3,
        "time_s": [0.0, 10.0, 20.0, 30.0],
        # Instance 0 is busiest before the window, instance 2 inside it (t = 10 … 30).
        "requests": [[9, 0, 0], [1, 2, 5], [1, 3, 5], [1, 4, 5]],
        "queued_tokens": [[0, 0, 0]] * 4,
        "kv_usage": [[0.0, 0.0, 0.0]] * 4,
    }
    rows, means = instance_rows(series, (10.0, 30.0))
    assert rows == [[9, 1, 1, 1], [0, 2, 3, 4], [0, 5, 5, 5]]
    assert means == [1.0, 3.0, 5.0]
    # A window without samples falls back to the whole run: instance 0's spike then counts.
    rows, means = instance_rows(series, (100.0, 200.0))
    assert means == [2.25, 3.0, 3.75] and rows[0] == [0, 2, 3, 4]


def _summary(policy: str, peak: float, load: float) -> PolicySummary:
    return PolicySummary(policy, True, [0.1, 0.2], [peak, peak], [1.0, 1.0], [1.0, 1.0], peak, load, 0.2)


def _run(policy: str, load: float, attainment: float, ttft_p90_s: float, local_hit: float) -> Any:
    metrics = {"ttft_p90_s": ttft_p90_s, "tpot_p90_s": 0.02, "local_hit_ratio": local_hit, "global_hit_ratio": 0.1}
    spec = SimpleNamespace(policy=policy, tier=True, load=load)
    return SimpleNamespace(spec=spec, metrics=metrics, slos=[{"attainment": attainment}, {"attainment": 0.5}])


def test_the_verdict_names_the_best_baseline_the_ratio_and_why_behind() -> None:
    summaries = [_summary("smetric", 90.0, 0.1), _summary("lmetric", 100.0, 0.2), _summary("smetric_v1", 200.0, 0.2)]
    runs = [_run("smetric", 0.2, 0.8, 3.5, 0.4), _run("lmetric", 0.2, 0.95, 1.5, 0.7)]
    line = verdict_line(runs, summaries, load_unit="sessions/s")
    # smetric_v1 is one of ours, not a baseline, however high its peak.
    assert line is not None
    assert line.startswith("smetric: peak 90 tok/s under SLO = x0.90 the best baseline (lmetric, 100)")
    assert "why not: at load 0.2 sessions/s it meets the SLO on 80.0% vs 95.0%" in line
    assert "TTFT p90 3.50 vs 1.50 s" in line and "local hit 40.0% vs 70.0%" in line
    # Under the second SLO the attainment comes from that SLO's results.
    assert "on 50.0% vs 50.0%" in (verdict_line(runs, summaries, load_unit="sessions/s", slo_index=1) or "")
    ahead = verdict_line(runs, [_summary("smetric", 110.0, 0.2), _summary("lmetric", 100.0, 0.2)], load_unit="x")
    assert ahead == "smetric: peak 110 tok/s under SLO = x1.10 the best baseline (lmetric, 100)"
    assert verdict_line(runs, [_summary("lmetric", 100.0, 0.2)], load_unit="x") is None
