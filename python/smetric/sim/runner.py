"""Runs simulations: one configuration, or a grid of load × policy × seed in parallel processes.

A run is a :class:`RunSpec` (trace, cluster config, window, policy, load, seed). The *load*
is the closed-loop session arrival rate in sessions/s for session traces (Weka, gated
Bailian) and the replay speed-up for timestamped traces (Mooncake, Azure, Bailian); see
:class:`~smetric.sim.config.Window` for how each becomes a measured window.

Workers are processes (``concurrent.futures.ProcessPoolExecutor``, forked where the platform
allows, so traces loaded by the parent are shared copy-on-write); each process keeps the
workloads it loaded, so a trace is parsed once per process, not once per run. The engine
releases the GIL, but one run is single-threaded: processes are what use the cores.

Per policy, :func:`summarize` gives the peak TPS under SLO over the loads of a grid and the
highest load up to which the SLO attainment of the requests the cluster can serve stays at
or above 90% (DistServe's goodput criterion; requests longer than the model's context are
rejected by any policy and are left out of that criterion, not of the TPS).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final

from smetric._core import Workload, load_workload, simulate
from smetric._types import LoadSeries, SimReport, SloResult
from smetric.errors import MissingExtraError, SimulationError
from smetric.sim.config import SimulationConfig, TraceSpec, Window, policy_router
from smetric.sim.end_to_end_slo import score_end_to_end

try:
    from tqdm import tqdm
except ModuleNotFoundError as e:
    raise MissingExtraError(__name__, "tqdm", "sim", name=e.name) from e

ATTAINMENT_TARGET: Final[float] = 0.9
COLLAPSE_ATTAINMENT: Final[float] = 0.5
"""A load where fewer than half the measured requests meet the SLO is past saturation: TPS under
SLO falls from there on (the queue grows without bound), so a ladder that reached it brackets
the peak."""
LADDER_STEP: Final[float] = 1.25
""":func:`run_until_collapse`'s ratio between rungs: 25 % steps resolve a peak to within ±12 %."""
MAX_EXTRA_RUNGS: Final[int] = 8
"""At most this many rungs past the given ladder (1.25^8 ≈ 6× its top load)."""
"""SLO attainment that defines the highest sustainable load (DistServe's 90%)."""
CDF_POINTS: Final[int] = 201
"""Quantiles kept of the TTFT distribution of a detailed run."""
SERIES_POINTS: Final[int] = 240
"""Samples kept of the per-instance load series of a detailed run."""

_WORKLOADS: dict[TraceSpec, Workload] = {}
_REPLICA: dict[tuple[TraceSpec, int, int], Workload] = {}


def load_trace(trace: TraceSpec) -> Workload:
    """The workload of ``trace``, loaded once per process."""
    workload = _WORKLOADS.get(trace)
    if workload is None:
        workload = load_workload(list(trace.paths), trace.format, **trace.loader_options())
        _WORKLOADS[trace] = workload
    return workload


