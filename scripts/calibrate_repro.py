"""Calibrates the simulator's engine model on the SMetric authors' public reproduction
(``docs/perf-model.md`` §8; issue 30).

    .venv/bin/python scripts/calibrate_repro.py --fit                 # grid search on po127 + pd64, writes the profile
    .venv/bin/python scripts/calibrate_repro.py --report              # real vs simulated, before and after the fit
    .venv/bin/python scripts/calibrate_repro.py --validate            # po64, once, with the frozen profile

The reproduction (``clateral912/smetric-router-repro``: 8 × H20-3e, vLLM 0.18.1,
Qwen3-Coder-30B-A3B BF16, LMCache over Mooncake, vllm-router arms) publishes per-request
outcomes; ``docs/results-data/repro/`` holds the excerpts this script reads, with their
provenance and checksums. po64 is the validation set: only ``--validate`` reads its files.

How a plan becomes a simulator trace (:func:`build_plan`): one request per row of one arm's
run, its session's block chain growing turn by turn (each turn re-sends its history), the first
:data:`SHARED_START_TOKENS` tokens shared by every session; sessions already running when the
measurement window opened get their earlier turns synthesised in the warm-up (:func:`warm_up`);
arrivals replay the recorded dispatch offsets, each gated on its previous turn's completion
(Bailian format with ``gate_on_parent``). What is measured (:func:`outcomes`): the requests
dispatched in the window, scored with the reproduction's own budgets.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, product
from pathlib import Path
from typing import Any

from smetric._core import load_workload, sim_profile, simulate
from smetric.sim.config import GlobalTier, SimulationConfig, policy_router

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results-data" / "repro"
PROFILES = ROOT / "docs" / "profiles"
CALIBRATED = PROFILES / "h20-3e-calibrated.json"
TRANSFERS = {"h20-calibrated": "h20-qwen3-coder-30b-a3b", "h20-fp8-calibrated": "h20-qwen3-coder-30b-a3b-fp8"}
"""The fit carried over to the H20 (96 GB) profiles the paper's setup and results §16 use."""
OUT = ROOT / "docs" / "results-data" / "calibration.json"

BLOCK_TOKENS = 16
"""Bailian-format block size: the trace's chains are in 16-token blocks, vLLM's default."""
SHARED_START_TOKENS = 902
"""Tokens every Codex trial shares at its start (the Codex trace statistics, ``docs/codex-workload.md``)."""
WINDOW_S = (300.0, 900.0)
"""The reproduction's measurement window: dispatches in ``[300, 900)`` s after a 300 s warm-up."""
INSTANCES = 8
BASE_PROFILE = "h20-3e-qwen3-coder-30b-a3b"

CHARS_PER_TOKEN = 4.0
"""The authors' SMetric arms count characters; their constants are converted at this ratio."""
_AUTHORS_SMETRIC: dict[str, Any] = {
    # configs/smetric/*.yaml as docs/results-data/repro/engine.json records them: work
    # C_LIN·n + C_ATT·n·(L − n/2) in characters with C_LIN 1, C_ATT 1e-4 (L_EQ 10,000 characters),
    # HIT_RATIO 0.1, TTFT budget 0.2 s + 1e-4 s per character, PREFILL_RATE 10,000 work/s (fixed).
    "min_local_hit_ratio": 0.1,
    "smetric_l_eq_tokens": 1.0 / 1e-4 / CHARS_PER_TOKEN,
    "smetric_ttft_base_s": 0.2,
    "smetric_ttft_s_per_token": 1e-4 * CHARS_PER_TOKEN,
}
_FIXED_RATE = {"smetric_drain_rate": 10_000.0 / CHARS_PER_TOKEN}

ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "smetric_default": ("vllm_router_smetric", {**_AUTHORS_SMETRIC, **_FIXED_RATE, "smetric_ttft_slack": 1.0}),
    "smetric_initial": ("vllm_router_smetric", {**_AUTHORS_SMETRIC, "smetric_ttft_slack": 1.0}),
    "smetric_po_tuned": ("vllm_router_smetric", {**_AUTHORS_SMETRIC, "smetric_ttft_slack": 0.5}),
    "smetric_pd_tuned": ("vllm_router_smetric", {**_AUTHORS_SMETRIC, "smetric_ttft_slack": 0.15}),
    "smetric_pd_slack025": ("vllm_router_smetric", {**_AUTHORS_SMETRIC, "smetric_ttft_slack": 0.25}),
    # The reproduction passes only --balance-abs-threshold 32; the rest are vllm-router's defaults.
    "cache_aware": ("vllm_router_cache_aware", {"cache_aware_balance_abs_threshold": 32}),
    "power_of_two": ("power_of_two", {}),
    "consistent_hash": ("consistent_hash", {}),
    "rendezvous_hash": ("rendezvous_hash", {}),
}
"""Each real arm (the reproduction's case name) → the simulator's policy and router fields."""


