"""A coarse regime map: SMetric ÷ the best baseline on the synthetic agent-session workload,
sweeping one axis at a time around its centre (the published Bailian agent-trace statistics,
``SYNTHETIC_DEFAULTS``).

    .venv/bin/python scripts/regime_map.py --jobs 2 --out docs/results-data --img docs/img

Axes (each point changes one of them; the others stay at the centre): the mean final context ÷
one instance's GPU KV, the system-prompt share of the reuse, the mean think time and the mean
session length; every point is run under each tier path (LMCache, the engine default; vLLM's
Mooncake-store and CPU-offload connectors) and with no tier, so each axis is a heat map of
its values × the tier settings.

Per point, a capacity probe runs ``linear`` around an analytic estimate (:func:`estimate`: the
lower of a prefill bound and a KV-residency bound), doubling, halving and bisecting until the
highest load whose attainment is ≥ 90 % is bracketed within 30 % (:func:`probe`): the point's
capacity. Every policy of ``smetric.POLICIES`` plus
``cache_first_max_hit`` and ``smetric_paper`` (SMetric in the paper's form) then runs at
``LADDER`` × that capacity; a policy's figure is its peak TPS under the headline SLO over the
ladder, and the map shows ``smetric`` and ``smetric_paper`` ÷ the best baseline (the best policy
that is neither).
Where no probe load meets the headline SLO, the point is measured under the same SLO with a 3×
TTFT slope instead (marked in the JSON and the plot). ``--seeds`` runs every policy under each
seed (the capacity probe uses seed 0); a point's ratio is of the seed-mean peaks, with each
seed's own ratio beside it. Nothing here is tuned on any trace.

``--instrument calibrated`` (issue 31 item 4) runs the engine of ``scripts/default_rule.py``'s
round 2 and 3 (``docs/profiles/h20-fp8-calibrated.json``; the synthetic sessions' contexts scaled to
its KV) and adds three engine axes, each around the profile: the GPU KV capacity, the prefill rate
(``linear_s_per_token`` divided by the factor) and the decode step's fixed cost
(``step_overhead_s`` times the factor). Every point is also scored under the paper's SLO, and names
its **binding resource**: at the ladder's top load, the best baseline's run is *KV*-bound when its
preemptions reach 1% of the measured requests, else bound by whichever of its TTFT (*prefill*) and
TPOT (*decode*) attainments is lower. Its outputs are ``regime_map_calibrated.json`` and
``regime_map_calibrated.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from smetric import POLICIES, RouterConfig
from smetric.sim import (
    SLO,
    SYNTHETIC_DEFAULTS,
    RunResult,
    RunSpec,
    SimulationConfig,
    TraceSpec,
    Window,
    load_trace,
    run_grid,
    workload_reuse_stats,
)
from smetric.sim.config import ENGINE_DEFAULTS, TierPath, paper_slo

ALL_POLICIES = (*POLICIES, "cache_first_max_hit", "smetric_paper", "smetric_v2_port")
SMETRICS = ("smetric", "smetric_paper", "smetric_v2_port")
"""SMetric with its smetric+ defaults, as its authors ship it, and our port of the paper's v2 rule;
none is a baseline."""
TIERS = ("lmcache", "mooncake-store", "cpu-offload", "off")
"""Tier settings every point runs under: a load path of the global KV$ tier, or no tier."""
SLOS = (SLO(), SLO(ttft_s_per_token=0.3e-3))
"""The headline SLO, and a relaxed TTFT slope (3x) for the points where the headline is out of
reach at every load."""
PROBE = (0.5, 1.0, 2.0)
"""First probe loads, × the analytic estimate."""
PROBE_ROUNDS = 4
BRACKET = 1.3
"""The probe stops once capacity is bracketed within this factor."""
LADDER = (1.0, 1.25)
"""Evaluation loads, × the probed capacity."""
PREFILL_S_PER_TOKEN = 50e-6
"""H20 prefill cost per token (perf-model §5), for the analytic first guess only."""
AXES: dict[str, tuple[str, tuple[Any, ...]]] = {
    "context_ratio": ("mean final context ÷ instance KV", (0.05, 0.1, 0.25, 0.5, 1.0)),
    "shared_share": ("system-prompt share of reuse", (0.05, 0.19, 0.5)),
    "think_mean_s": ("mean think time, s", (10.0, 40.0, 120.0)),
    "mean_turns": ("mean turns per session", (5.0, 15.0, 30.0)),
    "kv_scale": ("GPU KV capacity × the profile's", (0.5, 1.0, 2.0)),
    "prefill_scale": ("prefill rate × the profile's", (0.5, 1.0, 2.0)),
    "decode_scale": ("decode step's fixed cost × the profile's", (0.5, 1.0, 2.0)),
}
ENGINE_AXES = ("kv_scale", "prefill_scale", "decode_scale")
"""Axes that change the engine, not the workload (the calibrated instrument's; 1.0 is the centre)."""
PROFILE_FILE = Path(__file__).resolve().parents[1] / "docs" / "profiles" / "h20-fp8-calibrated.json"
"""The calibrated instrument's engine (``scripts/default_rule.py``)."""
KV_BOUND_PREEMPTIONS = 0.01
"""Preemptions per measured request at which a point's binding resource is its GPU KV."""


@dataclass(frozen=True)
class Point:
    """One point of the map: an axis, its value, the tier setting, the trace and the config."""

    axis: str
    value: Any
    tier: str
    trace: TraceSpec
    config: SimulationConfig
    window: Window


def points(instrument: str = "old", tiers: tuple[str, ...] = TIERS) -> list[Point]:
    """Every point; the centre appears once per axis and tier but is simulated once (same specs)."""
    out = []
    base = SimulationConfig(slos=SLOS)
    kv = int(SYNTHETIC_DEFAULTS["kv_tokens"])
    if instrument == "calibrated":
        base = base.with_profile_file(PROFILE_FILE)
        base = replace(base, slos=(*SLOS, paper_slo(base.profile)))
        kv = int(base.resolved_profile()["kv_capacity_tokens"])
    profile = base.resolved_profile()
    axes = [a for a in AXES if instrument == "calibrated" or a not in ENGINE_AXES]
    for tier, axis in ((t, a) for t in tiers for a in axes):
        for value in AXES[axis][1]:
            config = base.with_tier(tier != "off")
            if tier != "off":
                config = config.with_tier_path(cast(TierPath, tier))
            options: dict[str, Any] = {} if axis in ENGINE_AXES else {axis: value}
            if axis == "kv_scale" and value != 1.0:
                config = replace(config, kv_capacity_tokens=round(kv * value))
            elif axis == "prefill_scale" and value != 1.0:
                config = config.with_profile_overrides(linear_s_per_token=profile["linear_s_per_token"] / value)
            elif axis == "decode_scale" and value != 1.0:
                config = config.with_profile_overrides(step_overhead_s=profile["step_overhead_s"] * value)
            turns = float(options.get("mean_turns", SYNTHETIC_DEFAULTS["mean_turns"]))
            think = float(options.get("think_mean_s", SYNTHETIC_DEFAULTS["think_mean_s"]))
            # A steady state needs the warm-up to outlast a typical session.
            warmup = min(max(turns * (think + 5.0), 300.0), 1800.0)
            window = Window(duration_s=warmup + 1800.0, warmup_s=warmup)
            # The centre keeps no options, so every axis shares its runs; the calibrated
            # instrument's sessions are sized to its own KV (the ratio axis stays a ratio).
            options = {k: v for k, v in options.items() if v != SYNTHETIC_DEFAULTS.get(k)}
            if kv != int(SYNTHETIC_DEFAULTS["kv_tokens"]):
                options["kv_tokens"] = kv
            out.append(Point(axis, value, tier, TraceSpec.synthetic_sessions(**options), config, window))
    return out


def binding(r: RunResult, slo: int) -> str:
    """The resource that binds a run (module doc): ``KV``, ``decode`` or ``prefill``."""
    m = r.metrics
    if m["preemptions"] >= KV_BOUND_PREEMPTIONS * max(int(m["measured"]), 1):
        return "KV"
    s = r.slos[slo]
    return "decode" if s["tpot_attainment"] < s["ttft_attainment"] else "prefill"


def estimate(point: Point) -> float:
    """Analytic sessions/s: the lower of two bounds. Prefill: the cluster's prefill rate (half
    busy) over a session's new prefill tokens. Residency: the sessions alive at once (rate ×
    lifetime, a lifetime being its turns × (think + 1 s)) hold their mean context each, and
    together must fit the cluster's GPU KV; a tier lets them exceed it, which the probe finds."""
    workload = load_trace(point.trace)
    kv = int(dict(point.trace.synthetic).get("kv_tokens", SYNTHETIC_DEFAULTS["kv_tokens"]))
    stats = workload_reuse_stats(workload, kv)
    sessions = workload.root_sessions
    instances = point.config.instances
    new_per_session = workload.input_tokens * (1.0 - stats["reusable_share"]) / sessions
    prefill = instances * 0.5 / PREFILL_S_PER_TOKEN / max(new_per_session, 1.0)
    mean_context = workload.input_tokens / len(workload)
    think = float(dict(point.trace.synthetic).get("think_mean_s", SYNTHETIC_DEFAULTS["think_mean_s"]))
    lifetime = len(workload) / sessions * (think + 1.0)
    residency = instances * kv / (mean_context * lifetime)
    return max(min(prefill, residency), 1e-3)


def spec(point: Point, policy: str, load: float, seed: int = 0) -> RunSpec:
    return RunSpec(point.trace, point.config, point.window, policy, load=round(load, 5), seed=seed)


def key(s: RunSpec) -> tuple[Any, ...]:
    return (s.trace, s.config, s.window, s.policy, s.load, s.seed)


def run_unique(specs: list[RunSpec], jobs: int) -> dict[tuple[Any, ...], RunResult]:
    unique = list({key(s): s for s in specs}.values())
    return {key(r.spec): r for r in run_grid(unique, jobs=jobs, progress=True, skip_failures=True)}


def probe(grid: list[Point], guesses: dict[int, float], jobs: int) -> tuple[dict[int, float], dict[int, int], int]:
    """Per point: the highest load at which ``linear`` meets its SLO for ≥ 90 % of the measured
    requests, bracketed within ``BRACKET`` (rounds of runs: ``PROBE`` × the estimate, then
    doubling, halving or bisecting), and the SLO it is measured under: the headline, or where no
    probed load meets it (long contexts: the new share of a 100K+ prompt alone outlasts its TTFT
    bound), the relaxed one. Returns the capacities, the SLOs and the number of runs."""

    def where(x: Point | RunSpec) -> tuple[Any, ...]:
        return (x.trace, x.config, x.window)

    points_at = {where(pt): pt for pt in grid}  # the centre appears once per axis
    tested: dict[tuple[Any, ...], dict[float, RunResult]] = {w: {} for w in points_at}
    pending = {w: [guesses[id(pt)] * f for f in PROBE] for w, pt in points_at.items()}
    cap: dict[tuple[Any, ...], tuple[float, int]] = {}
    runs = 0
    for _ in range(PROBE_ROUNDS):
        specs = [spec(points_at[w], "linear", load) for w, loads in pending.items() for load in loads]
        if not specs:
            break
        done = run_unique(specs, jobs)
        runs += len(done)
        for r in done.values():
            tested[where(r.spec)][r.spec.load] = r
        pending = {}
        for w, results in tested.items():
            slo = 0 if any(r.slos[0]["attainment"] >= 0.9 for r in results.values()) else 1
            ok = [load for load, r in results.items() if r.slos[slo]["attainment"] >= 0.9]
            lo = max(ok, default=None)
            hi = min((load for load in results if lo is None or load > lo), default=None)
            cap[w] = (lo if lo is not None else min(results) / 2, slo)
            if lo is None:
                pending[w] = [min(results) / 2]
            elif hi is None:
                pending[w] = [lo * 2]
            elif hi / lo > BRACKET:
                pending[w] = [math.sqrt(lo * hi)]
    capacity = {id(pt): cap[where(pt)][0] for pt in grid}
    slo_of = {id(pt): cap[where(pt)][1] for pt in grid}
    return capacity, slo_of, runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("docs/results-data"))
    p.add_argument("--img", type=Path, default=Path("docs/img"))
    p.add_argument("--axes", default=",".join(AXES), help="comma-separated subset of the axes")
    p.add_argument("--seeds", default="0", help="comma-separated seeds of the policy runs (the probe uses seed 0)")
    p.add_argument("--instrument", choices=("old", "calibrated"), default="old", help="the engine (module doc)")
    p.add_argument("--tiers", default=",".join(TIERS), help="comma-separated subset of the tier settings")
    p.add_argument("--policies", default=",".join(ALL_POLICIES), help="comma-separated policies (smetric's included)")
    args = p.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    wanted = {a.strip() for a in args.axes.split(",") if a.strip()}
    tiers = tuple(t for t in TIERS if t in args.tiers.split(","))
    policies = tuple(q for q in ALL_POLICIES if q in args.policies.split(","))
    smetrics = tuple(m for m in SMETRICS if m in policies)
    if "smetric" not in smetrics or len(smetrics) == len(policies):
        p.error("--policies needs smetric and at least one baseline")
    calibrated = args.instrument == "calibrated"
    grid = [pt for pt in points(args.instrument, tiers) if pt.axis in wanted]
    start = time.perf_counter()
    # 1. Capacity probe.
    guesses = {id(pt): estimate(pt) for pt in grid}
    capacity, slo_of, probes = probe(grid, guesses, args.jobs)
    # 2. Every policy on the ladder.
    evals = [
        spec(pt, pol, capacity[id(pt)] * f, seed) for pt in grid for pol in policies for f in LADDER for seed in seeds
    ]
    results = run_unique(evals, args.jobs)
    rows = []
    for pt in grid:

        def tps(pol: str, f: float, seed: int, pt: Point = pt, slo: int | None = None) -> float | None:
            r = results.get(key(spec(pt, pol, capacity[id(pt)] * f, seed)))
            k = slo_of[id(pt)] if slo is None else slo
            return None if r is None else float(r.slos[k]["tps_under_slo"])

        def peak(pol: str, slo: int | None = None) -> float:
            """The best ladder load of the policy's seed-mean TPS under SLO ``slo`` (the point's)."""
            means = []
            for f in LADDER:
                got = [v for seed in seeds if (v := tps(pol, f, seed, slo=slo)) is not None]
                if got:
                    means.append(sum(got) / len(got))
            return max(means, default=0.0)

        # A policy's peak, and each seed's own peak.
        peaks = {pol: peak(pol) for pol in policies}
        seed_peaks: dict[str, list[float]] = {
            pol: [max((v for f in LADDER if (v := tps(pol, f, seed)) is not None), default=0.0) for seed in seeds]
            for pol in policies
        }
        baselines = [q for q in policies if q not in SMETRICS]
        per_seed: dict[str, list[float]] = {m: [] for m in smetrics}
        for i in range(len(seeds)):
            base = max(seed_peaks[q][i] for q in baselines)
            if base > 0:
                for m in smetrics:
                    per_seed[m].append(seed_peaks[m][i] / base)
        best = max(baselines, key=lambda q: peaks[q])
        top = results.get(key(spec(pt, best, capacity[id(pt)] * LADDER[-1], seeds[0])))
        extra: dict[str, Any] = {}
        if calibrated:
            paper = {pol: peak(pol, slo=len(SLOS)) for pol in policies}
            best_paper = max(baselines, key=lambda q: paper[q])
            extra = {
                "binding": None if top is None else binding(top, slo_of[id(pt)]),
                "binding_paper_slo": None if top is None else binding(top, len(SLOS)),
                "peak_tps_under_paper_slo": paper,
                "best_baseline_paper_slo": best_paper,
                "ratio_paper_slo": paper["smetric"] / paper[best_paper] if paper[best_paper] > 0 else None,
            }
        stats = workload_reuse_stats(load_trace(pt.trace), int(SYNTHETIC_DEFAULTS["kv_tokens"]))
        rows.append(
            {
                "axis": pt.axis,
                "value": pt.value,
                "tier": pt.tier,
                "capacity_sessions_per_s": capacity[id(pt)],
                "loads": [capacity[id(pt)] * f for f in LADDER],
                "peak_tps_under_slo": peaks,
                "best_baseline": best,
                "slo": SLOS[slo_of[id(pt)]].label,
                "headline_slo": slo_of[id(pt)] == 0,
                "ratio": peaks["smetric"] / peaks[best] if peaks[best] > 0 else None,
                "ratio_per_seed": per_seed["smetric"],
                "paper_ratio": peaks["smetric_paper"] / peaks[best]
                if "smetric_paper" in peaks and peaks[best] > 0
                else None,
                "paper_ratio_per_seed": per_seed.get("smetric_paper", []),
                "workload_stats": stats,
                **extra,
            }
        )
    wall = time.perf_counter() - start
    runs = probes + len({key(s) for s in evals})
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "seeds": seeds,
        "runs": runs,
        "wall_s": wall,
        "policies": list(policies),
        "instrument": args.instrument,
        "probe": list(PROBE),
        "probe_policy": "linear",
        "estimate_sessions_per_s": {f"{pt.tier}:{pt.axis}={pt.value}": guesses[id(pt)] for pt in grid},
        "tiers": list(TIERS),
        "router_defaults": RouterConfig().to_dict(),
        "ladder": list(LADDER),
        "instances": ENGINE_DEFAULTS["instances"],
        "synthetic_defaults": dict(SYNTHETIC_DEFAULTS),
        "slos": [s.label for s in grid[0].config.slos] if grid else [],
    }
    stem = "regime_map_calibrated" if calibrated else "regime_map"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "points": rows}, indent=1) + "\n")
    plot(rows, args.img / f"{stem}.png", len(seeds), calibrated)
    for row in rows:
        ratio = "n/a" if row["ratio"] is None else f"x{row['ratio']:.3f}"
        paper = "n/a" if row["paper_ratio"] is None else f"x{row['paper_ratio']:.3f}"
        slo = "" if row["headline_slo"] else "  (relaxed TTFT SLO)"
        spread = ", ".join(f"{x:.3f}" for x in row["ratio_per_seed"])
        bound = ""
        if calibrated:
            under = "n/a" if row["ratio_paper_slo"] is None else f"x{row['ratio_paper_slo']:.3f}"
            bound = (
                f"  binds: {row['binding']}; paper SLO {under} of {row['best_baseline_paper_slo']}, "
                f"binds: {row['binding_paper_slo']}"
            )
        print(
            f"{row['tier']:>14} {row['axis']:>14} = {row['value']!s:<8} smetric {ratio} (paper {paper}) "
            f"of {row['best_baseline']}{slo}  seeds: {spread}{bound}"
        )
    print(f"{runs} runs in {wall:.0f} s")
    return 0