def _replica(trace: TraceSpec, copies: int, seed: int) -> Workload:
    key = (trace, copies, seed)
    workload = _REPLICA.get(key)
    if workload is None:
        _REPLICA.clear()  # one replica per process: they can be large
        workload = load_trace(trace).replicate(copies, seed=seed)
        _REPLICA[key] = workload
    return workload


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a policy at one load and seed."""

    trace: TraceSpec
    config: SimulationConfig
    window: Window
    policy: str
    load: float
    seed: int = 0
    detail: bool = False
    """Also keep the TTFT distribution and the per-instance load series."""

    @property
    def tier(self) -> bool:
        """Whether the global KV$ tier is on."""
        return self.config.global_tier.enabled


@dataclass(frozen=True)
class RunResult:
    """The outcome of a :class:`RunSpec`: flat metrics plus, for detailed runs, distributions."""

    spec: RunSpec
    metrics: dict[str, Any]
    """Headline metrics (headline SLO), ready for results.json."""
    slos: list[dict[str, Any]]
    """One entry per ``spec.config.slos``: TPS under SLO, attainment (and its TTFT and TPOT parts), … under that SLO."""
    wall_s: float
    ttft_quantiles: list[float] = field(default_factory=list)
    load_series: dict[str, Any] = field(default_factory=dict)


def load_unit(workload: Workload) -> str:
    """What the load number means for this workload."""
    return "sessions/s" if workload.arrival == "closed_loop" else "x trace speed"


def _window_config(spec: RunSpec, workload: Workload) -> tuple[Workload, dict[str, Any]]:
    """The (replicated) workload and the engine keys that set load, seed and window."""
    w = spec.window
    if workload.arrival == "closed_loop":
        sessions = spec.load * w.duration_s * w.spare_sessions
        copies = max(1, math.ceil(sessions / max(workload.root_sessions, 1)))
        keys = {
            "session_rate_per_s": spec.load,
            "max_think_s": w.max_think_s,
            "measure_start_s": w.warmup_s,
            "measure_end_s": w.duration_s,
            "arrivals_until_s": w.duration_s,
        }
        return _replica(spec.trace, copies, spec.seed), keys
    span = workload.span_s / spec.load
    keys = {"time_scale": spec.load}
    if span > 0:
        keys["measure_start_s"] = w.open_warmup_share * span
        keys["measure_end_s"] = span
    return workload, keys


def _flat(report: SimReport, slo: SloResult) -> dict[str, Any]:
    served = report["measured"] - report["measured_rejected"]
    followups = report["followups"]
    return {
        "tps_under_slo": slo["tps_under_slo"],
        "output_tps_under_slo": slo["output_tps_under_slo"],
        "slo_attainment": slo["attainment"],
        "slo_attainment_served": slo["met"] / served if served > 0 else 0.0,
        "ttft_attainment": slo["ttft_attainment"],
        "tpot_attainment": slo["tpot_attainment"],
        "tbt_tail_attainment": slo["tbt_tail_attainment"],
        "ttft_p50_s": report["ttft"]["p50"],
        "ttft_p90_s": report["ttft"]["p90"],
        "ttft_p99_s": report["ttft"]["p99"],
        "tpot_p50_s": report["tpot"]["p50"],
        "tpot_p90_s": report["tpot"]["p90"],
        "tpot_p99_s": report["tpot"]["p99"],
        "tbt_tail_p90_ms": 1e3 * report["tbt_tail"]["p90"],
        "follow_up_return": report["followup_home_share"],
        "follow_up_stay": 1.0 - report["migrations"] / followups if followups else None,
        "local_hit_ratio": report["local_hit_ratio"],
        "global_hit_ratio": report["global_hit_ratio"],
        "migrations": report["migrations"],
        "router_migrations": report["router_migrations"],
        "turn_inference_accuracy": report["turn_inference_accuracy"],
        "imbalance_queued_cv_mean": report["imbalance_queued_cv_mean"],
        "imbalance_queued_cv_p90": report["imbalance_queued_cv_p90"],
        "imbalance_requests_cv_mean": report["imbalance_requests_cv_mean"],
        "preemptions": report["preemptions"],
        "tier_fetches": report["tier_fetches"],
        "measured": report["measured"],
        "measured_rejected": report["measured_rejected"],
        "followups": followups,
        "window_s": [report["window_start_s"], report["window_end_s"]],
        "makespan_s": report["makespan_s"],
        "reasons": report["reasons"],
        "index_feed": report["index_feed"],
        "event_delay_s": report["event_delay_s"],
        "turns": report["turns"],
        "local_hit_prediction_error": report["local_hit_prediction_error"],
        "local_hit_overpredicted_share": report["local_hit_overpredicted_share"],
        "kv_event_batches": report["feed_counters"].get("published_batches", 0),
        "kv_event_bytes": report["feed_counters"].get("published_bytes", 0),
        "kv_event_unmapped_hashes": report["feed_counters"].get("ingest_unmapped_hashes", 0),
        "prefill_tps_under_slo": slo["prefill_tps_under_slo"],
        **_pd_metrics(report),
        **_fetch_cost_metrics(report),
    }


def _fetch_cost_metrics(report: SimReport) -> dict[str, Any]:
    """With ``smetric_learn_fetch_cost``: the instances' median learned fetch cost (work units a
    token; ``None`` if none learned one) and how many learned one (nothing otherwise)."""
    counters = report["feed_counters"]
    if "fetch_cost_learned_instances" not in counters:
        return {}
    learned = counters["fetch_cost_learned_instances"]
    return {
        "fetch_cost_learned": counters["fetch_cost_median_milli"] / 1000.0 if learned else None,
        "fetch_cost_learned_instances": learned,
    }


def _pd_metrics(report: SimReport) -> dict[str, Any]:
    """A PD run's transfer and decode-side figures (none for a co-located run)."""
    pd = report["pd"]
    if pd is None:
        return {}
    return {
        "pd": f"{pd['prefill_instances']}P:{pd['decode_instances']}D",
        "decode_rule": pd["decode_rule"],
        "transfers": pd["transfers"],
        "transfer_bytes": pd["transfer_bytes"],
        "transfer_p50_ms": 1e3 * pd["transfer_time"]["p50"],
        "transfer_p99_ms": 1e3 * pd["transfer_time"]["p99"],
        "decode_hit_tokens": pd["decode_hit_tokens"],
        "decode_admission_wait_p99_ms": 1e3 * pd["decode_admission_wait"]["p99"],
        "decode_kv_usage_mean": pd["decode_kv_usage_mean"],
        "decode_kv_usage_max": pd["decode_kv_usage_max"],
        "decode_preemptions": pd["decode_preemptions"],
    }