@dataclass(frozen=True)
class Request:
    """One request of a plan."""

    session: str
    turn: int
    dispatch_s: float
    input_tokens: int
    output_tokens: int
    measured: bool


@dataclass
class Plan:
    """A reconstructed run: requests in dispatch order."""

    name: str
    requests: list[Request] = field(default_factory=list)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def build_plan(name: str, rows: Iterable[dict[str, str]], output_column: str | None) -> Plan:
    """The measured requests of one arm's run, plus synthesised warm-up turns."""
    measured = [
        Request(
            session=r["session_id"],
            turn=int(r["turn_id"]),
            dispatch_s=float(r["dispatch_offset_s"]),
            input_tokens=int(r["input_tokens"]),
            output_tokens=max(1, int(float(r[output_column]))) if output_column else 1,
            measured=True,
        )
        for r in rows
    ]
    plan = Plan(name, sorted([*measured, *warm_up(measured)], key=lambda q: (q.dispatch_s, q.session, q.turn)))
    return plan


def warm_up(measured: Sequence[Request]) -> list[Request]:
    """Earlier turns of the sessions that were already running when the window opened.

    The real run's warm-up (``[0, 300)`` s) issued them; the published rows start at the window.
    A session whose first measured turn is ``t > 1`` gets turns ``1 … t − 1`` with prompts
    interpolated from the median first-turn prompt to its first measured prompt, spaced at the
    session's own median dispatch gap (compressed into the warm-up if they would start before 0).
    """
    by_session: dict[str, list[Request]] = defaultdict(list)
    for q in measured:
        by_session[q.session].append(q)
    firsts = [q.input_tokens for q in measured if q.turn == 1] or [13_000]
    first_prompt = int(statistics.median(firsts))
    gaps = [
        b.dispatch_s - a.dispatch_s
        for qs in by_session.values()
        for a, b in zip(sorted(qs, key=lambda q: q.turn), sorted(qs, key=lambda q: q.turn)[1:], strict=False)
        if b.turn == a.turn + 1
    ]
    default_gap = statistics.median(gaps) if gaps else 10.0
    out: list[Request] = []
    for session, qs in by_session.items():
        qs.sort(key=lambda q: q.turn)
        head = qs[0]
        if head.turn <= 1:
            continue
        own = [b.dispatch_s - a.dispatch_s for a, b in pairwise(qs) if b.turn == a.turn + 1]
        gap = statistics.median(own) if own else default_gap
        earlier = head.turn - 1
        start = head.dispatch_s - earlier * gap
        if start < 0:
            gap = head.dispatch_s / (earlier + 1)
            start = gap
        for k in range(1, head.turn):
            share = (k - 1) / max(head.turn - 1, 1)
            tokens = int(first_prompt + share * (head.input_tokens - first_prompt))
            out.append(
                Request(
                    session=session,
                    turn=k,
                    dispatch_s=start + (k - 1) * gap,
                    input_tokens=min(tokens, head.input_tokens),
                    output_tokens=1,
                    measured=False,
                )
            )
    return out


