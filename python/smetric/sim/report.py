"""Reports of simulation runs: comparison tables (they always state their SLOs), JSON files
and PNG plots (matplotlib, Agg backend: no display needed).

Files written by :func:`write_outputs`:

* ``results.json`` — maps each policy name to its headline metrics at the configured load
  (``tps_under_slo``, ``slo_attainment``, ``follow_up_return``, ``local_hit_ratio``,
  ``global_hit_ratio``, …), its result under every SLO setting, and its load-sweep summary;
* ``run.json`` — the trace, cluster, SLOs, window and loads of the run, and timings;
* ``tps_vs_load.png``, ``ttft_cdf.png``, ``load_over_time.png``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from smetric.errors import MissingExtraError
from smetric.sim.config import SLO
from smetric.sim.runner import PolicySummary, RunResult

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "matplotlib", "sim", name=e.name) from e


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def slo_lines(slos: Sequence[SLO]) -> list[str]:
    """One line per SLO setting, the headline first."""
    lines = [f"SLO (headline): {slos[0].label}  (TTFT bound grows with the prompt: base + slope x input tokens)"]
    lines += [f"SLO (also):     {s.label}" for s in slos[1:]]
    return lines


def comparison_table(
    nominal: Sequence[RunResult],
    summaries: Sequence[PolicySummary],
    *,
    slos: Sequence[SLO],
    load_unit: str,
) -> str:
    """The stdout comparison: headline metrics at the configured load, behaviour, and the load sweep."""
    if not nominal:
        return ""
    spec = nominal[0].spec
    lines = [
        f"trace {spec.trace.name} | {spec.config.instances} x {spec.config.profile_label} | "
        f"global KV$ tier {'on' if spec.tier else 'off'} | turns from {spec.config.turns} | "
        f"load {spec.load:g} {load_unit} | seed {spec.seed}",
        *slo_lines(slos),
        "",
    ]
    head = (
        f"{'policy':<20} {'TPS<=SLO':>10} {'out TPS':>8} {'attain':>7} "
        f"{'TTFT p50/p90/p99 (s)':>22} {'TPOT p50/p90/p99 (ms)':>22} {'TBTtail p90':>11}"
    )
    lines += [head, "-" * len(head)]
    for r in nominal:
        m = r.metrics
        ttft = f"{m['ttft_p50_s']:.2f}/{m['ttft_p90_s']:.2f}/{m['ttft_p99_s']:.2f}"
        tpot = f"{1e3 * m['tpot_p50_s']:.0f}/{1e3 * m['tpot_p90_s']:.0f}/{1e3 * m['tpot_p99_s']:.0f}"
        lines.append(
            f"{r.spec.policy:<20} {_num(m['tps_under_slo']):>10} {_num(m['output_tps_under_slo']):>8} "
            f"{_pct(m['slo_attainment']):>7} {ttft:>22} {tpot:>22} {m['tbt_tail_p90_ms']:>9.0f}ms"
        )
    head = (
        f"\n{'policy':<20} {'f-up home':>9} {'f-up stay':>9} {'local hit':>9} {'global hit':>10} "
        f"{'migrations':>10} {'turn acc':>8} {'imbal CV':>8} {'preempt':>7}"
    )
    lines += [head, "-" * (len(head) - 1)]
    for r in nominal:
        m = r.metrics
        lines.append(
            f"{r.spec.policy:<20} {_pct(m['follow_up_return']):>9} {_pct(m['follow_up_stay']):>9} "
            f"{_pct(m['local_hit_ratio']):>9} {_pct(m['global_hit_ratio']):>10} {m['migrations']:>10} "
            f"{_pct(m['turn_inference_accuracy']):>8} {m['imbalance_queued_cv_mean']:>8.2f} {m['preemptions']:>7}"
        )
    if summaries:
        loads = ", ".join(f"{x:g}" for x in summaries[0].loads)
        head = f"\n{'policy':<20} {'peak TPS<=SLO':>13} {'at load':>8} {'max load, attain>=90%':>22}"
        lines += [f"\nload sweep ({load_unit}: {loads}), headline SLO:", head.lstrip("\n"), "-" * (len(head) - 1)]
        best = max(s.peak_tps_under_slo for s in summaries)
        for s in summaries:
            rel = f" ({s.peak_tps_under_slo / best:.0%} of best)" if best > 0 else ""
            lines.append(
                f"{s.policy:<20} {_num(s.peak_tps_under_slo):>13} {s.load_at_peak:>8g} "
                f"{_num(s.max_load_at_target, 3) if s.max_load_at_target is not None else 'none':>22}{rel}"
            )
    lines += [
        "",
        "TPS<=SLO: input+output tokens/s of measured requests meeting the SLO (out TPS: output tokens only);",
        "attain: share of measured requests meeting it; TBTtail: p90 over requests of the mean of their longest",
        "tenth of token gaps; f-up home: follow-ups placed on their session's first-turn instance; f-up stay: on",
        "their previous request's instance; imbal CV: mean coefficient of variation of queued prefill tokens.",
    ]
    return "\n".join(lines)


OURS = "smetric"
"""The policy the verdict line judges: the default rule."""


def is_baseline(policy: str) -> bool:
    """Every policy that is not one of smetric's own rules (``smetric``, ``smetric_paper``,
    ``smetric_v1``, …) is a baseline; a peer's port of the paper (``vllm_router_smetric``) counts."""
    return not policy.startswith("smetric")


