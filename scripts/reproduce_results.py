"""Regenerates the measurements of ``docs/results.md`` from the staged traces (simulator v2).

    .venv/bin/python scripts/reproduce_results.py --traces /work/shared/traces --out docs/results-data
    .venv/bin/python scripts/reproduce_results.py --traces ... --only weka-0476 --out ...   # one trace
    .venv/bin/python scripts/reproduce_results.py --traces ... --timing                     # the 30 s check
    .venv/bin/python scripts/reproduce_results.py --tables docs/results-data                # tables only

For every trace: every policy of ``smetric.POLICIES`` plus ``cache_first_max_hit`` × a load ladder
× four tier settings (the global KV$ tier loaded through LMCache's connector — the default —,
vLLM's Mooncake store connector, vLLM's CPU offload, and no tier) × three seeds, scored under
four SLO settings; ``smetric`` also once more with the turn inferred from the index alone
(``turns=index``) where the trace carries sessions. One JSON per trace, one TPS-vs-load plot per
trace, and the markdown tables pasted into ``docs/results.md``. The design (window, ladders, SLOs)
was fixed on the tuning window ``weka-0476`` only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from smetric import POLICIES
from smetric.sim import (
    MOONCAKE_SEGMENT_BYTES_PER_RANK,
    SLO,
    RunResult,
    RunSpec,
    SimulationConfig,
    TraceSpec,
    Window,
    run_grid,
    summarize,
)
from smetric.sim.config import TierPath
from smetric.sim.report import plot_tps_vs_load

BASELINES = [p for p in POLICIES if p != "smetric"] + ["cache_first_max_hit"]
SEEDS = (0, 1, 2)
TIERS = ("lmcache", "mooncake-store", "cpu-offload", "off")
"""Tier settings: a load path of the global KV$ tier, or no tier. The first is the default."""
SMETRIC_INDEX = "smetric[turns=index]"
"""``smetric`` with the turn inferred from its index alone (the request's turn not passed)."""
TBT_TAIL_S = 0.2
SLOS = (
    SLO(),  # headline: TTFT ≤ 2 s + 0.1 ms/token, TPOT ≤ 100 ms
    SLO(tpot_s=0.05),  # the tight TPOT tier
    SLO(ttft_base_s=1.0, ttft_s_per_token=0.05e-3),  # a TTFT bound twice as tight
    SLO(tbt_tail_s=TBT_TAIL_S),  # headline + tail token gap (mean of a request's longest 10 %)
)
WEKA_ON = (0.02, 0.035, 0.05, 0.065, 0.08)
WEKA_OFF = (0.005, 0.01, 0.015, 0.02, 0.03)
MOONCAKE_ON = (1.0, 1.5, 2.0, 3.0, 4.0)
MOONCAKE_OFF = (0.5, 1.0, 1.5, 2.0, 3.0)
MAX_EVENTS = 40_000_000


@dataclass(frozen=True)
class Trace:
    key: str
    files: tuple[str, ...]
    format: str
    loads_on: tuple[float, ...]
    loads_off: tuple[float, ...]
    role: str
    sessions: bool


TRACES = (
    Trace("weka-0476", ("weka_cc_sessions_0476-0549.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "tuning", True),
    Trace("weka-0001", ("weka_cc_sessions_0001-0175.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report", True),
    Trace("weka-0176", ("weka_cc_sessions_0176-0400.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report", True),
    Trace("weka-0401", ("weka_cc_sessions_0401-0475.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report", True),
    Trace(
        "mooncake-conv",
        ("mooncake_conversation_trace.jsonl.gz",),
        "mooncake",
        MOONCAKE_ON,
        MOONCAKE_OFF,
        "report",
        False,
    ),
)


def setting_config(base: SimulationConfig, tier: str, turns: str) -> SimulationConfig:
    """The run configuration of one tier setting and turn source."""
    config = base.with_tier(tier != "off")
    if tier != "off":
        config = config.with_tier_path(cast(TierPath, tier))
    return config.with_turns(turns)


@dataclass(frozen=True)
class Cell:
    """One run of the grid, as stored in the JSON."""

    label: str
    tier: str
    load: float
    seed: int


def grid(trace: Trace) -> list[tuple[Cell, RunSpec]]:
    spec = TraceSpec(paths=(), format=trace.format)
    base = SimulationConfig(slos=SLOS, max_events=MAX_EVENTS)
    out = []
    for tier in TIERS:
        loads = trace.loads_on if tier != "off" else trace.loads_off
        labels = [*POLICIES, "cache_first_max_hit"] + ([SMETRIC_INDEX] if trace.sessions else [])
        for label in labels:
            policy, turns = ("smetric", "index") if label == SMETRIC_INDEX else (label, "request")
            config = setting_config(base, tier, turns)
            for load in loads:
                for seed in SEEDS:
                    out.append((Cell(label, tier, load, seed), RunSpec(spec, config, Window(), policy, load, seed)))
    return out


def run_trace(trace: Trace, traces_dir: Path, out: Path, img: Path, jobs: int) -> Path:
    spec = TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)
    cells = [(c, RunSpec(spec, s.config, s.window, s.policy, s.load, s.seed)) for c, s in grid(trace)]
    started = time.perf_counter()
    done: dict[RunSpec, RunResult] = {}
    for r in run_grid([s for _, s in cells], jobs=jobs, progress=True, skip_failures=True):
        done[r.spec] = r
    runs = []
    failed = []
    for cell, s in cells:
        r = done.get(s)
        if r is None:
            failed.append(vars(cell))
            continue
        runs.append({**vars(cell), "metrics": r.metrics, "by_slo": r.slos, "wall_s": r.wall_s})
    payload: dict[str, Any] = {
        "trace": trace.key,
        "role": trace.role,
        "files": list(trace.files),
        "format": trace.format,
        "loads_on": list(trace.loads_on),
        "loads_off": list(trace.loads_off),
        "seeds": list(SEEDS),
        "tiers": list(TIERS),
        "slos": [s.label for s in SLOS],
        "window": vars(Window()),
        "wall_s": time.perf_counter() - started,
        "failed": failed,
        "runs": runs,
    }
    path = out / f"{trace.key}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    plot(payload, img)
    return path


def plot(d: dict[str, Any], img: Path) -> None:
    """TPS under SLO against load, headline SLO, default tier path (solid) and no tier (dashed)."""
    trace = TraceSpec(paths=tuple(d["files"]), format=d["format"])
    results = [
        RunResult(
            RunSpec(
                trace, SimulationConfig().with_tier(r["tier"] != "off"), Window(), r["label"], r["load"], r["seed"]
            ),
            r["metrics"],
            r["by_slo"],
            r["wall_s"],
        )
        for r in d["runs"]
        if r["tier"] in (TIERS[0], "off")
    ]
    for k in (0, 3):
        plot_tps_vs_load(
            img / f"{d['trace']}_slo{k}.png",
            summarize(results, slo_index=k),
            load_unit="sessions/s" if d["format"] == "weka" else "x trace speed",
            slo=SLOS[k],
            title=f"{d['trace']} ({d['role']}), 16 x H20, {TIERS[0]} tier (solid) / no tier (dashed), mean of 3 seeds",
        )


CAPACITY_LOAD = 0.05
"""Sessions/s of the store-capacity sweep: where most policies peak on the tuning window."""
GIB = 1 << 30
CAPACITIES = (1536 * GIB, 256 * GIB, 16 * MOONCAKE_SEGMENT_BYTES_PER_RANK)
"""The default store (1.5 TiB), a quarter of a node's DRAM share, and Mooncake-in-vLLM's
per-rank default segment on each of the 16 ranks."""


def capacity_sweep(traces_dir: Path, out: Path, jobs: int) -> Path:
    """Every policy at one load on the Weka report windows, the default tier path, the store
    shrunk down to vLLM's per-rank Mooncake default; plus LMCache's layer-wise option."""
    rows: list[tuple[dict[str, Any], RunSpec]] = []
    base = SimulationConfig(slos=SLOS[:1], max_events=MAX_EVENTS)
    for trace in (t for t in TRACES if t.role == "report" and t.format == "weka"):
        spec = TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)
        variants = [
            (f"{c // GIB} GiB", replace(base, global_tier=replace(base.global_tier, capacity_bytes=c)))
            for c in CAPACITIES
        ]
        variants.append(("1536 GiB, layerwise", base.with_tier_path("lmcache", layerwise=True)))
        for name, config in variants:
            for label in [*POLICIES, "cache_first_max_hit"]:
                for seed in SEEDS:
                    cell = {"trace": trace.key, "store": name, "label": label, "seed": seed}
                    rows.append((cell, RunSpec(spec, config, Window(), label, CAPACITY_LOAD, seed)))
    done = {r.spec: r for r in run_grid([s for _, s in rows], jobs=jobs, progress=True, skip_failures=True)}
    runs = [
        {
            **cell,
            "tps_under_slo": done[s].slos[0]["tps_under_slo"],
            "global_hit_ratio": done[s].metrics["global_hit_ratio"],
        }
        for cell, s in rows
        if s in done
    ]
    path = out / "store_capacity.json"
    path.write_text(json.dumps({"load": CAPACITY_LOAD, "slo": SLOS[0].label, "runs": runs}, indent=1) + "\n")
    return path


SMALL_STORE_LOADS = (0.01, 0.02, 0.03, 0.04, 0.05)
"""Sessions/s of the small-store ladder: from the no-tier knee to the full store's peak."""


def small_store_ladder(traces_dir: Path, out: Path, jobs: int) -> Path:
    """Every policy's capacity (peak over a ladder) with the two small stores of the sweep."""
    rows: list[tuple[dict[str, Any], RunSpec]] = []
    base = SimulationConfig(slos=SLOS[:1], max_events=MAX_EVENTS)
    for trace in (t for t in TRACES if t.role == "report" and t.format == "weka"):
        spec = TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)
        for c in CAPACITIES[1:]:
            config = replace(base, global_tier=replace(base.global_tier, capacity_bytes=c))
            for label in [*POLICIES, "cache_first_max_hit"]:
                for load in SMALL_STORE_LOADS:
                    for seed in SEEDS:
                        cell = {
                            "trace": trace.key,
                            "store": f"{c // GIB} GiB",
                            "label": label,
                            "load": load,
                            "seed": seed,
                        }
                        rows.append((cell, RunSpec(spec, config, Window(), label, load, seed)))
    done = {r.spec: r for r in run_grid([s for _, s in rows], jobs=jobs, progress=True, skip_failures=True)}
    runs = [{**cell, "tps_under_slo": done[s].slos[0]["tps_under_slo"]} for cell, s in rows if s in done]
    path = out / "small_store.json"
    path.write_text(json.dumps({"slo": SLOS[0].label, "loads": list(SMALL_STORE_LOADS), "runs": runs}, indent=1) + "\n")
    return path


def small_store_table(path: Path) -> str:
    d = json.loads(path.read_text())
    by: dict[tuple[str, str], dict[str, dict[float, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in d["runs"]:
        by[(r["trace"], r["store"])][r["label"]][r["load"]].append(r["tps_under_slo"])
    lines = [
        f"Peak over loads {', '.join(f'{x:g}' for x in d['loads'])} sessions/s of the seed means, {d['slo']}.\n",
        "| trace | store | smetric (at load) | best baseline (at load) | ratio |",
        "|---|---|---:|---|---:|",
    ]
    for (trace, store), labels in by.items():
        peak = {}
        for label, loads in labels.items():
            mean = {x: statistics.fmean(v) for x, v in loads.items()}
            best = max(mean, key=lambda x: mean[x])
            peak[label] = (mean[best], best)
        name = max((b for b in BASELINES if b in peak), key=lambda b: peak[b][0])
        lines.append(
            f"| {trace} | {store} | {_fmt(peak['smetric'][0])} ({peak['smetric'][1]:g}) | "
            f"{name} {_fmt(peak[name][0])} ({peak[name][1]:g}) | ×{peak['smetric'][0] / peak[name][0]:.3f} |"
        )
    return "\n".join(lines)


def capacity_table(path: Path) -> str:
    d = json.loads(path.read_text())
    by: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in d["runs"]:
        by[(r["trace"], r["store"])][r["label"]].append(r["tps_under_slo"])
    lines = [
        f"Load {d['load']:g} sessions/s, {d['slo']}, TPS under SLO, mean of the seeds.\n",
        "| trace | store | smetric | best baseline | ratio |",
        "|---|---|---:|---|---:|",
    ]
    for (trace, store), labels in by.items():
        mean = {k: statistics.fmean(v) for k, v in labels.items()}
        name = max((b for b in BASELINES if b in mean), key=lambda b: mean[b])
        lines.append(
            f"| {trace} | {store} | {_fmt(mean['smetric'])} | {name} {_fmt(mean[name])} | "
            f"×{mean['smetric'] / mean[name]:.3f} |"
        )
    return "\n".join(lines)


def timing(traces_dir: Path) -> None:
    """One policy on the full Weka set (all four files), 16 instances, pinned to one core."""
    code = (
        "import time; from smetric._core import load_workload, simulate;"
        f"files=[{', '.join(repr(str(traces_dir / t.files[0])) for t in TRACES if t.format == 'weka')}];"
        "t=time.perf_counter(); w=load_workload(files,'weka'); l=time.perf_counter()-t;"
        "t=time.perf_counter(); r=simulate(w,'smetric'); s=time.perf_counter()-t;"
        'print(f\'requests={len(w)} completed={r["completed"]} rejected={r["rejected"]} load={l:.1f}s '
        "simulate={s:.1f}s total={l+s:.1f}s')"
    )
    subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], check=True)


# --- tables --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peak:
    """A policy's capacity under one SLO and tier setting: the peak of its seed-mean curve."""

    tps: float
    load: float
    per_seed: tuple[float, ...]
    """Each seed's own peak over the ladder."""
    output_tps: float
    tbt_tail_p90_ms: float


def peaks(d: dict[str, Any], tier: str, k: int) -> dict[str, Peak]:
    by: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in d["runs"]:
        if r["tier"] == tier:
            by[r["label"]][r["load"]].append(r)
    out = {}
    for label, loads in by.items():
        mean = {x: statistics.fmean(r["by_slo"][k]["tps_under_slo"] for r in rs) for x, rs in loads.items()}
        best = max(mean, key=lambda x: mean[x])
        seeds = sorted({r["seed"] for rs in loads.values() for r in rs})
        per_seed = tuple(
            max(r["by_slo"][k]["tps_under_slo"] for rs in loads.values() for r in rs if r["seed"] == s) for s in seeds
        )
        at = loads[best]
        out[label] = Peak(
            mean[best],
            best,
            per_seed,
            statistics.fmean(r["by_slo"][k].get("output_tps_under_slo", 0.0) for r in at),
            statistics.fmean(r["metrics"].get("tbt_tail_p90_ms", 0.0) for r in at),
        )
    return out


def best_baseline(p: dict[str, Peak]) -> tuple[str, Peak]:
    name = max((b for b in BASELINES if b in p), key=lambda b: p[b].tps)
    return name, p[name]


def seed_ratio_range(p: dict[str, Peak], label: str) -> tuple[float, float]:
    """Min and max over seeds of the label's peak ÷ the best baseline's peak in that seed."""
    ratios = [v / max(p[b].per_seed[i] for b in BASELINES if b in p) for i, v in enumerate(p[label].per_seed) if v >= 0]
    return min(ratios), max(ratios)


def _fmt(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def compact(datas: Iterable[dict[str, Any]]) -> str:
    """One row per trace and tier setting: SMetric ÷ the best baseline under every SLO."""
    datas = list(datas)
    slos = datas[0]["slos"]
    short = ["headline", "TPOT 50 ms", "tight TTFT", "+ tail TBT 200 ms"]
    lines = [
        "| trace | tier | best baseline (headline) | "
        + " | ".join(f"{short[k]}: ratio (seeds)" for k in range(len(slos)))
        + " | turns from index (headline) |",
        "|---|---|---|" + "---:|" * len(slos) + "---:|",
    ]
    for d in datas:
        for tier in d["tiers"]:
            cells = []
            head_name = ""
            idx = "–"
            for k in range(len(slos)):
                p = peaks(d, tier, k)
                name, b = best_baseline(p)
                lo, hi = seed_ratio_range(p, "smetric")
                cells.append(f"×{p['smetric'].tps / b.tps:.3f} ({lo:.2f}–{hi:.2f})")
                if k == 0:
                    head_name = f"{name} {_fmt(b.tps)}"
                    if SMETRIC_INDEX in p:
                        idx = f"×{p[SMETRIC_INDEX].tps / b.tps:.3f}"
            lines.append(f"| {d['trace']} | {tier} | {head_name} | " + " | ".join(cells) + f" | {idx} |")
    return "\n".join(lines)


def per_trace(d: dict[str, Any]) -> str:
    """Every policy's capacity per tier setting, headline and tail-TBT SLO."""
    lines = [f"\n#### {d['trace']} ({d['role']})\n"]
    for k in range(len(d["slos"])):
        lines.append(f"\n{d['slos'][k]}: peak TPS under SLO, mean of {len(d['seeds'])} seeds (at load)\n")
        head = " | ".join(d["tiers"])
        lines.append(f"| policy | {head} |")
        lines.append("|---|" + "---:|" * len(d["tiers"]))
        table = {tier: peaks(d, tier, k) for tier in d["tiers"]}
        labels = [x for x in [*POLICIES, "cache_first_max_hit", SMETRIC_INDEX] if x in table[d["tiers"][0]]]
        for label in labels:
            cells = []
            for tier in d["tiers"]:
                p = table[tier].get(label)
                cells.append("–" if p is None else f"{_fmt(p.tps)} ({p.load:g})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def behaviour(d: dict[str, Any]) -> str:
    """What each policy did at its own peak load, default tier path, headline SLO (seed means)."""
    tier = d["tiers"][0]
    p = peaks(d, tier, 0)
    lines = [
        f"\nAt each policy's peak ({tier} tier, headline SLO; mean of the seeds):\n",
        "| policy | load | TPS under SLO | output TPS under SLO | TTFT p50/p90 s | tail TBT p90 ms | "
        "f-up home | local hit | global hit | migrations | turn acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, v in sorted(p.items(), key=lambda kv: -kv[1].tps):
        runs = [r for r in d["runs"] if r["tier"] == tier and r["label"] == label and r["load"] == v.load]

        def m(key: str, runs: list[dict[str, Any]] = runs) -> float | None:
            vals = [r["metrics"][key] for r in runs if r["metrics"].get(key) is not None]
            return statistics.fmean(vals) if vals else None

        ttft = f"{m('ttft_p50_s') or 0:.1f}/{m('ttft_p90_s') or 0:.1f}"
        lines.append(
            f"| {label} | {v.load:g} | {_fmt(v.tps)} | {_fmt(v.output_tps)} | {ttft} | {v.tbt_tail_p90_ms:.0f} | "
            f"{pct(m('follow_up_return'))} | {pct(m('local_hit_ratio'))} | {pct(m('global_hit_ratio'))} | "
            f"{_fmt(m('migrations'))} | {pct(m('turn_inference_accuracy'))} |"
        )
    return "\n".join(lines)


def tables(data_dir: Path) -> str:
    datas = [json.loads(p.read_text()) for p in sorted(data_dir.glob("*.json")) if p.stem != "index_feeds"]
    datas = [d for d in datas if "tiers" in d]
    parts = ["### Headline\n", compact(datas)]
    for d in datas:
        parts += [per_trace(d), behaviour(d)]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    parser.add_argument("--out", type=Path, default=Path("docs/results-data"), help="JSON per trace")
    parser.add_argument("--img", type=Path, default=Path("docs/img"), help="plots")
    parser.add_argument("--only", help="comma-separated trace keys")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timing", action="store_true", help="only the one-core full-Weka timing")
    parser.add_argument("--tables", type=Path, help="only print the markdown tables of this data directory")
    parser.add_argument("--capacity", action="store_true", help="only the store-capacity sweeps")
    parser.add_argument("--small-stores", action="store_true", help="only the small-store ladder")
    args = parser.parse_args()
    if args.tables:
        print(tables(args.tables))
        if (args.tables / "store_capacity.json").exists():
            print("\n### Store capacity\n")
            print(capacity_table(args.tables / "store_capacity.json"))
        if (args.tables / "small_store.json").exists():
            print("\n### Small stores: capacity over a ladder\n")
            print(small_store_table(args.tables / "small_store.json"))
        return 0
    if args.capacity:
        args.out.mkdir(parents=True, exist_ok=True)
        print(capacity_table(capacity_sweep(args.traces, args.out, args.jobs)))
        print(small_store_table(small_store_ladder(args.traces, args.out, args.jobs)))
        return 0
    if args.small_stores:
        print(small_store_table(small_store_ladder(args.traces, args.out, args.jobs)))
        return 0
    if args.timing:
        timing(args.traces)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.img.mkdir(parents=True, exist_ok=True)
    by_key = {t.key: t for t in TRACES}
    for key in args.only.split(",") if args.only else list(by_key):
        path = run_trace(by_key[key], args.traces, args.out, args.img, args.jobs)
        print(f"wrote {path}", file=sys.stderr)
    print(tables(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
