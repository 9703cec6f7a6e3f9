"""``smetric_v1`` is the July rule that ``smetric_paper`` named before the v2 rule took the name:
it must reproduce that preset's figures to the token.

``data/smetric_v1_figures.json`` holds the figures of ``smetric_paper`` at commit f980f13 (the
last commit before v2), recorded with the run below: the embedded Weka excerpt, 4 co-located
instances, tier on and off, two loads, seed 1. Any change to what the v1 rule decides, or to
what the load board tells it, changes some figure here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric.sim import RunSpec, SimulationConfig, TraceSpec, Window, run_one
from smetric.sim.config import GlobalTier, embedded_trace_path

FIGURES = Path(__file__).parent / "data" / "smetric_v1_figures.json"
WINDOW = Window(duration_s=600.0, warmup_s=100.0, max_think_s=60.0)
# Recorded before the simulator credited answers re-sent by the next turn: share 0 keeps the
# simulator of that commit, so the figures still pin the rule alone.
BASE = SimulationConfig(instances=4, answer_rerender_share=0.0)
CONFIGS = {
    "tier": BASE,
    "no_tier": replace(BASE, global_tier=GlobalTier(enabled=False)),
}
LOADS = (0.05, 0.2)


def _figures(policy: str) -> dict[str, Any]:
    trace = TraceSpec(paths=(str(embedded_trace_path()),), format="weka")
    out: dict[str, Any] = {}
    for label, config in CONFIGS.items():
        for load in LOADS:
            r = run_one(RunSpec(trace=trace, config=config, window=WINDOW, policy=policy, load=load, seed=1))
            # Through JSON, as recorded: tuples become lists, floats keep every bit.
            out[f"{label}@{load}"] = json.loads(json.dumps({"metrics": r.metrics, "slos": r.slos}))
    return out


def test_smetric_v1_reproduces_the_former_paper_preset_to_the_token() -> None:
    recorded = json.loads(FIGURES.read_text())
    now = _figures("smetric_v1")
    # Each SLO's TTFT and TPOT attainments joined `slos` after the recording; the recorded keys
    # must match to the bit, and the headline's new keys agree with the flat metrics.
    for run in now.values():
        for k, slo in enumerate(run["slos"]):
            assert set(SLO_KEYS_SINCE) <= set(slo)
            if k == 0:
                assert slo["ttft_attainment"] == run["metrics"]["ttft_attainment"]
                assert slo["tpot_attainment"] == run["metrics"]["tpot_attainment"]
        run["slos"] = [{key: v for key, v in slo.items() if key not in SLO_KEYS_SINCE} for slo in run["slos"]]
    assert now == recorded


SLO_KEYS_SINCE = ("ttft_attainment", "tpot_attainment")
"""``RunResult.slos`` keys added after the figures were recorded."""


@pytest.mark.parametrize("load", LOADS)
def test_smetric_paper_is_now_a_different_rule(load: float) -> None:
    """The v2 rule decides differently on the same runs (its own reasons appear)."""
    recorded = json.loads(FIGURES.read_text())[f"tier@{load}"]["metrics"]
    trace = TraceSpec(paths=(str(embedded_trace_path()),), format="weka")
    run = RunSpec(trace=trace, config=CONFIGS["tier"], window=WINDOW, policy="smetric_paper", load=load, seed=1)
    reasons = run_one(run).metrics["reasons"]
    assert reasons != recorded["reasons"]
    assert "follow-up: migrate (home overloaded)" not in reasons, "a v1 reason"
    assert reasons.get("follow-up: migrate (home misses TTFT budget)", 0) > 0
