"""Built-in profiles, profile files (``smetric-profile/1``, ``docs/perf-model.md`` §9) and the
per-run profile knobs, through the binding, the typed config and the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smetric._core import PerfModel, load_workload, sim_profile, sim_profiles, simulate
from smetric.cli import main
from smetric.errors import InvalidConfigError
from smetric.sim.config import SimulationConfig

TraceWriter = Callable[..., Path]
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "profiles" / "example-h20-3e.json"
THIRTY_B = ("h20", "h20-3e", "h200")


def test_every_30b_profile_has_a_bf16_and_an_fp8_variant() -> None:
    names = sim_profiles()
    for gpu in THIRTY_B:
        bf16, fp8 = sim_profile(f"{gpu}-qwen3-coder-30b-a3b"), sim_profile(f"{gpu}-qwen3-coder-30b-a3b-fp8")
        assert bf16["name"] in names and fp8["name"] in names
        # FP8 frees weight memory (more KV) and streams fewer weight bytes; compute is the GPU's.
        assert fp8["kv_capacity_tokens"] > bf16["kv_capacity_tokens"]
        assert fp8["dense_weight_bytes"] < bf16["dense_weight_bytes"]
        assert fp8["linear_s_per_token"] == bf16["linear_s_per_token"]
    h20, h20_3e = sim_profile("h20-qwen3-coder-30b-a3b"), sim_profile("h20-3e-qwen3-coder-30b-a3b")
    assert h20_3e["linear_s_per_token"] == h20["linear_s_per_token"]  # H20 compute
    assert h20_3e["hbm_bytes_per_s"] == 4.8e12 and h20_3e["kv_capacity_tokens"] == 715_106
    assert PerfModel("h20-3e-qwen3-coder-30b-a3b").kv_capacity_tokens == 715_106


def test_the_example_profile_file_loads_with_its_base() -> None:
    resolved = sim_profile(file=EXAMPLE)
    doc: dict[str, Any] = json.loads(EXAMPLE.read_text())
    assert resolved["name"] == doc["name"] and resolved["base"] == doc["base"]
    for key, value in doc["profile"].items():
        assert resolved[key] == value, key  # type: ignore[literal-required]
    base = sim_profile(doc["base"])
    assert resolved["linear_s_per_token"] == base["linear_s_per_token"]


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"format": "smetric-profile/2", "name": "x", "profile": {}}, "profile_file.format"),
        ({"format": "smetric-profile/1", "name": "x", "profile": {"tp": 1}}, "profile.layers"),
        ({"format": "smetric-profile/1", "name": "x", "base": "a100", "profile": {}}, "profile_file.base"),
        (
            {"format": "smetric-profile/1", "name": "x", "base": "h20-qwen3-coder-30b-a3b", "profile": {"eta": 1}},
            "profile",
        ),
        (
            {"format": "smetric-profile/1", "name": "x", "base": "h20-qwen3-coder-30b-a3b",
             "profile": {"step_overhead_s": "5ms"}},
            "profile.step_overhead_s",
        ),
        (
            {"format": "smetric-profile/1", "name": "x", "base": "h20-qwen3-coder-30b-a3b",
             "profile": {"kv_capacity_tokens": -5}},
            "profile.kv_capacity_tokens",
        ),
    ],
)  # fmt: skip
def test_a_bad_profile_file_names_its_field(tmp_path: Path, doc: dict[str, Any], field: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidConfigError) as e:
        sim_profile(file=path)
    assert e.value.field == field and str(path) in e.value.reason
    with pytest.raises(InvalidConfigError):
        SimulationConfig().with_profile_file(path)
    with pytest.raises(FileNotFoundError):
        sim_profile(file=tmp_path / "missing.json")


def test_overrides_reach_the_engine(weka_trace: TraceWriter) -> None:
    workload = load_workload([str(weka_trace())], "weka")
    config = SimulationConfig(instances=2).with_profile_file(EXAMPLE)
    assert config.profile == "h20-3e-qwen3-coder-30b-a3b"
    slow = config.with_profile_overrides(step_overhead_s=0.05)
    assert slow.resolved_profile()["step_overhead_s"] == 0.05
    assert slow.profile_label == "example-h20-3e.json step_overhead_s=0.05"
    # A mapping is accepted at run time (and stored as sorted pairs), though typed as pairs.
    as_dict = SimulationConfig(profile_overrides={"step_overhead_s": 0.05})  # type: ignore[arg-type]
    assert as_dict.profile_overrides == (("step_overhead_s", 0.05),)
    reports = []
    for c in (config, slow):
        core, _, _ = c.core_config()
        reports.append(simulate(workload, "round_robin", config=core))
    assert reports[0]["profile"] == "example-h20-3e-run"
    assert reports[1]["tpot"]["p50"] > reports[0]["tpot"]["p50"]
    with pytest.raises(InvalidConfigError) as e:
        config.with_profile_overrides(kv_read_efficiency=float("nan"))
    assert e.value.field == "profile.kv_read_efficiency"
    with pytest.raises(InvalidConfigError):
        simulate(workload, "round_robin", config={"profile": "h20-qwen3-coder-30b-a3b", "profile_file": str(EXAMPLE)})


def test_cli_profile_file_and_knobs(weka_trace: TraceWriter, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "round_robin", "--feed-policies", ""]
    tiny = ["--instances", "2", "--duration-s", "200", "--warmup-s", "20", "--jobs", "1", "--no-progress"]
    knobs = ["--step-overhead-ms", "6", "--kv-read-efficiency", "0.5", "--kv-capacity-tokens", "400000"]
    assert main([*argv, *tiny, "--ladder", "1", "--profile-file", str(EXAMPLE), *knobs, "--out", str(out)]) == 0
    run = json.loads((out / "run.json").read_text())["config"]
    assert run["profile_file"] == str(EXAMPLE)
    resolved = run["profile_resolved"]
    assert resolved["name"] == "example-h20-3e-run" and resolved["kv_capacity_tokens"] == 400_000
    assert resolved["step_overhead_s"] == pytest.approx(0.006) and resolved["kv_read_efficiency"] == 0.5
    with pytest.raises(SystemExit):
        main([*argv, *tiny, "--kv-read-efficiency", "1.5", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit):
        main([*argv, *tiny, "--profile", "a100-llama", "--out", str(tmp_path / "bad")])