def _quantiles(values: list[float], points: int) -> list[float]:
    if not values:
        return []
    values = sorted(values)
    last = len(values) - 1
    return [values[round(k * last / (points - 1))] for k in range(points)]


def _thin_series(series: LoadSeries, points: int) -> dict[str, Any]:
    times: list[float] = series["time_s"]
    if not times:
        return {}
    step = max(1, math.ceil(len(times) / points))
    return {
        "time_s": times[::step],
        "requests": series["requests"][::step],
        "queued_tokens": series["queued_tokens"][::step],
        "kv_usage": series["kv_usage"][::step],
    }


def run_one(spec: RunSpec) -> RunResult:
    """Runs one simulation (in this process)."""
    start = time.perf_counter()
    workload, keys = _window_config(spec, load_trace(spec.trace))
    config, variants, where = spec.config.core_config()
    config.update(keys)
    config["seed"] = spec.seed
    if spec.detail:
        config["keep_records"] = True
        window = spec.window.duration_s if workload.arrival == "closed_loop" else workload.span_s / spec.load
        config["series_interval_s"] = max(window / SERIES_POINTS, config["sample_interval_s"])
    policy, router = policy_router(spec.policy, spec.config.router_config())
    report = simulate(workload, policy, config=config, router=router, slo_variants=variants)
    groups = [report["slo"], *report["slo_variants"]]
    lo, hi = report["window_start_s"], report["window_end_s"]
    slos = [
        groups[v][i] if v >= 0 else score_end_to_end(report["records"], spec.config.slos[i], lo, hi) for v, i in where
    ]
    ttft: list[float] = []
    if spec.detail:
        records = report["records"]
        ttft = [
            t
            for a, t in zip(records["arrival_s"], records["ttft_s"], strict=True)
            if a is not None and t is not None and lo <= a <= hi
        ]
    return RunResult(
        spec=spec,
        metrics=_flat(report, slos[0]),
        slos=[
            {
                k: s[k]
                for k in (
                    "tps_under_slo",
                    "output_tps_under_slo",
                    "prefill_tps_under_slo",
                    "attainment",
                    "ttft_attainment",
                    "tpot_attainment",
                    "met",
                )
            }
            for s in slos
        ],
        wall_s=time.perf_counter() - start,
        ttft_quantiles=_quantiles(ttft, CDF_POINTS),
        load_series=_thin_series(report["load_series"], SERIES_POINTS) if spec.detail else {},
    )


def _context() -> multiprocessing.context.BaseContext | None:
    # Forked workers inherit the traces the parent loaded; elsewhere each worker loads its own.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork") if "fork" in methods else None


def run_grid(
    specs: Sequence[RunSpec],
    *,
    jobs: int | None = None,
    progress: bool | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    skip_failures: bool = False,
) -> list[RunResult]:
    """Runs every spec, ``jobs`` processes at a time (default: one per core), in spec order.

    ``progress``: show a progress bar (``None``: only on a terminal). ``skip_failures``: a run
    that raises :class:`~smetric.errors.SimulationError` (e.g. its event budget ran out) is
    reported on stderr and left out of the result instead of aborting the grid.
    """
    jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    results: dict[int, RunResult] = {}
    # The heaviest runs (highest load) first, so the last ones to finish are short.
    order = sorted(range(len(specs)), key=lambda i: -specs[i].load)

    def new_bar() -> tqdm[Any]:
        return tqdm(total=len(specs), desc="simulating", unit="run", disable=None if progress is None else not progress)

    def collect(i: int, get: Callable[[], RunResult], bar: tqdm[Any]) -> None:
        try:
            results[i] = get()
        except SimulationError as err:
            if not skip_failures:
                raise
            print(f"skipped {specs[i].policy}@{specs[i].load:g} (tier {specs[i].tier}): {err}", file=sys.stderr)
            bar.update(1)
            return
        _done(bar, results[i], on_result)

    if jobs == 1 or len(specs) == 1:
        with new_bar() as bar:
            for i in order:
                collect(i, partial(run_one, specs[i]), bar)
        return [results[i] for i in range(len(specs)) if i in results]
    for trace in {s.trace for s in specs}:
        load_trace(trace)
    with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=_context()) as pool:
        futures: dict[Future[RunResult], int] = {pool.submit(run_one, specs[i]): i for i in order}
        # The bar (and its monitor thread) only once the workers are forked.
        with new_bar() as bar:
            for future in as_completed(futures):
                collect(futures[future], future.result, bar)
    return [results[i] for i in range(len(specs)) if i in results]


