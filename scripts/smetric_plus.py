"""smetric+ (issue 14): every variant of SMetric tried, on the tuning set only, and the final
comparison of ``smetric`` (its new defaults) and ``smetric_paper`` on the report set.

    .venv/bin/python scripts/smetric_plus.py --tune      # variants table: Weka 0476-0549 + synthetic map
    .venv/bin/python scripts/smetric_plus.py --report    # smetric and smetric_paper on the report set
    .venv/bin/python scripts/smetric_plus.py --tables    # both tables from the JSON

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
from smetric.sim import RunSpec, SimulationConfig, TraceSpec, Window, run_grid

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    p.add_argument("--data", type=Path, default=Path("docs/results-data"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--tune", action="store_true", help="run the variants on the tuning set")
    p.add_argument("--report", action="store_true", help="run smetric and smetric_paper on the report set")
    p.add_argument("--tables", action="store_true", help="print the tables from the JSON")
    args = p.parse_args()
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
