"""``smetric simulate --pd``: the PD cluster's CLI contract and its results fields."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from smetric._core import load_workload, simulate
from smetric._types import PdRunReport, PdSettings, Percentiles
from smetric.cli import main
from smetric.errors import InvalidConfigError
from smetric.sim import PD_DEFAULTS, SimulationConfig

TraceWriter = Callable[..., Path]
TINY = ["--duration-s", "300", "--warmup-s", "30", "--jobs", "1", "--no-progress", "--feed-policies", ""]


def test_simulate_pd_writes_the_pd_fields(
    weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "smetric,lmetric,round_robin"]
    argv += ["--pd", "--prefill-instances", "2", "--decode-instances", "1", "--load", "0.05", "--ladder", "1"]
    assert main([*argv, *TINY, "--out", str(out)]) == 0
    assert "(PD 2P:1D)" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["smetric", "lmetric", "round_robin"]
    for policy, entry in results.items():
        assert isinstance(entry["prefill_tps_under_slo"], float) and entry["prefill_tps_under_slo"] > 0
        assert isinstance(entry["ttft_p50_s"], float) and entry["ttft_p50_s"] > 0
        assert entry["pd"] == "2P:1D" and entry["transfers"] > 0 and entry["transfer_bytes"] > 0
        assert entry["transfer_p50_ms"] > 0 and 0 < entry["decode_kv_usage_max"] <= 1
        assert entry["by_slo"][0]["prefill_tps_under_slo"] == entry["prefill_tps_under_slo"]
        peer = {"smetric": "kv_fit", "round_robin": "round_robin"}.get(policy, "power_of_two")
        assert entry["decode_rule"] == peer
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["instances"] == 3 and run["config"]["pd"]["prefill_instances"] == 2
    # A co-located run has prefill TPS too, and no PD fields.
    co = tmp_path / "co"
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "smetric", "--instances", "3", "--ladder", "1"]
    assert main([*argv, *TINY, "--out", str(co)]) == 0
    entry = json.loads((co / "results.json").read_text())["smetric"]
    assert entry["prefill_tps_under_slo"] > 0 and "transfers" not in entry


def test_pd_flags_are_checked(weka_trace: TraceWriter, tmp_path: Path) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "smetric", *TINY, "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        main([*argv, "--pd", "--prefill-instances", "2"])
    with pytest.raises(SystemExit):
        main([*argv, "--decode-instances", "2"])
    with pytest.raises(SystemExit):
        main([*argv, "--pd", "--prefill-instances", "0", "--decode-instances", "2"])
    with pytest.raises(ValueError, match="unknown decode rule"):
        SimulationConfig().with_pd(2, 2, "nope")  # type: ignore[arg-type]


def test_engine_pd_config(weka_trace: TraceWriter) -> None:
    w = load_workload(weka_trace(), "weka")
    pd = {"prefill_instances": 1, "decode_instances": 1, "decode_rule": "least_batch"}
    report = simulate(w, "smetric", config={"instances": 2, "pd": pd})
    assert report["pd"] is not None and report["pd"]["decode_rule"] == "least_batch"
    assert set(report["pd"]) == set(PdRunReport.__required_keys__)
    assert set(report["pd"]["transfer_time"]) == set(Percentiles.__required_keys__)
    assert set(PD_DEFAULTS) == set(PdSettings.__required_keys__)
    assert report["pd"]["transfers"] == report["completed"]
    assert simulate(w, "smetric", config={"instances": 2})["pd"] is None
    with pytest.raises(InvalidConfigError):
        simulate(w, "smetric", config={"instances": 3, "pd": pd})
    with pytest.raises(InvalidConfigError):
        simulate(w, "smetric", config={"instances": 2, "pd": {**pd, "decode_rule": "nope"}})
    assert PD_DEFAULTS["decode_rule"] is None and PD_DEFAULTS["transfer_rank_bytes_per_s"] > 0
