"""The reproduction's plans as simulator traces (``scripts/calibrate_repro.py``, perf-model §8) and
the reproduction's router arms on a Bailian-format trace through ``smetric simulate``.

The plans come from ``docs/results-data/repro/`` (committed excerpts of the public reproduction,
with provenance); only the fitting set (po127, pd64) is read here, never the po64 validation set's
outcomes.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from smetric._core import load_workload
from smetric.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import calibrate_repro as cr  # noqa: E402

ARMS = "vllm_router_smetric,rendezvous_hash,consistent_hash,power_of_two,vllm_router_cache_aware"


def first_sessions(name: str, sessions: int) -> list[dict[str, str]]:
    with (cr.DATA / f"{name}_requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    keep = sorted({r["session_id"] for r in rows})[:sessions]
    return [r for r in rows if r["session_id"] in keep]


def test_a_plan_warms_up_running_sessions_and_extends_each_chain(tmp_path: Path) -> None:
    rows = first_sessions("po127", 12)
    plan = cr.build_plan("po127", rows, None)
    measured = [q for q in plan.requests if q.measured]
    assert len(measured) == len(rows)
    # A session first seen at turn t > 1 gets turns 1 … t − 1 in the warm-up, before its first row.
    for session in {q.session for q in measured}:
        turns = sorted((q for q in plan.requests if q.session == session), key=lambda q: q.turn)
        first = min((q for q in turns if q.measured), key=lambda q: q.turn)
        warm = [q for q in turns if not q.measured]
        assert [q.turn for q in warm] == list(range(1, first.turn))
        assert all(0 <= q.dispatch_s < first.dispatch_s and q.input_tokens <= first.input_tokens for q in warm)
    trace = tmp_path / "po.jsonl"
    requests = cr.write_bailian(plan, trace)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == len(requests)
    by_chat = {r["chat_id"]: r for r in lines}
    shared = cr.SHARED_START_TOKENS // cr.BLOCK_TOKENS
    for r in lines:
        parent = by_chat.get(r["parent_chat_id"])
        if parent is not None:
            # A follow-up re-sends its history: the parent's chain is a prefix of its own.
            n = min(len(parent["hash_ids"]), len(r["hash_ids"]))
            assert r["hash_ids"][:n] == parent["hash_ids"][:n]
        assert r["hash_ids"][:shared] == lines[0]["hash_ids"][:shared]
    workload = load_workload([str(trace)], "bailian", gate_on_parent=True)
    assert len(workload) == len(lines)


def test_outcomes_score_prefill_only_runs_as_the_reproduction_does(tmp_path: Path) -> None:
    rows = first_sessions("po127", 6)
    plan = cr.build_plan("po127", rows, None)
    trace = tmp_path / "po.jsonl"
    cr.write_bailian(plan, trace)
    real = cr.real_outcomes(cr.DATA / "summary.csv", "po127")
    assert set(real) >= set(cr.ARMS)
    got = cr.simulate_plan(plan, trace, "rendezvous_hash", cr.Engine(**cr.engine_settings()), prefill_only=True)
    assert got["requests"] == len(rows)
    assert 0 < got["ttft_s.p50"] <= got["ttft_s.p90"] <= got["ttft_s.p99"]
    # Goodput counts the prompt tokens of passing requests over the 600 s window.
    assert got["goodput_ktok_s"] <= sum(int(r["input_tokens"]) for r in rows) / 600 / 1e3
    assert 0.0 <= got["passing_pct"] <= 100.0


def test_spearman_and_loss() -> None:
    assert cr.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert cr.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    real = {"a": {"ttft_s.p50": 2.0}}
    assert cr.loss({"a": {"ttft_s.p50": 2.0}}, real, ("ttft_s.p50",)) == 0.0
    assert cr.loss({"a": {"ttft_s.p50": 4.0}}, real, ("ttft_s.p50",)) == pytest.approx(0.4805, abs=1e-3)


def test_the_reproductions_arms_run_on_a_bailian_trace_with_the_h20_3e_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = cr.build_plan("po127", first_sessions("po127", 8), None)
    trace = tmp_path / "repro_bailian.jsonl"
    cr.write_bailian(plan, trace)
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(trace), "--format", "bailian", "--instances", "4"]
    argv += ["--profile", "h20-3e-qwen3-coder-30b-a3b", "--policies", ARMS, "--ladder", "1", "--index-feeds", ""]
    argv += ["--jobs", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    text = json.dumps(results)
    for arm in ARMS.split(","):
        assert arm in text


def test_the_envelope_takes_fast_small_follow_ups_per_length_bin() -> None:
    requests = [cr.Request("s", 1, 0.0, 20_000, 1, True)]
    ttft: list[float | None] = [9.0]
    for k in range(2, 13):
        requests.append(cr.Request("s", k, float(k), 20_000 + 100 * k, 1, True))  # +100 tokens a turn
        ttft.append(0.1 * k)
    requests.append(cr.Request("s", 13, 13.0, 25_000, 1, True))  # appends 3,700: not in the envelope
    ttft.append(0.01)
    got = cr.envelope(requests, ttft)
    assert set(got) == {"envelope_p10.10K"}
    # The 11 small follow-ups' TTFTs are 0.2 … 1.2 s; their 10th percentile is 0.3 s.
    assert got["envelope_p10.10K"] == pytest.approx(0.3)
    assert cr.real_envelope(first_sessions("po127", 60))


def test_every_excerpt_matches_the_checksum_its_provenance_states() -> None:
    import hashlib
    import re

    text = (cr.DATA / "PROVENANCE.md").read_text()
    stated = dict(re.findall(r"\| `([\w.]+\.(?:csv|json))` \|[^|]*\|[^|]*\| `([0-9a-f]{64})` \|", text))
    assert {"summary.csv", "po127_requests.csv", "pd64_requests.csv", "po64_plan.csv"} <= set(stated)
    for name, digest in stated.items():
        assert hashlib.sha256((cr.DATA / name).read_bytes()).hexdigest() == digest, name