def _done(bar: tqdm[Any], result: RunResult, on_result: Callable[[RunResult], None] | None) -> None:
    bar.set_postfix_str(f"{result.spec.policy}@{result.spec.load:g}", refresh=False)
    bar.update(1)
    if on_result is not None:
        on_result(result)


@dataclass(frozen=True)
class PolicySummary:
    """A policy over the loads of a grid (means over seeds), under one SLO."""

    policy: str
    tier: bool
    loads: list[float]
    tps_under_slo: list[float]
    attainment: list[float]
    attainment_served: list[float]
    peak_tps_under_slo: float
    load_at_peak: float
    max_load_at_target: float | None
    """Highest load whose served attainment, and that of every lower load, is ≥ 90%."""
    collapsed_at: float | None = None
    """Lowest load at or past the peak whose attainment is below :data:`COLLAPSE_ATTAINMENT`:
    the ladder brackets the peak. ``None``: it never collapsed, so the peak may lie beyond."""


def summarize(results: Iterable[RunResult], slo_index: int = 0) -> list[PolicySummary]:
    """Per (policy, tier): the TPS-under-SLO curve, its peak and the highest load meeting 90%."""
    grouped: dict[tuple[str, bool], dict[float, list[RunResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        grouped[(r.spec.policy, r.spec.tier)][r.spec.load].append(r)
    out = []
    for (policy, tier), by_load in grouped.items():
        loads = sorted(by_load)
        tps, att, served = [], [], []
        for load in loads:
            runs = by_load[load]
            tps.append(_mean(r.slos[slo_index]["tps_under_slo"] for r in runs))
            att.append(_mean(r.slos[slo_index]["attainment"] for r in runs))
            served.append(_mean(_served(r, slo_index) for r in runs))
        peak = max(range(len(loads)), key=lambda k: tps[k])
        sustainable = None
        for load, a in zip(loads, served, strict=True):
            if a < ATTAINMENT_TARGET:
                break
            sustainable = load
        collapsed = next((loads[k] for k in range(peak, len(loads)) if att[k] < COLLAPSE_ATTAINMENT), None)
        out.append(PolicySummary(policy, tier, loads, tps, att, served, tps[peak], loads[peak], sustainable, collapsed))
    return out


def _collapsed(runs: Sequence[RunResult]) -> bool:
    """Whether a (policy, tier) group's runs at one load have collapsed under every SLO (mean
    attainment over seeds below :data:`COLLAPSE_ATTAINMENT`)."""
    slos = len(runs[0].slos)
    return all(_mean(r.slos[k]["attainment"] for r in runs) < COLLAPSE_ATTAINMENT for k in range(slos))


def run_until_collapse(
    specs: Sequence[RunSpec],
    *,
    step: float = LADDER_STEP,
    max_extra_rungs: int = MAX_EXTRA_RUNGS,
    jobs: int | None = None,
    progress: bool | None = None,
) -> list[RunResult]:
    """Runs ``specs``, then extends each (policy, tier)'s load ladder past saturation: while the
    group's attainment at its highest load has not collapsed under every SLO, it gets a rung at
    ``step`` × that load (every seed of the group), up to ``max_extra_rungs`` rungs. Returns
    every result, the extra rungs' after ``specs``'. The paper's gains live at 8–10× load,
    near and past saturation, so a peak read off a ladder that stops short of the collapse is
    not a peak (:attr:`PolicySummary.collapsed_at` tells which ones are bracketed).

    Raises:
        ValueError: ``step`` ≤ 1 or ``max_extra_rungs`` < 0.
    """
    if not step > 1.0 or max_extra_rungs < 0:
        raise ValueError(f"need step > 1 and max_extra_rungs >= 0, got {step} and {max_extra_rungs}")
    results = run_grid(specs, jobs=jobs, progress=progress)
    for _ in range(max_extra_rungs):
        groups: dict[tuple[str, bool], list[RunResult]] = defaultdict(list)
        for r in results:
            groups[(r.spec.policy, r.spec.tier)].append(r)
        extra: list[RunSpec] = []
        for runs in groups.values():
            top = max(r.spec.load for r in runs)
            at_top = [r for r in runs if r.spec.load == top]
            if not _collapsed(at_top):
                extra += [replace(r.spec, load=top * step) for r in at_top]
        if not extra:
            break
        results += run_grid(extra, jobs=jobs, progress=progress)
    return results


def _served(r: RunResult, slo_index: int) -> float:
    served = r.metrics["measured"] - r.metrics["measured_rejected"]
    met: int = r.slos[slo_index]["met"]
    return met / served if served > 0 else 0.0


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v) if v else 0.0