def plot(rows: list[dict[str, Any]], path: Path, seeds: int, calibrated: bool = False) -> None:
    """One heat map per axis: its values × the tier settings, coloured by smetric ÷ the best
    baseline, each cell also giving the paper's form (or, calibrated, the ratio under the paper's
    SLO and the binding resource) and the best baseline."""
    axes = [a for a in AXES if any(r["axis"] == a for r in rows)]
    tiers = [t for t in TIERS if any(r["tier"] == t for r in rows)]
    fig, subplots = plt.subplots(len(axes), 1, figsize=(8.5, 2.3 * len(axes) + 1.0), squeeze=False)
    fig.subplots_adjust(hspace=0.55)
    image = None
    for ax, axis in zip(subplots[:, 0], axes, strict=True):
        values = list(AXES[axis][1])
        cell = {(r["tier"], r["value"]): r for r in rows if r["axis"] == axis}
        grid = [
            [
                cell[(t, v)]["ratio"] if (t, v) in cell and cell[(t, v)]["ratio"] is not None else float("nan")
                for v in values
            ]
            for t in tiers
        ]
        image = ax.imshow(grid, cmap="RdBu", vmin=0.85, vmax=1.15, aspect="auto")
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_yticks(range(len(tiers)), tiers)
        ax.set_title(AXES[axis][0], fontsize=8)
        for y, t in enumerate(tiers):
            for x, v in enumerate(values):
                r = cell.get((t, v))
                if r is None or r["ratio"] is None:
                    continue
                mark = "" if r["headline_slo"] else "*"
                if calibrated:
                    under = "n/a" if r["ratio_paper_slo"] is None else f"{r['ratio_paper_slo']:.3f}"
                    text = (
                        f"{r['ratio']:.3f}{mark} [{r['binding']}]\n"
                        f"P {under} [{r['binding_paper_slo']}]\n{r['best_baseline']}"
                    )
                else:
                    paper = r["paper_ratio"] if r["paper_ratio"] is not None else float("nan")
                    text = f"{r['ratio']:.3f}{mark} (p {paper:.3f})\n{r['best_baseline']}"
                # White on the darkest colours of the map, black elsewhere.
                colour = "white" if abs(r["ratio"] - 1.0) > 0.1 else "black"
                ax.text(x, y, text, ha="center", va="center", fontsize=6, color=colour)
    legend = (
        "[ ] = binding resource (the best baseline at the ladder's top); P = ratio under the paper's SLO"
        if calibrated
        else "p: smetric_paper ÷ best baseline"
    )
    fig.suptitle(
        f"smetric ÷ best baseline ({legend}), peak TPS under SLO;\n"
        f"synthetic agent sessions, mean of {seeds} seed(s); "
        "* = headline TTFT bound unreachable at any load, relaxed slope 0.3 ms/token",
        fontsize=8,
    )
    if image is not None:
        fig.colorbar(image, ax=subplots[:, 0].tolist(), shrink=0.6)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
