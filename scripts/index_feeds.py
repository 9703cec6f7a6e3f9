"""Measures how the router's KV$ index is fed — insert on route, vLLM KV events, oracle — on the
report traces of ``docs/results.md`` (its §9 and ``docs/results-data/index_feeds.json``).

    .venv/bin/python scripts/index_feeds.py --traces /work/shared/traces --results docs/results-data \\
        --out docs/results-data --img docs/img

For every report trace, with the global KV$ tier on and off, each of ``smetric``, ``lmetric`` and
``cache_first_max_hit`` runs at the load where it peaked in ``<trace>.json`` (headline SLO), once per
feed: ``approximate`` (the router inserts on route and never hears of an eviction), ``events`` with
a publication-to-index delay of 10 ms, 100 ms, 1 s and 10 s (every engine publishes vLLM-format
``KVEventBatch`` messages, byte-identical to vLLM 0.33's, which the production ingestor applies),
and ``oracle`` (every cache change reaches the index the instant it happens). Same workload, seed
and load per row: only what the index knew at routing time differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from smetric.sim import SLO, RunResult, RunSpec, SimulationConfig, TraceSpec, Window, run_grid

SLOS = (SLO(), SLO(tpot_s=0.05), SLO(ttft_base_s=1.0, ttft_s_per_token=0.05e-3))  # as reproduce_results.py
MAX_EVENTS = 40_000_000
POLICIES = ("smetric", "lmetric", "cache_first_max_hit")
FEEDS: tuple[tuple[str, float], ...] = (
    ("approximate", 0.0),
    ("events", 0.01),
    ("events", 0.1),
    ("events", 1.0),
    ("events", 10.0),
    ("oracle", 0.0),
)
TRACES = {
    "weka-0001": ("weka_cc_sessions_0001-0175.jsonl.gz", "weka"),
    "weka-0176": ("weka_cc_sessions_0176-0400.jsonl.gz", "weka"),
    "weka-0401": ("weka_cc_sessions_0401-0475.jsonl.gz", "weka"),
    "mooncake-conv": ("mooncake_conversation_trace.jsonl.gz", "mooncake"),
}


def label(feed: str, delay: float) -> str:
    return f"events {delay * 1e3:g} ms" if feed == "events" else feed


def peak_load(results: Path, trace: str, policy: str, tier: bool) -> float:
    """The load at which ``policy`` peaked (headline SLO) in the main results."""
    runs = json.loads((results / f"{trace}.json").read_text())["runs"]
    mine = [r for r in runs if r["policy"] == policy and r["tier"] == tier]
    return float(max(mine, key=lambda r: r["by_slo"][0]["tps_under_slo"])["load"])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    """One line per (trace, tier, policy, feed): means over seeds; the ratio is of the means, with
    the per-seed ratios' range."""
    lines = [
        "| trace | tier | policy | load | index feed | TPS ≤ SLO (1) | vs approximate (seeds) | (3) vs approx. |"
        " local hit | hit err | over-predicted | turn acc | KV-event msgs | MB/s |",
        "|---|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, bool, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["tier"], r["policy"], label(r["index_feed"], r["event_delay_s"])), []).append(
            r
        )
    for (trace, tier, policy, feed), runs in groups.items():
        base = {r["seed"]: r for r in groups[(trace, tier, policy, "approximate")]}

        def tps(rs: list[dict[str, Any]], k: int = 0) -> float:
            return _mean([r["by_slo"][k]["tps_under_slo"] for r in rs])

        ratios = [
            r["by_slo"][0]["tps_under_slo"] / base[r["seed"]]["by_slo"][0]["tps_under_slo"]
            for r in runs
            if base.get(r["seed"]) and base[r["seed"]]["by_slo"][0]["tps_under_slo"] > 0
        ]
        approx = list(base.values())
        rel = f"×{tps(runs) / tps(approx):.3f}" if tps(approx) > 0 else "n/a"
        spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
        rel3 = f"×{tps(runs, 2) / tps(approx, 2):.3f}" if tps(approx, 2) > 0 else "n/a"
        mbs = _mean([r["kv_event_bytes"] / 1e6 / r["makespan_s"] for r in runs])
        lines.append(
            f"| {trace} | {'on' if tier else 'off'} | {policy} | {runs[0]['load']:g} | {feed} | {tps(runs):,.0f} | "
            f"{rel}{spread} | {rel3} | {_mean([r['local_hit_ratio'] for r in runs]):.1%} | "
            f"{_mean([r['local_hit_prediction_error'] for r in runs]):.2%} | "
            f"{_mean([r['local_hit_overpredicted_share'] for r in runs]):.1%} | "
            f"{_mean([r['turn_inference_accuracy'] or 0.0 for r in runs]):.1%} | "
            f"{_mean([r['kv_event_batches'] for r in runs]):,.0f} | {mbs:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=False)
    feeds = [label(f, d) for f, d in FEEDS]
    for ax, tier in zip(axes, (True, False), strict=True):
        groups = [(t, p) for t in TRACES for p in ("smetric",)]
        width = 0.8 / len(feeds)
        for k, feed in enumerate(feeds):
            ys = []
            for t, p in groups:
                mine = [r for r in rows if r["trace"] == t and r["policy"] == p and r["tier"] == tier]
                match = [
                    r["by_slo"][0]["tps_under_slo"] for r in mine if label(r["index_feed"], r["event_delay_s"]) == feed
                ]
                base = [r["by_slo"][0]["tps_under_slo"] for r in mine if r["index_feed"] == "approximate"]
                ys.append(_mean(match) / _mean(base) if _mean(base) > 0 else 0.0)
            xs = [i + (k - (len(feeds) - 1) / 2) * width for i in range(len(groups))]
            ax.bar(xs, ys, width=width, label=feed)
        ax.set_xticks(range(len(groups)), [t for t, _ in groups], fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.6)
        ax.set_ylim(0.8, 1.1)
        ax.set_title(
            f"smetric, global tier {'on' if tier else 'off'}: TPS under SLO ÷ approximate (mean of seeds)", fontsize=9
        )
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--results", type=Path, default=Path("docs/results-data"))
    ap.add_argument("--out", type=Path, default=Path("docs/results-data"))
    ap.add_argument("--img", type=Path, default=Path("docs/img"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="one trace key")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default %(default)s)")
    ap.add_argument("--table", action="store_true", help="print the table of an existing index_feeds.json")
    args = ap.parse_args()
    out = args.out / "index_feeds.json"
    if args.table:
        rows = json.loads(out.read_text())["runs"]
        print(table(rows))
        plot(rows, args.img / "index_feeds.png")
        return
    specs = []
    for key, (file, fmt) in TRACES.items():
        if args.only and key != args.only:
            continue
        trace = TraceSpec(paths=(str(args.traces / file),), format=fmt)
        for tier in (True, False):
            for policy in POLICIES:
                load = peak_load(args.results, key, policy, tier)
                base = SimulationConfig(slos=SLOS, max_events=MAX_EVENTS).with_tier(tier)
                specs += [
                    (key, RunSpec(trace, base.with_feed(feed, delay), Window(), policy, load, seed=int(seed)))
                    for seed in args.seeds.split(",")
                    for feed, delay in FEEDS
                ]
    started = time.perf_counter()
    results: list[RunResult] = run_grid([s for _, s in specs], jobs=args.jobs, progress=True, skip_failures=True)
    keys = {s: k for k, s in specs}
    rows = [
        {
            "trace": keys[r.spec],
            "tier": r.spec.tier,
            "policy": r.spec.policy,
            "load": r.spec.load,
            "seed": r.spec.seed,
            **r.metrics,
            "event_delay_s": r.spec.config.event_delay_s if r.spec.config.index_feed == "events" else 0.0,
            "by_slo": r.slos,
            "wall_s": r.wall_s,
        }
        for r in results
    ]
    out.write_text(
        json.dumps(
            {
                "slos": [s.label for s in SLOS],
                "feeds": [label(f, d) for f, d in FEEDS],
                "wall_s": time.perf_counter() - started,
                "failed": len(specs) - len(results),
                "runs": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(table(rows))
    plot(rows, args.img / "index_feeds.png")


if __name__ == "__main__":
    main()
