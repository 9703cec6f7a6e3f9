"""The SMetric paper's SLO in the simulator (``--slo paper``): the end-to-end budget, the
>16,384-output-token drop, the per-model constants, and agreement with the engine's scorer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric._core import L_EQ_QWEN3_235B_A22B, L_EQ_QWEN3_CODER_30B_A3B
from smetric.cli import main
from smetric.sim import PAPER_SLO, PAPER_SLO_235B, SLO, RunSpec, SimulationConfig, TraceSpec, Window, run_one
from smetric.sim.config import embedded_trace_path, paper_slo, policy_router
from smetric.sim.end_to_end_slo import score_end_to_end


def _records(rows: list[tuple[float | None, float | None, float | None, int, int, bool]]) -> Any:
    """Request records from (arrival, first token, finish, input, output, rejected) rows."""
    return {
        "arrival_s": [r[0] for r in rows],
        "first_token_s": [r[1] for r in rows],
        "finish_s": [r[2] for r in rows],
        "tpot_s": [None if r[2] is None or r[1] is None or r[4] < 2 else (r[2] - r[1]) / (r[4] - 1) for r in rows],
        "input_tokens": [r[3] for r in rows],
        "output_tokens": [r[4] for r in rows],
        "rejected": [r[5] for r in rows],
    }


def test_end_to_end_budget_and_drop_by_hand() -> None:
    # Budget of each: 1 s + input/16,000 + 20 ms × output.
    rows: list[tuple[float | None, float | None, float | None, int, int, bool]] = [
        (10.0, 10.5, 13.0, 16_000, 50, False),  # 3.0 s ≤ 1 + 1 + 1.0 = 3.0: met
        (10.0, 10.5, 13.01, 16_000, 50, False),  # 3.01 s > 3.0: missed (its TTFT is met)
        (10.0, 12.5, 13.0, 16_000, 50, False),  # TTFT 2.5 s > 2 s, but the sum is within budget: met
        (10.0, 10.1, 400.0, 1_000, 20_000, False),  # output > 16,384: dropped, not measured
        (10.0, None, None, 500, 10, True),  # rejected: measured, never met
        (5.0, 5.1, 5.2, 100, 2, False),  # arrived before the window: not measured
        (None, None, None, 100, 2, False),  # never arrived: not measured
    ]
    r = score_end_to_end(_records(rows), PAPER_SLO, 9.0, 29.0)
    assert r["met"] == 2 and r["attainment"] == 2 / 4
    assert r["ttft_attainment"] == 2 / 4
    assert r["tbt_tail_attainment"] == 3 / 4, "served share"
    assert r["tps_under_slo"] == (16_050 + 16_050) / 20.0
    assert r["output_tps_under_slo"] == 100 / 20.0
    assert r["prefill_tps_under_slo"] == 32_000 / 20.0
    # Without the drop the long one is measured, and meets: 390 s ≤ 1 + 0.0625 + 400 s.
    kept = score_end_to_end(_records(rows), replace(PAPER_SLO, max_output_tokens=None), 9.0, 29.0)
    assert kept["met"] == 3 and kept["attainment"] == 3 / 5
    with pytest.raises(ValueError, match="not an end-to-end SLO"):
        score_end_to_end(_records(rows), SLO(), 9.0, 29.0)


def test_paper_constants_follow_the_model() -> None:
    assert (PAPER_SLO.ttft_base_s, PAPER_SLO.ttft_s_per_token * 16_000) == (1.0, 1.0)
    assert (PAPER_SLO.e2e_s_per_output_token, PAPER_SLO.max_output_tokens) == (0.020, 16_384)
    assert PAPER_SLO.label == "e2e≤1s+0.0625ms/tok+20ms/out (out≤16384)"
    assert paper_slo("h20-qwen3-coder-30b-a3b") is PAPER_SLO
    assert paper_slo("h20-qwen3-235b-a22b-fp8-tp4") is PAPER_SLO_235B
    assert PAPER_SLO_235B.e2e_s_per_output_token == 0.033
    # The v2 rule's L_EQ follows the profile's model, also under the smetric_paper preset.
    big = SimulationConfig(profile="h20-qwen3-235b-a22b-fp8-tp4")
    _, router = policy_router("smetric_paper", big.router_config())
    assert router is not None and router.smetric_l_eq_tokens == L_EQ_QWEN3_235B_A22B
    assert router.smetric_rule == "v2"
    assert SimulationConfig().router_config() is None, "the 30B profile's L_EQ is the default"
    _, router = policy_router("smetric_paper", big.with_router(smetric_l_eq_tokens=9000.0).router_config())
    assert router is not None and router.smetric_l_eq_tokens == 9000.0
    assert L_EQ_QWEN3_CODER_30B_A3B == 6923.0


def test_a_run_scores_the_paper_slo_beside_the_engine_ones() -> None:
    """An end-to-end SLO whose TTFT part is the engine's SLO's gives the engine's prefill TPS to
    the bit (same window, same measured set), and with an unbounded output term every served
    request meets it (the engine's served share)."""
    engine = SLO()
    generous = replace(
        PAPER_SLO,
        ttft_base_s=engine.ttft_base_s,
        ttft_s_per_token=engine.ttft_s_per_token,
        e2e_s_per_output_token=1e6,
        max_output_tokens=None,
    )
    config = SimulationConfig(instances=4, slos=(engine, PAPER_SLO, generous))
    spec = RunSpec(
        trace=TraceSpec(paths=(str(embedded_trace_path()),), format="weka"),
        config=config,
        window=Window(duration_s=600.0, warmup_s=100.0, max_think_s=60.0),
        policy="smetric_paper",
        load=0.2,
        seed=1,
    )
    r = run_one(spec)
    ours, paper, loose = r.slos
    assert loose["prefill_tps_under_slo"] == ours["prefill_tps_under_slo"]
    assert loose["met"] > 0 and loose["attainment"] >= ours["attainment"]
    assert paper["met"] <= loose["met"] and 0.0 <= paper["attainment"] <= 1.0
    assert paper["tps_under_slo"] >= paper["output_tps_under_slo"] > 0.0


def test_cli_reports_the_paper_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(embedded_trace_path()), "--policies", "smetric_paper,smetric_v1"]
    tiny = ["--instances", "2", "--duration-s", "300", "--warmup-s", "30", "--jobs", "1", "--no-progress"]
    assert main([*argv, *tiny, "--load", "0.05", "--ladder", "1", "--slo", "paper", "--out", str(out)]) == 0
    assert "SLO (also):     e2e≤1s+0.0625ms/tok+20ms/out (out≤16384)" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    for entry in results.values():
        assert [s["slo"] for s in entry["by_slo"]][-1] == PAPER_SLO.label
    with pytest.raises(SystemExit) as bad:
        main([*argv, *tiny, "--slo", "nope", "--out", str(out)])
    assert bad.value.code == 2
    assert "--slo: unknown nope; known: paper" in capsys.readouterr().err