def verdict_line(
    results: Sequence[RunResult], summaries: Sequence[PolicySummary], *, load_unit: str, slo_index: int = 0
) -> str | None:
    """One line: the default's peak TPS under the headline SLO beside the best baseline's, with
    the ratio; below ×1.00, why, read from the two policies' runs at the baseline's peak load
    (attainment, TTFT and TPOT p90, local and tier hits). ``None`` without both in the grid."""
    ours = [s for s in summaries if s.policy == OURS]
    bases = [s for s in summaries if is_baseline(s.policy)]
    if not ours or not bases:
        return None
    # With the tier both on and off the grid holds two summaries per policy: judge like with like.
    lines = []
    for mine in ours:
        peers = [s for s in bases if s.tier == mine.tier]
        if not peers:
            continue
        best = max(peers, key=lambda s: s.peak_tps_under_slo)
        tier = "" if len(ours) == 1 else f" (tier {'on' if mine.tier else 'off'})"
        if best.peak_tps_under_slo <= 0:
            continue
        ratio = mine.peak_tps_under_slo / best.peak_tps_under_slo
        line = (
            f"{OURS}{tier}: peak {_num(mine.peak_tps_under_slo)} tok/s under SLO = x{ratio:.2f} the best baseline "
            f"({best.policy}, {_num(best.peak_tps_under_slo)})"
        )
        if ratio < 1.0:
            line += " — why not: " + _why_behind(results, mine, best, load_unit, slo_index)
        lines.append(line)
    return "\n".join(lines) or None


def _why_behind(
    results: Sequence[RunResult], mine: PolicySummary, best: PolicySummary, load_unit: str, slo_index: int
) -> str:
    """What differs between the two policies' runs at the baseline's peak load (means over seeds)."""
    load = best.load_at_peak

    def at(policy: str, key: str) -> float:
        runs = [r for r in results if r.spec.policy == policy and r.spec.tier == mine.tier and r.spec.load == load]
        values = [r.slos[slo_index]["attainment"] if key == "slo_attainment" else r.metrics[key] for r in runs]
        return sum(float(v) for v in values) / len(values) if values else math.nan

    a, b = OURS, best.policy
    return (
        f"at load {load:g} {load_unit} it meets the SLO on {_pct(at(a, 'slo_attainment'))} vs "
        f"{_pct(at(b, 'slo_attainment'))} (TTFT p90 {at(a, 'ttft_p90_s'):.2f} vs {at(b, 'ttft_p90_s'):.2f} s, "
        f"TPOT p90 {1e3 * at(a, 'tpot_p90_s'):.0f} vs {1e3 * at(b, 'tpot_p90_s'):.0f} ms; local hit "
        f"{_pct(at(a, 'local_hit_ratio'))} vs {_pct(at(b, 'local_hit_ratio'))}, tier hit "
        f"{_pct(at(a, 'global_hit_ratio'))} vs {_pct(at(b, 'global_hit_ratio'))})"
    )


