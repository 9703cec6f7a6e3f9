"""Contract of the simulator bindings: loaders of every format, typed errors, config, report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric import RouterConfig
from smetric._core import (
    MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK,
    Workload,
    load_workload,
    sim_config_defaults,
    sim_profiles,
    sim_tier_paths,
    simulate,
)
from smetric.errors import (
    EmptyWorkloadError,
    InvalidArgumentError,
    InvalidConfigError,
    SimulationError,
    SmetricError,
    TraceFormatError,
    UnknownPolicyError,
)
from smetric.sim import TIER_PATHS, SimulationConfig

TraceWriter = Callable[..., Path]

# (format, requests, block tokens, arrival)
FORMATS = [
    ("weka", 24, 256, "closed_loop"),
    ("bailian", 3, 16, "open_loop"),
    ("mooncake", 3, 512, "open_loop"),
    ("azure", 2, 16, "open_loop"),
]


@pytest.mark.parametrize(("fmt", "requests", "block", "arrival"), FORMATS)
def test_every_format_loads_and_simulates(
    trace_of: Callable[[str], Path], fmt: str, requests: int, block: int, arrival: str
) -> None:
    w = load_workload(trace_of(fmt), fmt)
    assert isinstance(w, Workload)
    assert (len(w), w.block_tokens, w.arrival) == (requests, block, arrival)
    assert w.input_tokens > 0 and w.output_tokens > 0
    report = simulate(w, "smetric", config={"instances": 2})
    assert report["completed"] == requests
    assert report["policy"] == "smetric"
    assert report["instances"] == 2
    assert 0.0 <= report["slo"][0]["attainment"] <= 1.0


def test_weka_options_and_paths(weka_trace: TraceWriter) -> None:
    path = weka_trace()
    assert load_workload(str(path), "weka", coarsen=1).block_tokens == 64
    both = load_workload([path, weka_trace("second.jsonl", sessions=1, first=10)], "weka")
    assert (both.name, both.root_sessions) == ("weka(2 files)", 5)
    with pytest.raises(TraceFormatError) as err:  # request ids are unique across the files
        load_workload([path, weka_trace("again.jsonl", sessions=1)], "weka")
    assert (err.value.line, err.value.path.endswith("again.jsonl")) == (1, True)
    assert repr(both).startswith("Workload(")


def test_workload_is_frozen(trace_of: Callable[[str], Path]) -> None:
    w = load_workload(trace_of("azure"), "azure")
    with pytest.raises(AttributeError):
        w.name = "x"  # type: ignore[misc]


def test_malformed_trace_names_file_and_line(tmp_path: Path, weka_trace: TraceWriter) -> None:
    lines = weka_trace().read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # truncated JSON on line 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as err:
        load_workload(bad, "weka")
    assert err.value.line == 3
    assert err.value.path.endswith("bad.jsonl")
    assert isinstance(err.value, SmetricError) and isinstance(err.value, ValueError)
    assert "bad.jsonl:3" in str(err.value)

    negative = tmp_path / "negative.jsonl"
    row = '{"timestamp": %s, "input_length": 10, "output_length": 1}\n'
    negative.write_text(row % 0 + row % -5)
    with pytest.raises(TraceFormatError) as err:
        load_workload(negative, "azure")
    assert (err.value.line, "timestamp" in err.value.reason) == (2, True)


def test_io_and_argument_errors(tmp_path: Path, trace_of: Callable[[str], Path]) -> None:
    with pytest.raises(FileNotFoundError):
        load_workload(tmp_path / "missing.jsonl", "weka")
    with pytest.raises(InvalidArgumentError) as err:
        load_workload(trace_of("azure"), "csv")
    assert err.value.argument == "format"
    with pytest.raises(InvalidArgumentError):
        load_workload([trace_of("azure"), trace_of("azure")], "azure")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EmptyWorkloadError):
        load_workload(empty, "azure")
    with pytest.raises(TypeError):
        load_workload(42, "azure")  # type: ignore[arg-type]


def test_config_errors_are_typed(trace_of: Callable[[str], Path]) -> None:
    w = load_workload(trace_of("azure"), "azure")
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"instance": 2})
    assert (err.value.field, "instance" in err.value.reason) == ("config", True)
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"instances": 0})
    assert err.value.field == "instances"
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"global_tier": {"bandwidth": 1}})
    assert err.value.field == "global_tier"
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"profile": "a100"})
    assert err.value.field == "profile"
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"index_feed": "exact"})
    assert err.value.field == "index_feed" and "approximate, events, oracle" in err.value.reason
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"index_feed": "events", "event_delay_s": -0.5})
    assert err.value.field == "event_delay_s"
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"turns": "hint"})
    assert err.value.field == "turns" and "request, index" in err.value.reason
    with pytest.raises(TypeError, match="instances"):
        simulate(w, "smetric", config={"instances": "two"})
    with pytest.raises(UnknownPolicyError):
        simulate(w, "fastest")
    with pytest.raises(SimulationError) as budget:
        simulate(w, "smetric", config={"max_events": 3})
    assert budget.value.reason == "event budget" and "3 events" in str(budget.value)


def test_python_defaults_come_from_the_engine() -> None:
    defaults = sim_config_defaults()
    config = SimulationConfig()
    assert config.instances == defaults["instances"] == 16
    assert config.profile == defaults["profile"] in sim_profiles()
    assert config.global_tier.enabled is defaults["global_tier"]["enabled"] is True
    assert [s.tpot_s for s in config.slos] == defaults["slo"]["tpot_s"]
    assert config.slos[0].ttft_base_s == defaults["slo"]["ttft_base_s"]
    assert config.turns == defaults["turns"] == "request"
    assert config.with_turns("index").core_config()[0]["turns"] == "index"
    with pytest.raises(ValueError, match="unknown turn source"):
        config.with_turns("hint")
    core, variants, where = config.core_config()
    assert core["slo"] == defaults["slo"] and variants == [] and where == [(0, 0), (0, 1)]
    assert defaults["slo"]["tbt_tail_s"] is None is config.slos[0].tbt_tail_s
    # A tail-TBT bound is scored as its own SLO variant of the same run.
    tailed = replace(config, slos=(*config.slos, replace(config.slos[0], tbt_tail_s=0.2)))
    core, variants, where = tailed.core_config()
    assert core["slo"]["tbt_tail_s"] is None and where == [(0, 0), (0, 1), (1, 0)]
    assert variants == [{**defaults["slo"], "tpot_s": [0.1], "tbt_tail_s": 0.2}]


def test_tier_paths_come_from_the_engine_and_each_runs(weka_trace: TraceWriter) -> None:
    assert tuple(sim_tier_paths()) == TIER_PATHS
    defaults = sim_config_defaults()["global_tier"]
    assert defaults["path"] == TIER_PATHS[0] == "lmcache" and defaults["layerwise"] is False
    assert defaults["bandwidth_bytes_per_s"] is None
    assert MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK == 4 << 30
    w = load_workload(weka_trace(), "weka")
    fetched = {}
    for path in TIER_PATHS:
        report = simulate(w, "round_robin", config={"instances": 2, "global_tier": {"path": path}})
        fetched[path] = report["tier_fetch_bytes"]
    # Round robin sends each follow-up to the other instance: a shared store serves it there;
    # the offloading connector's store is the other engine's own and serves nothing
    # (perf-model §6.4; the same-instance reload is anchor 3 in rust/smetric-sim/tests/anchors.rs).
    assert fetched["lmcache"] > 0 and fetched["mooncake-store"] > 0, fetched
    assert fetched["cpu-offload"] == 0, fetched
    layerwise = {"instances": 2, "global_tier": {"path": "lmcache", "layerwise": True}}
    assert simulate(w, "round_robin", config=layerwise)["completed"] > 0
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"global_tier": {"path": "nixl"}})
    assert err.value.field == "global_tier.path" and "lmcache, mooncake-store, cpu-offload" in err.value.reason
    with pytest.raises(InvalidConfigError) as err:
        simulate(w, "smetric", config={"global_tier": {"path": "cpu-offload", "layerwise": True}})
    assert err.value.field == "global_tier.layerwise"
    config = SimulationConfig().with_tier_path("mooncake-store")
    assert config.core_config()[0]["global_tier"]["path"] == "mooncake-store"
    with pytest.raises(ValueError, match="layer-wise"):
        SimulationConfig().with_tier_path("cpu-offload", layerwise=True)


def test_event_fed_run_reports_its_feed(weka_trace: TraceWriter) -> None:
    w = load_workload(weka_trace(), "weka")
    config: dict[str, Any] = {"instances": 2, "session_rate_per_s": 0.5}
    plain = simulate(w, "smetric", config=config)
    assert plain["index_feed"] == "approximate" and plain["feed_counters"] == {}
    fed = simulate(w, "smetric", config={**config, "index_feed": "events", "event_delay_s": 0.05})
    counters = fed["feed_counters"]
    assert fed["index_feed"] == "events" and fed["event_delay_s"] == 0.05
    assert counters["published_batches"] == counters["ingest_batches"] > 0
    assert counters["published_events"] == counters["ingest_events"]
    assert counters["ingest_decode_errors"] == counters["ingest_unmapped_hashes"] == 0
    oracle = simulate(w, "smetric", config={**config, "index_feed": "oracle"})
    assert oracle["completed"] == fed["completed"] == plain["completed"]
    # On this tiny trace (no eviction, think times ≫ 50 ms) the oracle predicts every hit, and
    # events 50 ms late still arrive before the next turn: both without error.
    for exact in (oracle, fed):
        assert (exact["local_hit_prediction_error"], exact["local_hit_overpredicted_share"]) == (0.0, 0.0)
    # Events 5 s late miss the previous turn's blocks: the router under-predicts, never over;
    # so Σ|predicted − actual| ≤ Σ actual, i.e. the error is at most the local hit ratio.
    late = simulate(w, "smetric", config={**config, "index_feed": "events", "event_delay_s": 5.0})
    assert late["local_hit_overpredicted_share"] == 0.0
    assert 0.0 < late["local_hit_prediction_error"] <= late["local_hit_ratio"]


def test_report_fields_series_records_and_slo_variants(weka_trace: TraceWriter) -> None:
    w = load_workload(weka_trace(), "weka")
    config: dict[str, Any] = {"instances": 2, "session_rate_per_s": 0.5, "series_interval_s": 5.0, "keep_records": True}
    same = {"ttft_base_s": 2.0, "ttft_s_per_token": 1e-4, "tpot_s": [0.1]}
    none = {"ttft_base_s": 0.0, "ttft_s_per_token": 0.0}
    report = simulate(w, "least_load", config=config, slo_variants=[same, none])
    assert report["slo_variants"][0][0] == report["slo"][0]
    assert report["slo_variants"][1][0]["met"] == 0
    assert len(report["slo_variants"][1]) == 2, "an omitted key keeps the run's value"
    series = report["load_series"]
    assert series["instances"] == 2 and len(series["time_s"]) == len(series["requests"]) > 1
    assert all(len(row) == 2 for row in series["requests"])
    records = report["records"]
    assert len(records["ttft_s"]) == len(w) and all(t is not None and t > 0 for t in records["ttft_s"])
    assert report["followup_home_share"] is not None and report["turn_inference_accuracy"] is not None
    for key in ("tps_under_slo", "output_tps_under_slo", "attainment", "ttft_attainment", "tpot_attainment"):
        assert key in report["slo"][0]
    assert "records" not in simulate(w, "least_load", config={"instances": 2}), "records only on request"


def test_router_config_reaches_the_policy(weka_trace: TraceWriter) -> None:
    w = load_workload(weka_trace(), "weka")
    base = simulate(w, "cache_first", config={"instances": 4})
    max_hit = simulate(w, "cache_first", config={"instances": 4}, router=RouterConfig(cache_first_mode="max_hit"))
    assert set(base["reasons"]) == {"cache-first: weighted"}
    assert set(max_hit["reasons"]) == {"cache-first: max-hit"}


def test_replicate(weka_trace: TraceWriter, trace_of: Callable[[str], Path]) -> None:
    w = load_workload(weka_trace(), "weka")
    r = w.replicate(3, seed=1)
    assert (len(r), r.root_sessions, r.sessions) == (3 * len(w), 3 * w.root_sessions, 3 * w.sessions)
    assert r.total_hash_ids == 3 * w.total_hash_ids
    with pytest.raises(InvalidConfigError):
        w.replicate(0)
    with pytest.raises(InvalidConfigError):
        load_workload(trace_of("azure"), "azure").replicate(2)


def test_errors_survive_pickling(tmp_path: Path) -> None:
    """Sweeps run in worker processes: their errors must cross the pool with their attributes."""
    import pickle

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(TraceFormatError) as err:
        load_workload(bad, "azure")
    again = pickle.loads(pickle.dumps(err.value))
    assert type(again) is TraceFormatError and (again.path, again.line) == (err.value.path, 1)
    assert str(again) == str(err.value)
