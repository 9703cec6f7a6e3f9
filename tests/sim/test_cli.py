"""``smetric simulate`` / ``smetric sweep`` smoke tests on a tiny trace, and the shipped excerpt."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from smetric.cli import main
from smetric.sim import load_workload
from smetric.sim.config import EMBEDDED_TRACE, embedded_trace_path

TraceWriter = Callable[..., Path]
TINY = ["--instances", "2", "--duration-s", "300", "--warmup-s", "30", "--jobs", "2", "--no-progress"]


def test_simulate_writes_table_results_and_plots(
    weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "least_load,smetric,cache_first_max_hit"]
    assert main([*argv, *TINY, "--load", "0.05", "--ladder", "1,2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "SLO (headline): TTFT≤2s+0.1ms/tok TPOT≤100ms" in table
    assert "TPOT≤50ms" in table and "smetric" in table and "peak TPS<=SLO" in table
    # The default beside the best baseline, with the ratio (and, below x1.00, why).
    verdict = next(line for line in table.splitlines() if line.startswith("smetric: peak "))
    assert "the best baseline (" in verdict and (" = x1." in verdict or "why not: at load " in verdict)
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["least_load", "smetric", "cache_first_max_hit"]
    for entry in results.values():
        for key in ("tps_under_slo", "slo_attainment", "follow_up_return", "local_hit_ratio", "global_hit_ratio"):
            assert isinstance(entry[key], float), key
        assert entry["load"] == 0.05 and entry["slo"].startswith("TTFT≤")
        assert [s["tpot_s"] for s in entry["by_slo"]] == [0.1, 0.05]
        assert entry["sweep"]["loads"] == [0.05, 0.1]
    run = json.loads((out / "run.json").read_text())
    assert run["trace"]["format"] == "weka" and run["config"]["instances"] == 2
    for png in ("tps_vs_load.png", "ttft_cdf.png", "load_over_time.png", "index_feeds.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # smetric (the default --feed-policies) also ran with its index fed by KV events and by the oracle.
    assert "index feeds (same policy, load and seed" in table and "events (10 ms)" in table
    feeds = json.loads((out / "index_feeds.json").read_text())
    assert [(f["policy"], f["index_feed"]) for f in feeds] == [
        ("smetric", "approximate"), ("smetric", "events"), ("smetric", "oracle")
    ]  # fmt: skip
    assert feeds[0] | {"index_feed": None} != feeds[1] | {"index_feed": None}
    assert feeds[0]["tps_under_slo"] == results["smetric"]["tps_under_slo"]
    assert feeds[1]["kv_event_batches"] > 0 and feeds[1]["kv_event_unmapped_hashes"] == 0
    assert feeds[0]["kv_event_batches"] == feeds[2]["kv_event_batches"] == 0
    assert all(isinstance(f["by_slo"][1]["tps_under_slo"], float) for f in feeds)


def test_simulate_index_feed_options(
    weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "lmetric", "--ladder", "1", *TINY]
    assert main([*argv, "--feed-policies", "lmetric", "--index-feeds", "approximate,events",
                 "--event-delay-ms", "250", "--out", str(tmp_path / "a")]) == 0  # fmt: skip
    assert "events (250 ms)" in capsys.readouterr().out
    feeds = json.loads((tmp_path / "a" / "index_feeds.json").read_text())
    assert [(f["index_feed"], f["event_delay_s"]) for f in feeds] == [("approximate", 0.01), ("events", 0.25)]
    assert main([*argv, "--feed-policies", "", "--out", str(tmp_path / "b")]) == 0
    assert not (tmp_path / "b" / "index_feeds.json").exists()
    for bad in (["--index-feeds", "exact"], ["--event-delay-ms", "-1"]):
        with pytest.raises(SystemExit) as err:
            main([*argv, *bad, "--out", str(tmp_path / "c")])
        assert err.value.code == 2


def test_simulate_turn_sources(weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "smetric", "--ladder", "1", "--feed-policies", ""]
    runs = {}
    for turns in ("request", "index"):
        assert main([*argv, *TINY, "--turns", turns, "--out", str(tmp_path / turns)]) == 0
        assert f"turns from {turns}" in capsys.readouterr().out
        runs[turns] = json.loads((tmp_path / turns / "results.json").read_text())["smetric"]
        assert runs[turns]["turns"] == turns
        assert json.loads((tmp_path / turns / "run.json").read_text())["config"]["turns"] == turns
    assert runs["request"]["turn_inference_accuracy"] == 1.0  # the hint is the trace's truth
    with pytest.raises(SystemExit) as err:
        main([*argv, "--turns", "messages", "--out", str(tmp_path / "bad")])
    assert err.value.code == 2


def test_simulate_tail_tbt_slo(weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "lpwl", "--ladder", "1", "--feed-policies", ""]
    assert main([*argv, *TINY, "--tbt-tail-ms", "150", "--out", str(tmp_path / "a")]) == 0
    assert "SLO (also):     TTFT≤2s+0.1ms/tok TPOT≤100ms TBTtail≤150ms" in capsys.readouterr().out
    entry = json.loads((tmp_path / "a" / "results.json").read_text())["lpwl"]
    assert isinstance(entry["output_tps_under_slo"], float) and isinstance(entry["tbt_tail_p90_ms"], float)
    assert entry["tbt_tail_p90_ms"] >= 1e3 * entry["tpot_p90_s"] * (1 - 1e-6)
    head, tight, tail = entry["by_slo"]
    assert (head["tbt_tail_s"], tight["tbt_tail_s"], tail["tbt_tail_s"]) == (None, None, 0.15)
    assert tail["met"] <= head["met"] and tail["output_tps_under_slo"] <= head["output_tps_under_slo"]
    with pytest.raises(SystemExit) as err:
        main([*argv, "--tbt-tail-ms", "0", "--out", str(tmp_path / "b")])
    assert err.value.code == 2


def test_sweep_grid_and_tiers(weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", "--trace", str(weka_trace()), "--policies", "lmetric,smetric", "--loads", "0.03,0.06"]
    assert main([*argv, *TINY, "--seeds", "0,1", "--tier", "both", "--out", str(out)]) == 0
    assert "max load, attain>=90%" in capsys.readouterr().out
    sweep = json.loads((out / "sweep.json").read_text())
    assert len(sweep["runs"]) == 2 * 2 * 2 * 2
    assert {(p["policy"], p["tier"]) for p in sweep["summaries"][0]["policies"]} == {
        ("lmetric", True), ("lmetric", False), ("smetric", True), ("smetric", False)
    }  # fmt: skip
    assert (out / "tps_vs_load_slo0.png").exists()


def test_simulate_tier_path_options(
    weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "lmetric", "--ladder", "1", *TINY]
    assert main([*argv, "--tier-path", "cpu-offload", "--feed-policies", "", "--out", str(tmp_path / "a")]) == 0
    assert "global tier on (cpu-offload)" in capsys.readouterr().err
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["config"]["global_tier"]["path"] == "cpu-offload"
    assert main([*argv, "--layerwise", "--feed-policies", "", "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["config"]["global_tier"]["layerwise"] is True
    for bad in (["--tier-path", "nixl"], ["--tier-path", "mooncake-store", "--layerwise"]):
        with pytest.raises(SystemExit) as err:
            main([*argv, *bad, "--out", str(tmp_path / "c")])
        assert err.value.code == 2


def test_router_replicas_options(weka_trace: TraceWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "least_load", *TINY, "--ladder", "1"]
    argv += ["--feed-policies", ""]
    runs = {}
    for extra in ([], ["--router-replicas", "3"], ["--router-replicas", "3", "--replica-sync", "bus"]):
        out = tmp_path / f"r{len(runs)}"
        assert main([*argv, *extra, "--out", str(out)]) == 0
        err = capsys.readouterr().err
        runs[" ".join(extra)] = json.loads((out / "results.json").read_text())["least_load"]
        config = json.loads((out / "run.json").read_text())["config"]
        assert config["router_replicas"] == (3 if extra else 1)
        assert config["replica_sync"] == ("bus" if "bus" in extra else "off")
        assert ("3 router replicas" in err) == bool(extra)
    # Three blind replicas place differently from one router (and from three synced ones).
    assert runs[""] != runs["--router-replicas 3"] != runs["--router-replicas 3 --replica-sync bus"]
    for bad in (["--router-replicas", "0"], ["--replica-sync-delay-ms", "-1"], ["--replica-sync", "nats"]):
        with pytest.raises(SystemExit) as err_:
            main([*argv, *bad, "--out", str(tmp_path / "bad")])
        assert err_.value.code == 2


def test_session_admission_option(weka_trace: TraceWriter, tmp_path: Path) -> None:
    argv = ["simulate", "--trace", str(weka_trace()), "--policies", "smetric", *TINY, "--ladder", "1"]
    argv += ["--feed-policies", ""]
    for mode in ("off", "pause", "smetric"):
        out = tmp_path / mode
        assert main([*argv, "--session-admission", mode, "--out", str(out)]) == 0
        config = json.loads((out / "run.json").read_text())["config"]
        # Off describes the run as it was before the stage existed.
        assert config.get("session_admission", "off") == mode
        assert ("session_admission" in config) == (mode != "off")
    for bad in (["--session-admission", "thunder"], ["--session-admission", "pause", "--router-replicas", "2"]):
        with pytest.raises(SystemExit) as err:
            main([*argv, *bad, "--out", str(tmp_path / "bad")])
        assert err.value.code == 2


def test_bad_arguments_fail_cleanly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        main(["simulate", "--policies", "nope", "--out", str(tmp_path)])
    odd = tmp_path / "trace.jsonl"
    odd.write_text("{}\n")
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(odd), "--out", str(tmp_path)])


def test_embedded_excerpt_and_licence_ship_in_the_package() -> None:
    data = resources.files("smetric") / "data"
    assert (data / EMBEDDED_TRACE).is_file()
    licence = (data / "LICENSE-weka-excerpt.txt").read_text()
    assert "Apache License" in licence and "kv-cache-tester" in licence and "Callan Fox" in licence
    path = embedded_trace_path()
    with gzip.open(path, "rt") as fh:
        first = json.loads(fh.readline())
    assert first["root_session_id"].startswith("weka-")
    w = load_workload(path, "weka")
    assert (len(w), w.root_sessions) == (1039, 20)


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_help_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse %-formats help strings: a bare `%` in one (e.g. a formatted percentage) breaks --help."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "--codex-seed" in capsys.readouterr().out