def results_json(
    nominal: Sequence[RunResult], summaries: Sequence[PolicySummary], slos: Sequence[SLO]
) -> dict[str, Any]:
    """``results.json``: policy name → headline metrics, per-SLO results, load-sweep summary."""
    by_policy = {s.policy: s for s in summaries}
    out: dict[str, Any] = {}
    for r in nominal:
        entry: dict[str, Any] = {"load": r.spec.load, "seed": r.spec.seed, "global_tier": r.spec.tier}
        entry.update(r.metrics)
        entry["slo"] = slos[0].label
        entry["by_slo"] = [{"slo": s.label, **s.to_dict(), **res} for s, res in zip(slos, r.slos, strict=True)]
        summary = by_policy.get(r.spec.policy)
        if summary is not None:
            entry["sweep"] = {
                "loads": summary.loads,
                "tps_under_slo": summary.tps_under_slo,
                "slo_attainment": summary.attainment,
                "slo_attainment_served": summary.attainment_served,
                "peak_tps_under_slo": summary.peak_tps_under_slo,
                "load_at_peak": summary.load_at_peak,
                "max_load_attainment_90": summary.max_load_at_target,
            }
        out[r.spec.policy] = entry
    return out


def feed_label(r: RunResult) -> str:
    """``approximate``, ``events (10 ms)`` or ``oracle``: how the run's router index was fed."""
    feed = r.spec.config.index_feed
    return f"events ({1e3 * r.spec.config.event_delay_s:g} ms)" if feed == "events" else feed


def index_feed_table(runs: Sequence[RunResult], *, slos: Sequence[SLO]) -> str:
    """The same policy at the same load with its index fed three ways, side by side."""
    if not runs:
        return ""
    slo_heads = " ".join(f"{f'TPS<=SLO{k}':>10}" for k in range(len(slos)))
    head = (
        f"{'policy':<12} {'index feed':<18} {slo_heads} {'attain':>7} {'local hit':>9} "
        f"{'hit err':>7} {'over':>6} {'turn acc':>8} {'f-up home':>9} {'KV-event msgs':>13} {'MB':>7}"
    )
    lines = [
        "index feeds (same policy, load and seed; only what the router's index knew differs):",
        *slo_lines(slos),
        head,
        "-" * len(head),
    ]
    for r in runs:
        m = r.metrics
        tps = " ".join(f"{_num(x['tps_under_slo']):>10}" for x in r.slos)
        lines.append(
            f"{r.spec.policy:<12} {feed_label(r):<18} {tps} {_pct(m['slo_attainment']):>7} "
            f"{_pct(m['local_hit_ratio']):>9} {100 * m['local_hit_prediction_error']:>6.2f}% "
            f"{_pct(m['local_hit_overpredicted_share']):>6} {_pct(m['turn_inference_accuracy']):>8} "
            f"{_pct(m['follow_up_return']):>9} {m['kv_event_batches']:>13,} {m['kv_event_bytes'] / 1e6:>7.1f}"
        )
    lines += [
        "",
        "hit err: sum |predicted - actual local hit| / prompt tokens; over: share of requests whose predicted",
        "local hit exceeded what the engine had at admission; KV-event msgs / MB: vLLM-format batches published.",
    ]
    return "\n".join(lines)


def index_feeds_json(runs: Sequence[RunResult], slos: Sequence[SLO]) -> list[dict[str, Any]]:
    """``index_feeds.json``: one entry per (policy, feed) run."""
    return [
        {
            "policy": r.spec.policy,
            "index_feed": r.spec.config.index_feed,
            "event_delay_s": r.spec.config.event_delay_s,
            "load": r.spec.load,
            "seed": r.spec.seed,
            "global_tier": r.spec.tier,
            **r.metrics,
            "by_slo": [{"slo": s.label, **res} for s, res in zip(slos, r.slos, strict=True)],
        }
        for r in runs
    ]