def _block_id(session: str, index: int) -> int:
    digest = hashlib.blake2b(f"{session}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def write_bailian(plan: Plan, path: Path) -> list[Request]:
    """Writes ``plan`` as a Bailian-format trace; returns the requests in file (chat_id) order."""
    shared = SHARED_START_TOKENS // BLOCK_TOKENS
    previous: dict[str, int] = {}
    with path.open("w") as f:
        for chat_id, q in enumerate(plan.requests):
            blocks = q.input_tokens // BLOCK_TOKENS
            ids = [_block_id("shared", j) if j < shared else _block_id(q.session, j) for j in range(blocks)]
            parent = previous.get(q.session, -1)
            row = {
                "chat_id": chat_id,
                "parent_chat_id": parent,
                "timestamp": q.dispatch_s,
                "input_length": q.input_tokens,
                "output_length": q.output_tokens,
                "turn": q.turn,
                "hash_ids": ids,
            }
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            previous[q.session] = chat_id
    return plan.requests


@dataclass(frozen=True)
class Engine:
    """What the simulated cluster is: profile, overrides and the engines' settings."""

    profile: str = BASE_PROFILE
    overrides: tuple[tuple[str, float], ...] = ()
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    kv_capacity_tokens: int | None = None

    def config(self) -> SimulationConfig:
        fields: dict[str, Any] = {
            "instances": INSTANCES,
            "profile": self.profile,
            "index_feed": "approximate",
            # The replayer generates placeholder answers (ignore_eos, the recorded length) while
            # the next turn re-sends the trace's own answer: no answer block is ever re-hit.
            "answer_rerender_share": 0.0,
        }
        if self.max_num_batched_tokens:
            fields["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs:
            fields["max_num_seqs"] = self.max_num_seqs
        if self.kv_capacity_tokens:
            fields["kv_capacity_tokens"] = self.kv_capacity_tokens
        if self.overrides:
            fields["profile_overrides"] = dict(self.overrides)
        return SimulationConfig(**fields, global_tier=GlobalTier())


def simulate_plan(plan: Plan, trace: Path, arm: str, engine: Engine, prefill_only: bool) -> dict[str, float]:
    """Runs one arm on one plan; returns its outcomes (:func:`outcomes`)."""
    requests = plan.requests
    workload = load_workload([str(trace)], "bailian", gate_on_parent=True)
    policy_name, fields = ARMS[arm]
    sim = engine.config()
    if fields:
        sim = sim.with_router(**fields)
    config, variants, _ = sim.core_config()
    config.update({"time_scale": 1.0, "measure_start_s": 0.0, "measure_end_s": None, "keep_records": True, "seed": 0})
    policy, router = policy_router(policy_name, sim.router_config())
    report = simulate(workload, policy, config=config, router=router, slo_variants=variants)
    return outcomes(requests, report["records"], prefill_only)


def outcomes(requests: Sequence[Request], records: dict[str, Any], prefill_only: bool) -> dict[str, float]:
    """TTFT / TPOT percentiles, pass rate and goodput of the measured requests, scored as the
    reproduction scores them: prefill-only ``latency ≤ 1 + in/16000`` (goodput: prompt tokens of
    passing requests per second of window); co-located ``latency ≤ 1 + in/16000 + 0.020·out``
    (goodput: output tokens)."""
    ttft: list[float] = []
    tpot: list[float] = []
    passing = 0
    good_tokens = 0
    total = 0
    for i, q in enumerate(requests):
        if not (q.measured and WINDOW_S[0] <= q.dispatch_s < WINDOW_S[1]):
            continue
        total += 1
        t, finish, arrival = records["ttft_s"][i], records["finish_s"][i], records["arrival_s"][i]
        if t is None or finish is None:
            continue
        ttft.append(t)
        # The real latency runs from dispatch; a gated arrival can only be later than it.
        latency = finish - min(arrival, q.dispatch_s) if arrival is not None else math.inf
        out = q.output_tokens
        if not prefill_only and records["tpot_s"][i] is not None:
            tpot.append(1e3 * records["tpot_s"][i])
        budget = 1.0 + q.input_tokens / 16_000 + (0.0 if prefill_only else 0.020 * out)
        if latency <= budget:
            passing += 1
            good_tokens += q.input_tokens if prefill_only else out
    span = WINDOW_S[1] - WINDOW_S[0]
    result = {
        "requests": float(total),
        "passing_pct": 100.0 * passing / total if total else 0.0,
        "goodput_ktok_s": good_tokens / span / 1e3,
        **{f"ttft_s.p{p}": _pct(ttft, p) for p in (50, 90, 99)},
    }
    if not prefill_only:
        result.update({f"tpot_ms.p{p}": _pct(tpot, p) for p in (50, 90)})
    else:
        result.update(envelope(requests, records["ttft_s"]))
    return result


ENVELOPE_MAX_NEW_TOKENS = 600
"""Follow-ups appending fewer tokens than this are nearly free to prefill: their fastest TTFTs
show the per-request overhead with nothing queued."""
ENVELOPE_BINS = (10_000, 30_000, 50_000, 70_000, 90_000, 110_000, 160_000)
"""Prompt-length bins of the envelope (tokens)."""


def envelope(requests: Sequence[Request], ttft: Sequence[float | None]) -> dict[str, float]:
    """Per prompt-length bin: the 10th percentile TTFT of the measured follow-ups that append
    fewer than :data:`ENVELOPE_MAX_NEW_TOKENS` tokens to their previous turn (``ttft`` per request)."""
    previous: dict[str, int] = {}
    bins: dict[int, list[float]] = defaultdict(list)
    for q, t in zip(requests, ttft, strict=True):
        last = previous.get(q.session)
        previous[q.session] = q.input_tokens
        if not q.measured or last is None or t is None or not 0 <= q.input_tokens - last < ENVELOPE_MAX_NEW_TOKENS:
            continue
        for lo, hi in pairwise(ENVELOPE_BINS):
            if lo <= q.input_tokens < hi:
                bins[lo].append(t)
    return {f"envelope_p10.{lo // 1000}K": _pct(v, 10) for lo, v in sorted(bins.items()) if len(v) >= 10}


def real_envelope(rows: Sequence[dict[str, str]]) -> dict[str, float]:
    """:func:`envelope` of a real run's rows (their own TTFTs)."""
    plan = build_plan("real", rows, None)
    by_key = {(r["session_id"], int(r["turn_id"])): float(r["ttft_s"]) for r in rows}
    return envelope(plan.requests, [by_key.get((q.session, q.turn)) if q.measured else None for q in plan.requests])


def _pct(values: list[float], p: int) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


PLAN_ARM = "smetric_default"
"""The arm whose repeat-1 rows the plans are rebuilt from."""


def real_outcomes(summary: Path, scenario: str) -> dict[str, dict[str, float]]:
    """Per arm: the mean over the three repeats of each metric in the reproduction's summary."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for r in read_csv(summary):
        if r["scenario"] == scenario and r["mean"]:
            out[r["case"]][r["metric"]] = float(r["mean"])
    return dict(out)


# --- the fit, the report and the validation ------------------------------------------------------------

PREFILL_SCALES = (0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5)
"""Grid of the prefill-speed scale ``s`` (× ``linear_s_per_token`` and × ``attention_s_per_pair``)."""
FRONTEND_US_PER_TOKEN = (0.95, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 16.0, 20.0, 25.0)
"""Grid of the per-request overhead per prompt token, µs (``frontend_s_per_token``; 0.95 is the
profile's). Added to the protocol after the first fit (perf-model §8.2): uncontended follow-ups
of po127 take 0.4 s at 20K tokens and 1.0 s at 80K even with a few hundred new tokens."""
KV_READ_EFFICIENCIES = (0.35, 0.5, 0.65, 0.8, 0.95)
"""Grid of ``η_kv``."""
STEP_OVERHEADS_MS = (2.0, 3.0, 4.2, 5.4, 7.0, 9.0)
"""Grid of ``t_fix``, milliseconds."""


@dataclass(frozen=True)
class Scenario:
    """One of the reproduction's runs, ready to simulate."""

    name: str
    plan: Plan
    trace: Path
    prefill_only: bool
    real: dict[str, dict[str, float]]


def scenario(name: str, requests_csv: Path, summary_csv: Path, workdir: Path) -> Scenario:
    prefill_only = name.startswith("po")
    output = None if prefill_only else "actual_output_tokens"
    rows = read_csv(requests_csv)
    plan = build_plan(name, rows, output)
    trace = workdir / f"{name}.jsonl"
    write_bailian(plan, trace)
    real = real_outcomes(summary_csv, name)
    if prefill_only:
        real[PLAN_ARM].update(real_envelope(rows))
    return Scenario(name, plan, trace, prefill_only, real)


def base_constants(profile: str = BASE_PROFILE) -> dict[str, float]:
    """The profile's own constants that the fit scales or replaces."""
    p = sim_profile(profile)
    return {
        k: float(p[k]) for k in ("linear_s_per_token", "attention_s_per_pair", "kv_read_efficiency", "step_overhead_s")
    }


def overrides(
    base: dict[str, float], scale: float, kv_eff: float, step_ms: float, frontend_us: float
) -> dict[str, float]:
    return {
        "linear_s_per_token": base["linear_s_per_token"] * scale,
        "attention_s_per_pair": base["attention_s_per_pair"] * scale,
        "kv_read_efficiency": kv_eff,
        "step_overhead_s": step_ms / 1e3,
        "frontend_s_per_token": frontend_us / 1e6,
    }


def run_arms(sc: Scenario, engine: Engine, arms: Iterable[str]) -> dict[str, dict[str, float]]:
    return {arm: simulate_plan(sc.plan, sc.trace, arm, engine, sc.prefill_only) for arm in arms if arm in sc.real}


def loss(sim: dict[str, dict[str, float]], real: dict[str, dict[str, float]], metrics: Sequence[str]) -> float:
    """Mean of ``(ln sim/real)²`` over the arms and metrics both have."""
    terms = [
        math.log(sim[arm][m] / real[arm][m]) ** 2
        for arm in sim
        for m in metrics
        if m in sim[arm] and m in real.get(arm, {}) and sim[arm][m] > 0 and real[arm][m] > 0
    ]
    return sum(terms) / len(terms) if terms else math.inf


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    def ranks(x: Sequence[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    if n < 2:
        return math.nan
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else math.nan


def comparison(sim: dict[str, dict[str, float]], real: dict[str, dict[str, float]], metrics: Sequence[str]) -> str:
    """A markdown table: per arm, real vs simulated for each metric, then the rank correlation."""
    head = "| arm | " + " | ".join(f"{m} real | sim | ÷" for m in metrics) + " |"
    rule = "|---|" + "---:|---:|---:|" * len(metrics)
    lines = [head, rule]
    for arm in sim:
        cells = []
        for m in metrics:
            r, s = real.get(arm, {}).get(m, math.nan), sim[arm].get(m, math.nan)
            cells.append(f"{r:.3g} | {s:.3g} | {s / r if r else math.nan:.2f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    arms = [a for a in sim if "goodput_ktok_s" in real.get(a, {})]
    rho = spearman([real[a]["goodput_ktok_s"] for a in arms], [sim[a]["goodput_ktok_s"] for a in arms])
    best = lambda d: max(arms, key=lambda a: d[a]["goodput_ktok_s"])  # noqa: E731
    worst = lambda d: min(arms, key=lambda a: d[a]["goodput_ktok_s"])  # noqa: E731
    lines.append("")
    lines.append(
        f"Goodput rank correlation (Spearman, {len(arms)} arms): {rho:.2f}; best arm real {best(real)}, "
        f"sim {best(sim)}; worst arm real {worst(real)}, sim {worst(sim)}."
    )
    return "\n".join(lines)


TTFT_METRICS = ("ttft_s.p50", "ttft_s.p90")
TPOT_METRICS = ("tpot_ms.p50", "tpot_ms.p90")
REPORT_PO = ("ttft_s.p50", "ttft_s.p90", "ttft_s.p99", "goodput_ktok_s")
REPORT_PD = ("ttft_s.p50", "ttft_s.p90", "tpot_ms.p50", "tpot_ms.p90", "goodput_ktok_s")


def engine_settings() -> dict[str, int]:
    """The reproduction's engine settings the simulator takes (``engine.json``; the sequence cap
    and the KV cache size are not published, so the simulator's defaults and the profile's
    capacity stand)."""
    facts = json.loads((DATA / "engine.json").read_text())
    return {"max_num_batched_tokens": int(facts["vllm"]["max_num_batched_tokens"]["value"])}


def fit(workdir: Path, arms: Sequence[str]) -> dict[str, Any]:
    """Stage 1: ``s`` and the per-token overhead on po127's TTFT (a prefill-only run hardly
    depends on decode constants); stage 2: ``η_kv`` and ``t_fix`` on pd64's TPOT with stage 1's
    values fixed. Returns the fit record."""
    settings = engine_settings()
    base = base_constants()
    po = scenario("po127", DATA / "po127_requests.csv", DATA / "summary.csv", workdir)
    pd = scenario("pd64", DATA / "pd64_requests.csv", DATA / "summary.csv", workdir)
    record: dict[str, Any] = {"stage1": [], "stage2": []}
    default_eff, default_step = base["kv_read_efficiency"], base["step_overhead_s"] * 1e3
    for s, f in product(PREFILL_SCALES, FRONTEND_US_PER_TOKEN):
        engine = Engine(overrides=tuple(overrides(base, s, default_eff, default_step, f).items()), **settings)
        sim = run_arms(po, engine, arms)
        envelope_keys = [k for k in po.real[PLAN_ARM] if k.startswith("envelope_p10.")]
        total = loss(sim, po.real, TTFT_METRICS) + loss(sim, po.real, envelope_keys)
        record["stage1"].append({"scale": s, "frontend_us_per_token": f, "loss": total, "sim": sim})
        print(f"po127 s={s} frontend={f} µs/token: loss {record['stage1'][-1]['loss']:.4f}", flush=True)
    one = min(record["stage1"], key=lambda r: r["loss"])
    scale, frontend = one["scale"], one["frontend_us_per_token"]
    for eff, step in product(KV_READ_EFFICIENCIES, STEP_OVERHEADS_MS):
        engine = Engine(overrides=tuple(overrides(base, scale, eff, step, frontend).items()), **settings)
        sim = run_arms(pd, engine, arms)
        record["stage2"].append(
            {"kv_read_efficiency": eff, "step_overhead_ms": step, "loss": loss(sim, pd.real, TPOT_METRICS), "sim": sim}
        )
        print(f"pd64 η_kv={eff} t_fix={step} ms: loss {record['stage2'][-1]['loss']:.4f}", flush=True)
    best = min(record["stage2"], key=lambda r: r["loss"])
    record["fitted"] = {
        "scale": scale,
        "frontend_us_per_token": frontend,
        "kv_read_efficiency": best["kv_read_efficiency"],
        "step_overhead_ms": best["step_overhead_ms"],
    }
    record["profile"] = overrides(base, scale, best["kv_read_efficiency"], best["step_overhead_ms"], frontend)
    return record


def write_profile(path: Path, name: str, base: str, constants: dict[str, float], provenance: dict[str, Any]) -> None:
    doc = {"format": "smetric-profile/1", "name": name, "base": base, "profile": constants, "provenance": provenance}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def report(workdir: Path, arms: Sequence[str], constants: dict[str, float] | None) -> dict[str, Any]:
    """Real vs simulated on po127 and pd64 with ``constants`` (``None``: the uncalibrated profile)."""
    settings = engine_settings()
    engine = Engine(overrides=tuple(sorted((constants or {}).items())), **settings)
    out: dict[str, Any] = {}
    for name, metrics in (("po127", REPORT_PO), ("pd64", REPORT_PD)):
        sc = scenario(name, DATA / f"{name}_requests.csv", DATA / "summary.csv", workdir)
        sim = run_arms(sc, engine, arms)
        out[name] = {"sim": sim, "real": {a: sc.real[a] for a in sim}, "table": comparison(sim, sc.real, metrics)}
    return out


def validate(workdir: Path, arms: Sequence[str]) -> dict[str, Any]:
    """po64, once, with the frozen profile file."""
    frozen = json.loads(CALIBRATED.read_text())["profile"]
    rows = [
        {
            "session_id": r["session_id"],
            "turn_id": r["turn_id"],
            "dispatch_offset_s": r["planned_dispatch_s"],
            "input_tokens": r["effective_input_length"],
        }
        for r in read_csv(DATA / "po64_plan.csv")
    ]
    plan = Plan("po64", sorted(build_plan("po64", rows, None).requests, key=lambda q: q.dispatch_s))
    trace = workdir / "po64.jsonl"
    write_bailian(plan, trace)
    sc = Scenario("po64", plan, trace, True, real_outcomes(DATA / "validation_po64_summary.csv", "po64"))
    out: dict[str, Any] = {}
    for label, constants in (("before", None), ("after", frozen)):
        engine = Engine(overrides=tuple(sorted((constants or {}).items())), **engine_settings())
        sim = run_arms(sc, engine, arms)
        out[label] = {"sim": sim, "table": comparison(sim, sc.real, REPORT_PO)}
    out["real"] = sc.real
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="grid search on po127 and pd64; writes the profile file")
    ap.add_argument("--report", action="store_true", help="real vs simulated on po127 and pd64, before and after")
    ap.add_argument("--validate", action="store_true", help="po64 with the frozen profile (run once)")
    ap.add_argument("--arms", default=",".join(ARMS), help="real arms to simulate (default: all the simulator has)")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    record = json.loads(OUT.read_text()) if OUT.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.fit:
            fitted = fit(workdir, arms)
            record["fit"] = fitted
            PROFILES.mkdir(exist_ok=True)
            write_profile(
                CALIBRATED,
                "h20-3e-calibrated",
                BASE_PROFILE,
                fitted["profile"],
                {
                    "fitted_on": "clateral912/smetric-router-repro po127 (TTFT) and pd64 (TPOT), "
                    "smetric_default repeat 1 plans",
                    "script": "scripts/calibrate_repro.py --fit",
                    "fitted": fitted["fitted"],
                    "validation": "po64, once, after this file was committed",
                },
            )
            print(f"wrote {CALIBRATED.relative_to(ROOT)}: {fitted['fitted']}")
            for name, base in TRANSFERS.items():
                # The fitted constants are compute and efficiency figures of the same GPU die
                # (H20 and H20-3e differ in memory only), so they carry over to the H20 profiles.
                write_profile(
                    PROFILES / f"{name}.json",
                    name,
                    base,
                    fitted["profile"],
                    {"from": str(CALIBRATED.relative_to(ROOT)), "fitted": fitted["fitted"]},
                )
        if args.report:
            frozen = json.loads(CALIBRATED.read_text())["profile"] if CALIBRATED.exists() else None
            record["report"] = {"before": report(workdir, arms, None)}
            if frozen is not None:
                record["report"]["after"] = report(workdir, arms, frozen)
            for label, rep in record["report"].items():
                for name in ("po127", "pd64"):
                    print(f"\n### {name}, {label} the fit\n\n{rep[name]['table']}")
        if args.validate:
            record["validation"] = validate(workdir, arms)
            for label in ("before", "after"):
                print(f"\n### po64 (validation), {label} the fit\n\n{record['validation'][label]['table']}")
    OUT.write_text(json.dumps(record, indent=1, default=float) + "\n")


if __name__ == "__main__":
    sys.exit(main())
