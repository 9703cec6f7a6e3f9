"""Regenerates the measurements of ``docs/results.md`` from the staged traces.

    .venv/bin/python scripts/reproduce_results.py --traces /work/shared/traces --out docs/results-data
    .venv/bin/python scripts/reproduce_results.py --traces ... --only weka-0476 --out ...   # one trace
    .venv/bin/python scripts/reproduce_results.py --traces ... --timing                     # the 60 s check
    .venv/bin/python scripts/reproduce_results.py --tables docs/results-data                # tables only

For every trace: the seven policies plus ``cache_first_max_hit`` × a load ladder × the global
KV$ tier on and off, one seed, scored under three SLO settings; one JSON per trace, one
TPS-vs-load plot per trace and SLO, and the markdown tables pasted into ``docs/results.md``.
The design (window, ladders, SLOs) was fixed on the tuning window ``weka-0476`` only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smetric import POLICIES
from smetric.sim import SLO, RunResult, RunSpec, SimulationConfig, TraceSpec, Window, run_grid, summarize
from smetric.sim.report import plot_load_over_time, plot_tps_vs_load, plot_ttft_cdf

POLICY_SET = [*POLICIES, "cache_first_max_hit"]
SLOS = (
    SLO(),  # headline: TTFT ≤ 2 s + 0.1 ms/token, TPOT ≤ 100 ms
    SLO(tpot_s=0.05),  # the tight TPOT tier
    SLO(ttft_base_s=1.0, ttft_s_per_token=0.05e-3),  # a TTFT bound twice as tight
)
# Loads (sessions/s) with the global tier on and off, fixed on the tuning window: each brackets
# the knee of every policy there (capacity without the tier is about a third).
WEKA_ON = (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08)
WEKA_OFF = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04)
# Event budget of one run: about 3x the heaviest run that completes (16 busy instances over the
# whole window). A guard only: a run beyond it is skipped and listed under "failed".
MAX_EVENTS = 40_000_000
MOONCAKE_ON = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
MOONCAKE_OFF = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


@dataclass(frozen=True)
class Trace:
    key: str
    files: tuple[str, ...]
    format: str
    loads_on: tuple[float, ...]
    loads_off: tuple[float, ...]
    role: str


TRACES = (
    Trace("weka-0476", ("weka_cc_sessions_0476-0549.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "tuning"),
    Trace("weka-0001", ("weka_cc_sessions_0001-0175.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report"),
    Trace("weka-0176", ("weka_cc_sessions_0176-0400.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report"),
    Trace("weka-0401", ("weka_cc_sessions_0401-0475.jsonl.gz",), "weka", WEKA_ON, WEKA_OFF, "report"),
    Trace("mooncake-conv", ("mooncake_conversation_trace.jsonl.gz",), "mooncake", MOONCAKE_ON, MOONCAKE_OFF, "report"),
)


def run_trace(trace: Trace, traces_dir: Path, out: Path, img: Path, jobs: int) -> Path:
    spec = TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)
    config = SimulationConfig(slos=SLOS, max_events=MAX_EVENTS)
    window = Window()
    specs = [
        RunSpec(spec, config.with_tier(tier), window, policy=p, load=x, seed=0)
        for tier in (True, False)
        for p in POLICY_SET
        for x in (trace.loads_on if tier else trace.loads_off)
    ]
    started = time.perf_counter()
    results = run_grid(specs, jobs=jobs, progress=True, skip_failures=True)
    payload: dict[str, Any] = {
        "trace": trace.key,
        "role": trace.role,
        "files": list(trace.files),
        "format": trace.format,
        "loads_on": list(trace.loads_on),
        "loads_off": list(trace.loads_off),
        "slos": [s.label for s in SLOS],
        "window": vars(window),
        "wall_s": time.perf_counter() - started,
        "failed": [
            {"policy": x.policy, "tier": x.tier, "load": x.load} for x in specs if not any(r.spec == x for r in results)
        ],
        "runs": [
            {
                "policy": r.spec.policy,
                "tier": r.spec.tier,
                "load": r.spec.load,
                "metrics": r.metrics,
                "by_slo": r.slos,
                "wall_s": r.wall_s,
            }
            for r in results
        ],
    }
    path = out / f"{trace.key}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    for k, slo in enumerate(SLOS):
        if k == 1:
            continue  # TPOT 50 ms: indistinguishable from the headline plot (see the tables)
        plot_tps_vs_load(
            img / f"{trace.key}_slo{k}.png",
            summarize(results, slo_index=k),
            load_unit="sessions/s" if trace.format == "weka" else "x trace speed",
            slo=slo,
            title=f"{trace.key} ({trace.role}), 16 x H20, tier on (solid) / off (dashed)",
        )
    return path


def detail(trace: Trace, traces_dir: Path, img: Path, load: float, jobs: int) -> None:
    """TTFT CDF and per-instance load over time of every policy at one load (tier on)."""
    spec = TraceSpec(paths=tuple(str(traces_dir / f) for f in trace.files), format=trace.format)
    config = SimulationConfig(slos=SLOS, max_events=MAX_EVENTS)
    specs = [RunSpec(spec, config, Window(), p, load, detail=True) for p in POLICY_SET]
    results = run_grid(specs, jobs=jobs, progress=True, skip_failures=True)
    title = f"{trace.key}, 16 x H20, tier on, load {load:g}"
    plot_ttft_cdf(img / f"{trace.key}_ttft_cdf.png", results, slo=SLOS[0], title=title)
    plot_load_over_time(img / f"{trace.key}_load_over_time.png", results, title=title)


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


def replot(data_dir: Path, img: Path) -> None:
    """Redraws the TPS-vs-load plots from the saved JSON (no simulation)."""
    for path in sorted(data_dir.glob("*.json")):
        d = json.loads(path.read_text())
        trace = TraceSpec(paths=tuple(d["files"]), format=d["format"])
        results = [
            RunResult(
                RunSpec(trace, SimulationConfig().with_tier(r["tier"]), Window(), r["policy"], r["load"]),
                r["metrics"],
                r["by_slo"],
                r["wall_s"],
            )
            for r in d["runs"]
        ]
        for k, slo in enumerate(SLOS):
            if k == 1:
                continue  # TPOT 50 ms: indistinguishable from the headline plot (see the tables)
            plot_tps_vs_load(
                img / f"{d['trace']}_slo{k}.png",
                summarize(results, slo_index=k),
                load_unit="sessions/s" if d["format"] == "weka" else "x trace speed",
                slo=slo,
                title=f"{d['trace']} ({d['role']}), 16 x H20, tier on (solid) / off (dashed)",
            )


def _fmt(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def tables(data_dir: Path) -> str:
    """Markdown tables of every trace JSON in ``data_dir``."""
    lines: list[str] = []
    for path in sorted(data_dir.glob("*.json")):
        d = json.loads(path.read_text())
        lines.append(f"\n#### {d['trace']} ({d['role']})\n")
        for k, slo in enumerate(d["slos"]):
            lines.append(f"\n{slo}\n")
            lines.append(
                "| policy | peak TPS under SLO, tier on | (at load) | max load ≥90% | peak, tier off | (at load) |"
            )
            lines.append("|---|---:|---:|---:|---:|---:|")
            best: dict[bool, float] = {}
            rows: dict[tuple[str, bool], tuple[float, float, float | None]] = {}
            for tier in (True, False):
                for policy in POLICY_SET:
                    runs = sorted(
                        (r for r in d["runs"] if r["policy"] == policy and r["tier"] == tier), key=lambda r: r["load"]
                    )
                    peak = max(runs, key=lambda r: r["by_slo"][k]["tps_under_slo"])
                    sustainable = None
                    for r in runs:
                        served = r["metrics"]["measured"] - r["metrics"]["measured_rejected"]
                        if r["by_slo"][k]["met"] < 0.9 * served:
                            break
                        sustainable = r["load"]
                    rows[(policy, tier)] = (peak["by_slo"][k]["tps_under_slo"], peak["load"], sustainable)
                best[tier] = max(v[0] for (p, t), v in rows.items() if t == tier and p != "smetric")
            for policy in POLICY_SET:
                on, off = rows[(policy, True)], rows[(policy, False)]
                mark = ""
                if policy == "smetric":
                    mark = f" (×{on[0] / best[True]:.3f} / ×{off[0] / best[False]:.3f} vs best baseline)"
                lines.append(
                    f"| {policy}{mark} | {_fmt(on[0])} | {on[1]:g} | {_fmt(on[2], 3)} | {_fmt(off[0])} | {off[1]:g} |"
                )
        lines.append(behaviour(d))
    return "\n".join(lines)


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def behaviour(d: dict[str, Any]) -> str:
    """Where requests went, at the load where the best tier-on baseline peaks (headline SLO)."""
    on = [r for r in d["runs"] if r["tier"]]
    base = max((r for r in on if r["policy"] != "smetric"), key=lambda r: r["by_slo"][0]["tps_under_slo"])
    load = base["load"]
    lines = [
        f"\nBehaviour at load {load:g} (tier on; the best baseline, {base['policy']}, peaks there):\n",
        "| policy | TPS under SLO | attain (served) | TTFT p50/p90 s | f-up home | f-up stay | local hit | "
        "global hit | migrations | turn acc | imbalance CV | preempt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted((r for r in on if r["load"] == load), key=lambda r: POLICY_SET.index(r["policy"])):
        m = r["metrics"]
        lines.append(
            f"| {r['policy']} | {m['tps_under_slo']:,.0f} | {pct(m['slo_attainment_served'])} | "
            f"{m['ttft_p50_s']:.1f}/{m['ttft_p90_s']:.1f} | {pct(m['follow_up_return'])} | "
            f"{pct(m['follow_up_stay'])} | "
            f"{pct(m['local_hit_ratio'])} | {pct(m['global_hit_ratio'])} | {m['migrations']:,} | "
            f"{pct(m['turn_inference_accuracy'])} | {m['imbalance_queued_cv_mean']:.2f} | {m['preemptions']:,} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    parser.add_argument("--out", type=Path, default=Path("docs/results-data"), help="JSON per trace")
    parser.add_argument("--img", type=Path, default=Path("docs/img"), help="plots")
    parser.add_argument("--only", help="comma-separated trace keys")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timing", action="store_true", help="only the one-core full-Weka timing")
    parser.add_argument("--tables", type=Path, help="only print the markdown tables of this data directory")
    parser.add_argument("--detail", help="TRACE=LOAD: TTFT CDF and load-over-time plots at one load")
    parser.add_argument("--replot", action="store_true", help="only redraw the plots from --out's JSON")
    args = parser.parse_args()
    if args.tables:
        print(tables(args.tables))
        return 0
    if args.timing:
        timing(args.traces)
        return 0
    if args.replot:
        replot(args.out, args.img)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.img.mkdir(parents=True, exist_ok=True)
    by_key = {t.key: t for t in TRACES}
    if args.detail:
        key, load = args.detail.split("=")
        detail(by_key[key], args.traces, args.img, float(load), args.jobs)
        return 0
    keys = args.only.split(",") if args.only else list(by_key)
    for key in keys:
        path = run_trace(by_key[key], args.traces, args.out, args.img, args.jobs)
        print(f"wrote {path}", file=sys.stderr)
    print(tables(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