def plot_index_feeds(path: Path, runs: Sequence[RunResult], *, slos: Sequence[SLO], title: str) -> None:
    """Grouped bars: TPS under each SLO per (policy, index feed)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(len(slos), 1)
    labels = [f"{r.spec.policy}\n{feed_label(r)}" for r in runs]
    for k, slo in enumerate(slos):
        xs = [i + (k - (len(slos) - 1) / 2) * width for i in range(len(runs))]
        ax.bar(xs, [r.slos[k]["tps_under_slo"] for r in runs], width=width, label=slo.label)
    ax.set_xticks(range(len(runs)), labels, fontsize=8)
    ax.set_ylabel("tokens/s under SLO")
    ax.set_title(f"router index feeds: {title}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label(policy: str, tier: bool, both: bool) -> str:
    return f"{policy} ({'tier' if tier else 'no tier'})" if both else policy


def plot_tps_vs_load(path: Path, summaries: Sequence[PolicySummary], *, load_unit: str, slo: SLO, title: str) -> None:
    """TPS under SLO (left) and SLO attainment (right) against load, one line per policy."""
    both = len({s.tier for s in summaries}) > 1
    colors = {p: f"C{k % 10}" for k, p in enumerate(dict.fromkeys(s.policy for s in summaries))}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in summaries:
        style = {"ls": "-" if s.tier else "--", "marker": "o" if s.tier else "x", "color": colors[s.policy]}
        label = _label(s.policy, s.tier, both)
        ax.plot(s.loads, [t / 1e3 for t in s.tps_under_slo], label=label, **style)
        ax2.plot(s.loads, [100 * a for a in s.attainment], label=label, **style)
    ax.set(xlabel=f"load ({load_unit})", ylabel="TPS under SLO (k tokens/s)", title="TPS under SLO")
    ax2.set(xlabel=f"load ({load_unit})", ylabel="SLO attainment (%)", title="SLO attainment", ylim=(0, 101))
    ax2.axhline(90, color="grey", lw=0.8, ls=":")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n{slo.label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ttft_cdf(path: Path, results: Sequence[RunResult], *, slo: SLO, title: str) -> None:
    """Distribution of TTFT over measured requests, one line per policy (log time axis)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        q = [max(t, 1e-3) for t in r.ttft_quantiles]
        if q:
            ax.plot(q, [100 * k / (len(q) - 1) for k in range(len(q))], label=r.spec.policy)
    ax.set_xscale("log")
    ax.set(xlabel="TTFT (s)", ylabel="requests (%)", title=f"TTFT CDF — {title}")
    ax.axvline(slo.ttft_base_s, color="grey", lw=0.8, ls=":", label=f"TTFT bound at 0 tokens ({slo.ttft_base_s:g} s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def instance_rows(series: Mapping[str, Any], window_s: tuple[float, float]) -> tuple[list[list[int]], list[float]]:
    """The heat map's rows: each instance's requests over time (``series`` is a
    :class:`~smetric._types.LoadSeries`), ordered by the instance's mean over the window, idlest
    first (with ``origin="lower"`` the busiest is drawn at the top), and those means. A window
    that holds no sample falls back to the whole series."""
    lo, hi = window_s
    columns = [list(c) for c in zip(*series["requests"], strict=True)]
    measured = [k for k, t in enumerate(series["time_s"]) if lo <= t <= hi] or list(range(len(series["time_s"])))
    means = [sum(c[k] for k in measured) / len(measured) for c in columns]
    order = sorted(range(len(columns)), key=lambda i: means[i])
    return [columns[i] for i in order], [means[i] for i in order]


def plot_load_over_time(path: Path, results: Sequence[RunResult], *, title: str) -> None:
    """Requests (running + waiting) per instance over time: one instance × time heat map per
    policy, on one colour scale.

    Sixteen overlapping lines cannot be read; a heat map shows at once how even the load is
    (a uniform band), where it piles up (hot rows) and when (hot columns). Each panel's rows
    are sorted by the instance's mean load in the measured window, busiest at the top, so an
    imbalance reads as a gradient from top to bottom whatever instance it fell on. The colour
    scale tops out at the 99th percentile of every panel's values (``extend="max"``) so one
    spike does not wash out the rest.
    """
    shown = [r for r in results if r.load_series and r.load_series["time_s"]]
    if not shown:
        return
    values = [v for r in shown for row in r.load_series["requests"] for v in row]
    top = max(1.0, sorted(values)[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)])
    fig, axes = plt.subplots(
        len(shown), 1, figsize=(9, 0.8 + 1.3 * len(shown)), squeeze=False, sharex=True, layout="constrained"
    )
    image = None
    for ax, r in zip(axes[:, 0], shown, strict=True):
        series = r.load_series
        minutes = [t / 60 for t in series["time_s"]]
        lo, hi = r.metrics["window_s"]
        rows, means = instance_rows(series, (lo, hi))
        step = minutes[1] - minutes[0] if len(minutes) > 1 else 1.0
        image = ax.imshow(
            rows,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
            cmap="viridis",
            vmin=0,
            vmax=top,
            extent=(minutes[0] - step / 2, minutes[-1] + step / 2, -0.5, len(rows) - 0.5),
        )
        for edge in (lo / 60, hi / 60):
            ax.axvline(edge, color="white", lw=0.8, ls="--")
        ax.set_yticks([])
        ax.set_ylabel(
            f"{r.spec.policy}\nmean {means[-1]:.1f} … {means[0]:.1f}\nCV {r.metrics['imbalance_queued_cv_mean']:.2f}",
            rotation=0,
            ha="right",
            va="center",
            fontsize=8,
        )
    axes[-1, 0].set_xlabel("time (min); dashed: the measured window")
    assert image is not None
    bar = fig.colorbar(image, ax=axes[:, 0].tolist(), extend="max", fraction=0.03)
    bar.set_label("requests on the instance (running + waiting)")
    fig.suptitle(
        f"Per-instance load over time — {title}\none row per instance, busiest at the top; left: each policy's "
        "mean requests on its busiest … idlest instance and its queued-token CV (measured window)",
        fontsize=8,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    out: Path,
    *,
    nominal: Sequence[RunResult],
    summaries: Sequence[PolicySummary],
    slos: Sequence[SLO],
    load_unit: str,
    run_info: dict[str, Any],
    feeds: Sequence[RunResult] = (),
) -> list[Path]:
    """Writes results.json, run.json and the plots into ``out`` (plus ``index_feeds.json`` and
    its plot when ``feeds`` has runs); returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    title = f"{run_info['trace']['name']}, {run_info['config']['instances']} instances"
    if nominal:
        title += f", load {nominal[0].spec.load:g} {load_unit}"
    paths = [out / "results.json", out / "run.json", out / "tps_vs_load.png", out / "ttft_cdf.png"]
    paths[0].write_text(json.dumps(results_json(nominal, summaries, slos), indent=2) + "\n")
    paths[1].write_text(json.dumps(run_info, indent=2) + "\n")
    plot_tps_vs_load(paths[2], summaries, load_unit=load_unit, slo=slos[0], title=title)
    plot_ttft_cdf(paths[3], nominal, slo=slos[0], title=title)
    if any(r.load_series for r in nominal):
        paths.append(out / "load_over_time.png")
        plot_load_over_time(paths[-1], nominal, title=title)
    if feeds:
        paths += [out / "index_feeds.json", out / "index_feeds.png"]
        paths[-2].write_text(json.dumps(index_feeds_json(feeds, slos), indent=2) + "\n")
        plot_index_feeds(paths[-1], feeds, slos=slos, title=title)
    return paths
