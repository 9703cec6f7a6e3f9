"""smetric+ (issue 14): every variant of SMetric tried, on the tuning set only, and the final
comparison of ``smetric`` (its new defaults) and ``smetric_paper`` on the report set.

    .venv/bin/python scripts/smetric_plus.py --tune      # variants table: Weka 0476-0549 + synthetic map
    .venv/bin/python scripts/smetric_plus.py --report    # smetric and smetric_paper on the report set
    .venv/bin/python scripts/smetric_plus.py --tables    # both tables from the JSON
    .venv/bin/python scripts/smetric_plus.py --tune-v2 --jobs 1   # the v2 study (issue 18 item 5)
    .venv/bin/python scripts/smetric_plus.py --v2-table           # its table from the JSON

**Tuning set** (:func:`tune`): the tuning window Weka 0476–0549 under every tier path and no tier,
at the three loads around where every policy peaks there (0.035, 0.05, 0.065 sessions/s with a
tier; 0.015, 0.02, 0.03 without), seeds 0–2; and seven points of the synthetic regime map
(``scripts/regime_map.py``) at the capacities its first pass probed, on its two-point ladder,
seeds 0–2. Each variant is a set of ``RouterConfig`` fields over the paper's form
(:data:`VARIANTS`); the table gives its peak ÷ the best baseline's peak (``linear``, ``lmetric``,
``lpwl``, ``least_load``; the others are far behind on these windows, ``docs/results.md`` §3.5).

**Report set** (:func:`report`): Weka 0001–0175, 0176–0400, 0401–0475 and the Mooncake
conversation trace, the grid of ``scripts/reproduce_results.py`` (its ladders, four tier
settings, seeds 0–2, four SLOs) for ``smetric`` (defaults) and ``smetric_paper``. The baselines'
runs are read from that script's JSON (``docs/results-data/<trace>.json``): the simulator is
unchanged since, which :func:`report` checks by re-running one baseline cell per trace and tier
and requiring the very same TPS.

**The v2 study** (issue 18 item 5, :func:`tune_v2`, ``docs/results.md`` §15): the same idea over
the paper's *current* rule. Each variant is a set of ``RouterConfig`` fields over the v2 paper
form (``RouterConfig().paper()``'s ``smetric_*`` fields, :data:`V2_PAPER`; :data:`V2_VARIANTS`),
run on the tuning set only (:data:`V2_POINTS`: Weka 0476–0549 with the default tier path and
without a tier, the Codex-like generator on tuning seeds), 32 co-located instances as the
paper's grid (``scripts/reproduce_paper.py``), arrival seeds 0–2, every run scored under our
headline SLO and the paper's (:data:`V2_SLOS`). Baselines: :data:`V2_BASELINES`. Runs are cached
in the JSON by (point, label, load, seed), so later variants add runs without redoing the rest.

**The winner's rule, stated before any report data** (:func:`v2_winner`): among the variants
that are ≥ ×1.0 of the best baseline on every tuning point under both SLOs, the one with the
best worst-case ratio over the default-tier-path points under the paper's SLO; ties within
0.005 go to the variant with fewer fields changed. If none passes the constraint, the one with
the best worst-case ratio over every point and both SLOs, and the write-up says so. The rule
reads the points every variant ran on (:data:`V2_CORE_POINTS`); the others check the finalists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import regime_map as rmap
import reproduce_results as rr

from smetric import RouterConfig
from smetric.sim import PAPER_SLO, SLO, RunSpec, SimulationConfig, TraceSpec, Window, run_grid
from smetric.sim.config import POLICY_VARIANTS

PAPER: dict[str, Any] = {k: v for k, v in RouterConfig().v1().to_dict().items() if k.startswith("smetric_")}
"""The ``smetric_*`` fields of the July paper's form (``RouterConfig.v1()``, the rule results.md
§12 tuned on, named ``smetric_paper`` then); every variant starts from them."""
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "paper": ("the paper's SMetric (all switches off)", {}),
    "T1 overload 1.0/0/1": (
        "threshold: overload_factor 1, slacks 0 tokens / 1 request",
        {"overload_factor": 1.0, "overload_slack_tokens": 0.0, "overload_slack_requests": 1.0},
    ),
    "T2 fetch cost 1.0": ("a tier token priced as a recompute (global_fetch_cost 1)", {"global_fetch_cost": 1.0}),
    "T3 min hit 0.9": ("leave home below 90 % local hit (min_local_hit_ratio 0.9)", {"min_local_hit_ratio": 0.9}),
    "D1 additive, active 1": (
        "decode-load term: + active, no batch factor (linear's form, tier-aware)",
        {"smetric_active_weight": 1.0, "smetric_batch_term": False},
    ),
    "D2 additive, active 1, cost": (
        "D1 + cost-based migration",
        {"smetric_active_weight": 1.0, "smetric_batch_term": False, "smetric_migration": "cost"},
    ),
    "D3 active 0.25": ("decode-load term 0.25·active inside LMetric's product", {"smetric_active_weight": 0.25}),
    "D4 active 1": ("decode-load term 1·active inside LMetric's product", {"smetric_active_weight": 1.0}),
    "C1 cost": ("cost-based migration at turn boundaries, margin 0", {"smetric_migration": "cost"}),
    "C2 cost, margin 0.25": (
        "cost-based migration, margin 0.25",
        {"smetric_migration": "cost", "smetric_migration_margin": 0.25},
    ),
    "K1 kv-fit": ("KV-fit: no target without GPU KV for the prompt; a full home is left", {"smetric_kv_fit": True}),
    "K2 kv-fit, cost": ("K1 + C1", {"smetric_kv_fit": True, "smetric_migration": "cost"}),
    "K3 kv-fit, D2": (
        "K1 + D2",
        {
            "smetric_kv_fit": True,
            "smetric_active_weight": 1.0,
            "smetric_batch_term": False,
            "smetric_migration": "cost",
        },
    ),
    "K4 kv-fit, headroom 8K": (
        "K1 + first turns reserve 8K tokens of growth",
        {"smetric_kv_fit": True, "smetric_growth_headroom_tokens": 8192.0},
    ),
    "K5 kv-fit, headroom 32K": (
        "K1 + first turns reserve 32K tokens of growth",
        {"smetric_kv_fit": True, "smetric_growth_headroom_tokens": 32768.0},
    ),
    "K6 kv-fit, active 1": ("K1 + D4", {"smetric_kv_fit": True, "smetric_active_weight": 1.0}),
    "K7 kv-fit, cost 0.25": (
        "K1 + C2",
        {"smetric_kv_fit": True, "smetric_migration": "cost", "smetric_migration_margin": 0.25},
    ),
    "K8 kv-fit, cost 0.1": (
        "K1 + cost, margin 0.1",
        {"smetric_kv_fit": True, "smetric_migration": "cost", "smetric_migration_margin": 0.1},
    ),
    "K9 kv-fit, cost 0.5": (
        "K1 + cost, margin 0.5",
        {"smetric_kv_fit": True, "smetric_migration": "cost", "smetric_migration_margin": 0.5},
    ),
    "K10 kv-fit, cost 1.0": (
        "K1 + cost, margin 1",
        {"smetric_kv_fit": True, "smetric_migration": "cost", "smetric_migration_margin": 1.0},
    ),
    "W1 kv-fit, work 0.25": (
        "K1 + migration compared on pending work (no batch factor), margin 0.25",
        {"smetric_kv_fit": True, "smetric_migration": "work", "smetric_migration_margin": 0.25},
    ),
    "W2 kv-fit, work 0": (
        "K1 + work comparison, margin 0",
        {"smetric_kv_fit": True, "smetric_migration": "work", "smetric_migration_margin": 0.0},
    ),
    "F1 kv-fit, fetch 0.25 (new default)": (
        "K1 + the cost rule where the tier holds the prompt (a move is a fetch), thresholds elsewhere",
        {"smetric_kv_fit": True, "smetric_migration": "fetch", "smetric_migration_margin": 0.25},
    ),
}
"""Every variant tried: label → (what it is, the ``RouterConfig`` fields it sets over the paper's form)."""
SYNTHETIC_VARIANTS = ("paper", "C2 cost, margin 0.25", "K1 kv-fit", "K7 kv-fit, cost 0.25", "W1 kv-fit, work 0.25")
SYNTHETIC_VARIANTS += ("W2 kv-fit, work 0", "F1 kv-fit, fetch 0.25 (new default)")
"""The variants also measured on the synthetic points (the finalists and the rules they compare)."""
TUNE_BASELINES = ("linear", "lmetric", "lpwl", "least_load")
TUNE_LOADS_ON = (0.035, 0.05, 0.065)
TUNE_LOADS_OFF = (0.015, 0.02, 0.03)
SYNTHETIC_POINTS = (
    ("lmcache", "context_ratio", 0.05),
    ("lmcache", "context_ratio", 0.1),
    ("lmcache", "context_ratio", 0.25),
    ("lmcache", "context_ratio", 0.5),
    ("off", "context_ratio", 0.1),
    ("lmcache", "think_mean_s", 120.0),
    ("lmcache", "mean_turns", 30.0),
)
"""Synthetic points of the tuning set: (tier, axis, value); capacities from the map's first pass."""
FIRST_PASS_CAPACITY: dict[tuple[str, str, float], tuple[float, bool]] = {
    ("lmcache", "context_ratio", 0.05): (1.0233, True),
    ("lmcache", "context_ratio", 0.1): (0.57662, True),
    ("lmcache", "context_ratio", 0.25): (0.11096, True),
    ("lmcache", "context_ratio", 0.5): (0.03736, False),
    ("off", "context_ratio", 0.1): (0.28831, True),
    ("lmcache", "think_mean_s", 120.0): (0.39078, True),
    ("lmcache", "mean_turns", 30.0): (0.26247, True),
}
"""Sessions/s the first pass of the regime map probed with ``linear`` (commit bfaee9b), and
whether the headline SLO was reachable there (else the relaxed TTFT slope is used)."""
SEEDS = (0, 1, 2)


def _weka_tuning_specs(traces: Path) -> list[tuple[dict[str, Any], RunSpec]]:
    trace = next(t for t in rr.TRACES if t.role == "tuning")
    spec = TraceSpec(paths=tuple(str(traces / f) for f in trace.files), format=trace.format)
    base = SimulationConfig(slos=rr.SLOS[:1], max_events=rr.MAX_EVENTS)
    labels = [(b, b, {}) for b in TUNE_BASELINES] + [(v, "smetric", {**PAPER, **f}) for v, (_, f) in VARIANTS.items()]
    out = []
    for tier in rr.TIERS:
        for label, policy, fields in labels:
            config = rr.setting_config(base, tier, "request")
            config = config.with_router(**fields) if fields else config
            for load in TUNE_LOADS_ON if tier != "off" else TUNE_LOADS_OFF:
                for seed in SEEDS:
                    cell = {"set": "weka-0476", "point": tier, "label": label, "load": load, "seed": seed, "slo": 0}
                    out.append((cell, RunSpec(spec, config, Window(), policy, load, seed)))
    return out


def _synthetic_specs() -> list[tuple[dict[str, Any], RunSpec]]:
    points = {(p.tier, p.axis, p.value): p for p in rmap.points()}
    labels = [(b, b, {}) for b in TUNE_BASELINES] + [
        (v, "smetric", {**PAPER, **VARIANTS[v][1]}) for v in SYNTHETIC_VARIANTS
    ]
    out = []
    for where in SYNTHETIC_POINTS:
        pt = points[where]
        capacity, headline = FIRST_PASS_CAPACITY[where]
        for label, policy, fields in labels:
            config = pt.config.with_router(**fields) if fields else pt.config
            for factor in rmap.LADDER:
                for seed in SEEDS:
                    cell = {
                        "set": "synthetic",
                        "point": f"{where[0]} {where[1]}={where[2]:g}",
                        "label": label,
                        "load": round(capacity * factor, 5),
                        "seed": seed,
                        "slo": 0 if headline else 1,
                    }
                    out.append((cell, RunSpec(pt.trace, config, pt.window, policy, cell["load"], seed)))
    return out


def _run(rows: list[tuple[dict[str, Any], RunSpec]], jobs: int) -> list[dict[str, Any]]:
    done = {r.spec: r for r in run_grid([s for _, s in rows], jobs=jobs, progress=True, skip_failures=True)}
    return [
        {**cell, "tps_under_slo": done[s].slos[cell["slo"]]["tps_under_slo"], "metrics": done[s].metrics}
        for cell, s in rows
        if s in done
    ]


def tune(traces: Path, out: Path, jobs: int) -> Path:
    """The variants table's runs (tuning set only)."""
    started = time.perf_counter()
    runs = _run(_weka_tuning_specs(traces) + _synthetic_specs(), jobs)
    for r in runs:  # keep the JSON small: the few behaviour figures the report quotes
        m = r.pop("metrics")
        r.update({k: m[k] for k in ("ttft_p90_s", "local_hit_ratio", "migrations", "preemptions")})
    payload = {
        "variants": {k: {"what": w, "fields": f} for k, (w, f) in VARIANTS.items()},
        "paper_fields": PAPER,
        "wall_s": time.perf_counter() - started,
        "runs": runs,
    }
    path = out / "smetric_plus_tuning.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def _peaks(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, tuple[float, list[float]]]]:
    """(set, point) → label → (peak of the seed means, each seed's own peak)."""
    by: dict[tuple[str, str], dict[str, dict[float, dict[int, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for r in runs:
        by[(r["set"], r["point"])][r["label"]][r["load"]][r["seed"]] = r["tps_under_slo"]
    out: dict[tuple[str, str], dict[str, tuple[float, list[float]]]] = {}
    for where, labels in by.items():
        out[where] = {}
        for label, loads in labels.items():
            peak = max(statistics.fmean(s.values()) for s in loads.values())
            per_seed = [max(s[seed] for s in loads.values()) for seed in SEEDS]
            out[where][label] = (peak, per_seed)
    return out


def tuning_table(path: Path) -> str:
    d = json.loads(path.read_text())
    peaks = _peaks(d["runs"])

    def order(w: tuple[str, str]) -> tuple[bool, int, str]:
        tier = next(i for i, t in enumerate(rr.TIERS) if w[1].startswith(t))
        return (w[0] != "weka-0476", tier, w[1])

    columns = sorted(peaks, key=order)
    short = {"context_ratio": "ctx", "mean_turns": "turns", "think_mean_s": "think", "weka-0476": "0476"}

    def name(s: str, p: str) -> str:
        text = f"{s} {p}" if s != "synthetic" else f"syn. {p}"
        for long, brief in short.items():
            text = text.replace(long, brief)
        return text

    head = " | ".join(name(s, p) for s, p in columns)
    lines = [f"| variant | {head} |", "|---|" + "---:|" * len(columns)]
    for label in d["variants"]:
        cells = []
        for where in columns:
            p = peaks[where]
            if label not in p:
                cells.append("–")
                continue
            best = max(TUNE_BASELINES, key=lambda b: p[b][0])
            cells.append(f"×{p[label][0] / p[best][0]:.3f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    best_row = []
    for where in columns:
        p = peaks[where]
        best = max(TUNE_BASELINES, key=lambda b: p[b][0])
        best_row.append(f"{best} {p[best][0]:,.0f}")
    lines.append("| *best baseline* | " + " | ".join(best_row) + " |")
    return "\n".join(lines)


REPORT_LABELS = ("smetric", "smetric_paper")
SPOT_CHECK_LABEL = "linear"


def report(traces: Path, data: Path, jobs: int) -> Path:
    """``smetric`` and ``smetric_paper`` on the report set, with a spot check of the stored baselines."""
    started = time.perf_counter()
    rows: list[tuple[dict[str, Any], RunSpec]] = []
    checks: list[tuple[dict[str, Any], RunSpec]] = []
    base = SimulationConfig(slos=rr.SLOS, max_events=rr.MAX_EVENTS)
    for trace in (t for t in rr.TRACES if t.role == "report"):
        spec = TraceSpec(paths=tuple(str(traces / f) for f in trace.files), format=trace.format)
        for tier in rr.TIERS:
            config = rr.setting_config(base, tier, "request")
            loads = trace.loads_on if tier != "off" else trace.loads_off
            for label in REPORT_LABELS:
                for load in loads:
                    for seed in SEEDS:
                        cell = {"trace": trace.key, "label": label, "tier": tier, "load": load, "seed": seed}
                        rows.append((cell, RunSpec(spec, config, Window(), label, load, seed)))
            middle = loads[len(loads) // 2]
            cell = {"trace": trace.key, "label": SPOT_CHECK_LABEL, "tier": tier, "load": middle, "seed": 0}
            checks.append((cell, RunSpec(spec, config, Window(), SPOT_CHECK_LABEL, middle, 0)))
    done = {r.spec: r for r in run_grid([s for _, s in rows + checks], jobs=jobs, progress=True, skip_failures=True)}
    runs = [
        {**c, "metrics": done[s].metrics, "by_slo": done[s].slos, "wall_s": done[s].wall_s}
        for c, s in rows
        if s in done
    ]
    spot = []
    for cell, s in checks:
        stored = json.loads((data / f"{cell['trace']}.json").read_text())
        want = next(
            r["by_slo"][0]["tps_under_slo"]
            for r in stored["runs"]
            if (r["label"], r["tier"], r["load"], r["seed"])
            == (cell["label"], cell["tier"], cell["load"], cell["seed"])
        )
        got = done[s].slos[0]["tps_under_slo"] if s in done else None
        spot.append({**cell, "stored": want, "rerun": got, "same": got == want})
    payload = {
        "labels": list(REPORT_LABELS),
        "router_defaults": RouterConfig().to_dict(),
        "paper_fields": PAPER,
        "baselines_from": [f"{t.key}.json" for t in rr.TRACES if t.role == "report"],
        "spot_check": spot,
        "wall_s": time.perf_counter() - started,
        "runs": runs,
    }
    path = data / "smetric_plus_report.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def report_table(path: Path, data: Path) -> str:
    """Per trace and tier: smetric and smetric_paper ÷ the best baseline, per SLO, with the seed range."""
    d = json.loads(path.read_text())
    lines = [
        "| trace | tier | best baseline (headline) | smetric: headline (seeds) | smetric_paper: headline (seeds) "
        "| smetric: TPOT 50 ms | smetric: tight TTFT | smetric: + tail TBT |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for key in dict.fromkeys(r["trace"] for r in d["runs"]):
        stored = json.loads((data / f"{key}.json").read_text())
        merged = {
            **stored,
            "runs": [r for r in stored["runs"] if r["label"] != "smetric"]
            + [r for r in d["runs"] if r["trace"] == key],
        }
        for tier in rr.TIERS:
            cells = []
            for k in range(len(rr.SLOS)):
                p = rr.peaks(merged, tier, k)
                name, best = rr.best_baseline(p)
                for label in REPORT_LABELS if k == 0 else REPORT_LABELS[:1]:
                    lo, hi = rr.seed_ratio_range(p, label)
                    cells.append(f"×{p[label].tps / best.tps:.3f} ({lo:.2f}–{hi:.2f})")
                if k == 0:
                    cells.insert(0, f"{name} {best.tps:,.0f}")
            lines.append(f"| {key} | {tier} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The v2 study (issue 18 item 5): variants over the paper's current (SLO-feasibility) rule.

V2_PAPER: dict[str, Any] = dict(POLICY_VARIANTS["smetric_v2_port"][1])
"""The ``smetric_*`` fields of the v2 paper form as this study ran it (``RouterConfig().v2_port()``,
named ``smetric_paper`` then, but the profile's
``smetric_l_eq_tokens``): every v2 variant starts from them (``min_local_hit_ratio``, v2's
HIT_RATIO, is the router's shared 0.5 unless a variant sets it)."""
_KF = {"smetric_kv_fit": True}
V2_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "v2 paper": ("the paper's v2 rule (every switch off)", {}),
    "V1 kv-fit": ("KV-fit on v2", _KF),
    "V2 kv-fit, fetch 0.25": (
        "today's smetric switches on v2",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 0.25},
    ),
    "V6 kv-fit, headroom 8K": (
        "KV-fit, first turns reserve 8K tokens",
        {**_KF, "smetric_growth_headroom_tokens": 8192.0},
    ),
    "V11 kv-fit, slack 0.5": ("KV-fit + SLACK 0.5", {**_KF, "smetric_ttft_slack": 0.5}),
    "V12 kv-fit, fetch 1.0": (
        "KV-fit + fetch migration, margin 1",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 1.0},
    ),
    "V13 kv-fit, fetch 0.5": (
        "KV-fit + fetch migration, margin 0.5",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 0.5},
    ),
    "V14 kv-fit, slack 2": ("KV-fit + SLACK 2", {**_KF, "smetric_ttft_slack": 2.0}),
    "V15 kv-fit, fetch 1.0, slack 0.5": (
        "V12 + SLACK 0.5",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 1.0, "smetric_ttft_slack": 0.5},
    ),
    "V16 kv-fit, fetch 2.0": (
        "KV-fit + fetch migration, margin 2",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 2.0},
    ),
    "V17 kv-fit, fetch 4.0": (
        "KV-fit + fetch migration, margin 4",
        {**_KF, "smetric_migration": "fetch", "smetric_migration_margin": 4.0},
    ),
    "A2 additive, active 1": (
        "additive decode-load term: e + a (linear's form with v2's work and gate)",
        {"smetric_active_weight": 1.0, "smetric_batch_term": False},
    ),
}
"""Every v2 variant run: label → (what it is, the fields it sets over :data:`V2_PAPER`). The gaps
in the numbering are variants defined but not run for lack of compute (``docs/results.md`` §15)."""
V2_REFERENCE = "smetric (today's defaults)"
"""``smetric`` with the defaults of issue 14 (the v1 rule + KV-fit + fetch 0.25), for reference."""
V2_BASELINES = ("linear", "lmetric", "lpwl", "dynamo_host_tier", "llmd_prefix_load", "bailian_top3")
"""The strongest of ours and the paper's baselines (``least_load`` and ``cache_first`` trail far)."""
V2_INSTANCES = 32
"""Co-located instances, as the paper's grid (``scripts/reproduce_paper.py``)."""
V2_SLOS: tuple[SLO, ...] = (SLO(), PAPER_SLO)
"""Index 0: our headline SLO; index 1: the paper's (``--slo paper`` for the default profile)."""
V2_SLO_NAMES = ("headline", "paper")
V2_DEFAULT_TIER = rr.TIERS[0]


def _weka_tuning_trace(traces: Path) -> TraceSpec:
    trace = next(t for t in rr.TRACES if t.role == "tuning")
    return TraceSpec(paths=tuple(str(traces / f) for f in trace.files), format="weka")


V2_POINTS: dict[str, tuple[str, str, tuple[float, ...]]] = {
    "weka-0476 lmcache": ("weka-0476", "lmcache", (0.066, 0.072, 0.078, 0.084, 0.096)),
    "weka-0476 off": ("weka-0476", "off", (0.028, 0.034, 0.04, 0.046, 0.052)),
    "codex-0 lmcache": ("codex-0", "lmcache", (0.1, 0.11, 0.12, 0.13, 0.145)),
    "codex-0 off": ("codex-0", "off", (0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.11)),
    "codex-1 lmcache": ("codex-1", "lmcache", (0.1, 0.11, 0.12, 0.13, 0.145)),
    "weka-0476 mooncake-store": ("weka-0476", "mooncake-store", (0.066, 0.072, 0.078, 0.084, 0.096)),
    "weka-0476 cpu-offload": ("weka-0476", "cpu-offload", (0.066, 0.072, 0.078, 0.084, 0.096)),
}
"""Tuning points: key → (trace, tier setting, load ladder in sessions/s). The ladders were set by
a probe of ``linear`` and ``smetric_paper`` (seed 0) and extended where a baseline peaked on an
end (the first baseline pass also ran Weka at 0.108: every policy had collapsed there); under the
paper's SLO every peak falls inside; :func:`v2_table` marks a peak on a ladder's end (``†``)."""


def _v2_trace(trace: str, traces: Path) -> TraceSpec:
    if trace.startswith("codex-"):
        return TraceSpec.codex_sessions(seed=int(trace.removeprefix("codex-")))
    return _weka_tuning_trace(traces)


def _v2_label(label: str) -> tuple[str, dict[str, Any]]:
    """The policy and router fields of a v2 study label."""
    if label in V2_VARIANTS:
        return "smetric", {**V2_PAPER, **V2_VARIANTS[label][1]}
    if label == V2_REFERENCE:
        return "smetric", {}
    return label, {}


def _v2_specs(traces: Path, points: list[str], labels: list[str]) -> list[tuple[dict[str, Any], RunSpec]]:
    base = SimulationConfig(instances=V2_INSTANCES, slos=V2_SLOS, max_events=rr.MAX_EVENTS)
    out = []
    for key in points:
        trace, tier, loads = V2_POINTS[key]
        spec = _v2_trace(trace, traces)
        for label in labels:
            policy, fields = _v2_label(label)
            config = rr.setting_config(base, tier, "request")
            config = config.with_router(**fields) if fields else config
            for load in loads:
                for seed in SEEDS:
                    cell = {"point": key, "label": label, "load": load, "seed": seed}
                    out.append((cell, RunSpec(spec, config, Window(), policy, load, seed)))
    return out


V2_METRICS = ("ttft_p90_s", "tpot_p90_s", "local_hit_ratio", "global_hit_ratio", "migrations", "preemptions")
"""The behaviour figures kept per run (the JSON stays small)."""


def _v2_key(r: dict[str, Any]) -> tuple[str, str, float, int]:
    return (r["point"], r["label"], r["load"], r["seed"])


def tune_v2(traces: Path, out: Path, jobs: int, points: list[str], labels: list[str]) -> Path:
    """The v2 study's runs (tuning set only); cells already in the JSON are not re-run."""
    path = out / "smetric_v2_tuning.json"
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": [], "wall_s": 0.0}
    have = {_v2_key(r) for r in old["runs"]}
    rows = [(c, s) for c, s in _v2_specs(traces, points, labels) if _v2_key(c) not in have]
    started = time.perf_counter()
    done = {r.spec: r for r in run_grid([s for _, s in rows], jobs=jobs, progress=True, skip_failures=True)}
    runs = list(old["runs"])
    for cell, s in rows:
        if s not in done:
            continue
        r = done[s]
        reasons = {k: v for k, v in r.metrics.get("reasons", {}).items() if k.startswith(("follow-up", "first"))}
        runs.append(
            {
                **cell,
                "tps": [round(x["tps_under_slo"], 1) for x in r.slos],
                **{k: r.metrics[k] for k in V2_METRICS},
                "reasons": reasons,
                "wall_s": round(r.wall_s, 2),
            }
        )
    payload = {
        "variants": {k: {"what": w, "fields": f} for k, (w, f) in V2_VARIANTS.items()},
        "reference": {V2_REFERENCE: RouterConfig().to_dict()},
        "paper_fields": V2_PAPER,
        "baselines": list(V2_BASELINES),
        "points": {k: {"trace": t, "tier": tier, "loads": list(ld)} for k, (t, tier, ld) in V2_POINTS.items()},
        "instances": V2_INSTANCES,
        "slos": [s.label for s in V2_SLOS],
        "wall_s": old["wall_s"] + time.perf_counter() - started,
        "runs": sorted(runs, key=lambda r: (r["point"], r["label"], r["load"], r["seed"])),
    }
    _write_v2(path, payload)
    return path


def _write_v2(path: Path, payload: dict[str, Any]) -> None:
    """The JSON with one run per line and the behaviour figures to 4 decimals (kept small)."""
    runs = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in payload["runs"]]
    head = json.dumps({k: v for k, v in payload.items() if k != "runs"}, indent=1)[:-2]
    body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in runs)
    path.write_text(f'{head},\n "runs": [\n{body}\n]}}\n')


Peak = tuple[float, float, list[float]]
"""(peak of the seed means, its load, each seed's own peak)."""


def v2_peaks(runs: list[dict[str, Any]], k: int) -> dict[str, dict[str, Peak]]:
    """point → label → peak under SLO ``k`` (only loads every seed ran)."""
    by: dict[str, dict[str, dict[float, dict[int, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for r in runs:
        by[r["point"]][r["label"]][r["load"]][r["seed"]] = r["tps"][k]
    out: dict[str, dict[str, Peak]] = {}
    for point, labels in by.items():
        out[point] = {}
        for label, loads in labels.items():
            full = {ld: s for ld, s in loads.items() if len(s) == len(SEEDS)}
            if not full:
                continue
            load = max(full, key=lambda ld: statistics.fmean(full[ld].values()))
            per_seed = [max(s[seed] for s in full.values()) for seed in SEEDS]
            out[point][label] = (statistics.fmean(full[load].values()), load, per_seed)
    return out


def v2_ratios(runs: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """(point, SLO index) → label → peak ÷ the best baseline's peak."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for k in range(len(V2_SLOS)):
        for point, p in v2_peaks(runs, k).items():
            bases = [b for b in V2_BASELINES if b in p]
            if not bases:
                continue
            best = max(p[b][0] for b in bases)
            out[(point, k)] = {label: v[0] / best for label, v in p.items()}
    return out


V2_CORE_POINTS = ("weka-0476 lmcache", "weka-0476 off", "codex-0 lmcache", "codex-0 off")
"""The points every variant ran on, which the winner's rule reads; the others (a second Codex
seed, another tier path) check the finalists."""


def v2_winner(runs: list[dict[str, Any]], labels: list[str]) -> tuple[str, bool]:
    """The winner by the rule stated in the module doc, and whether it meets ≥ ×1.0 everywhere."""
    ratios = v2_ratios(runs)
    cols = [c for c in ratios if c[0] in V2_CORE_POINTS]
    default = [c for c in cols if c[1] == 1 and V2_POINTS[c[0]][1] == V2_DEFAULT_TIER]

    def fields(label: str) -> int:
        return len(V2_VARIANTS[label][1]) if label in V2_VARIANTS else 99

    def worst(label: str, among: list[tuple[str, int]]) -> float:
        return min(ratios[c][label] for c in among)

    passing = [label for label in labels if worst(label, cols) >= 1.0]
    pool, among = (passing, default) if passing else (labels, cols)
    top = max(worst(label, among) for label in pool)
    near = [label for label in pool if worst(label, among) >= top - 0.005]
    return min(near, key=lambda label: (fields(label), -worst(label, among))), bool(passing)


def v2_table(path: Path) -> str:
    """Per point and SLO: every label's peak ÷ the best baseline (``†``: peak on a ladder's end)."""
    d = json.loads(path.read_text())
    runs = d["runs"]
    ratios = v2_ratios(runs)
    peaks = [v2_peaks(runs, k) for k in range(len(V2_SLOS))]
    points = [p for p in V2_POINTS if any((p, k) in ratios for k in range(len(V2_SLOS)))]
    cols = [(p, k) for k in (1, 0) for p in points if (p, k) in ratios]
    head = " | ".join(f"{p} ({V2_SLO_NAMES[k]})" for p, k in cols)
    lines = [f"| label | {head} |", "|---|" + "---:|" * len(cols)]
    labels = [*V2_VARIANTS, V2_REFERENCE, *V2_BASELINES]
    for label in labels:
        if not any(label in ratios[c] for c in cols):
            continue
        cells = []
        for p, k in cols:
            if label not in ratios[(p, k)]:
                cells.append("–")
                continue
            _, load, _ = peaks[k][p][label]
            ladder = V2_POINTS[p][2]
            edge = "†" if load in (ladder[0], ladder[-1]) else ""
            cells.append(f"×{ratios[(p, k)][label]:.3f}{edge}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    best = []
    for p, k in cols:
        pk = peaks[k][p]
        b = max((x for x in V2_BASELINES if x in pk), key=lambda x: pk[x][0])
        best.append(f"{b} {pk[b][0]:,.0f} @{pk[b][1]:g}")
    lines.append("| *best baseline* | " + " | ".join(best) + " |")
    variants = [v for v in V2_VARIANTS if all(v in ratios[c] for c in cols if c[0] in V2_CORE_POINTS)]
    if variants:
        win, ok = v2_winner(runs, variants)
        lines.append(
            f"\nwinner by the stated rule: {win} ({'≥ ×1.0 everywhere' if ok else 'no variant ≥ ×1.0 everywhere'})"
        )
    return "\n".join(lines)


def v2_behaviour(path: Path, point: str, k: int = 1) -> str:
    """At each label's peak load under SLO ``k`` (seed means): TTFT/TPOT p90, hits, moves, preemptions."""
    d = json.loads(path.read_text())
    peaks = v2_peaks(d["runs"], k)[point]
    lines = [
        "| label | load | TPS | TTFT p90 | TPOT p90 | local / global hit | migrations | preemptions |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for label, (tps, load, _) in sorted(peaks.items(), key=lambda x: -x[1][0]):
        rs = [r for r in d["runs"] if r["point"] == point and r["label"] == label and r["load"] == load]

        def m(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.fmean(r[key] for r in rs)

        lines.append(
            f"| {label} | {load:g} | {tps:,.0f} | {m('ttft_p90_s'):.1f} s | {1e3 * m('tpot_p90_s'):.0f} ms | "
            f"{m('local_hit_ratio'):.2f} / {m('global_hit_ratio'):.2f} | {m('migrations'):,.0f} | "
            f"{m('preemptions'):,.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    p.add_argument("--data", type=Path, default=Path("docs/results-data"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--tune", action="store_true", help="run the variants on the tuning set")
    p.add_argument("--report", action="store_true", help="run smetric and smetric_paper on the report set")
    p.add_argument("--tables", action="store_true", help="print the tables from the JSON")
    p.add_argument("--tune-v2", action="store_true", help="run the v2 study on the tuning set (cached cells kept)")
    p.add_argument("--v2-points", default="weka-0476 lmcache,weka-0476 off,codex-0 lmcache,codex-0 off")
    p.add_argument(
        "--v2-labels", help="labels to run, separated by ';' (default: every variant, the reference, the baselines)"
    )
    p.add_argument("--v2-table", action="store_true", help="print the v2 table from the JSON")
    p.add_argument("--v2-behaviour", help="print the behaviour at the peaks of this v2 point (paper SLO)")
    args = p.parse_args()
    v2_path = args.data / "smetric_v2_tuning.json"
    if args.tune_v2:
        points = args.v2_points.split(",")
        labels = args.v2_labels.split(";") if args.v2_labels else [*V2_BASELINES, V2_REFERENCE, *V2_VARIANTS]
        print(f"wrote {tune_v2(args.traces, args.data, args.jobs, points, labels)}", file=sys.stderr)
    if args.tune_v2 or args.v2_table:
        print(v2_table(v2_path))
    if args.v2_behaviour:
        print(v2_behaviour(v2_path, args.v2_behaviour))
    if args.tune_v2 or args.v2_table or args.v2_behaviour:
        return 0
    if args.tune:
        print(f"wrote {tune(args.traces, args.data, args.jobs)}", file=sys.stderr)
    if args.report:
        print(f"wrote {report(args.traces, args.data, args.jobs)}", file=sys.stderr)
    if args.tune or args.tables:
        print(tuning_table(args.data / "smetric_plus_tuning.json"))
    if args.report or args.tables:
        path = args.data / "smetric_plus_report.json"
        d = json.loads(path.read_text())
        print("\nspot check of the stored baselines:", all(s["same"] for s in d["spot_check"]), file=sys.stderr)
        print(report_table(path, args.data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
