"""``smetric simulate`` and ``smetric sweep``: the simulator's command-line front.

``simulate`` runs one configuration (every policy at the configured load) plus a short load
ladder around it, prints the comparison table (stating its SLOs) and writes ``results.json``,
``run.json`` and the plots into ``--out``. With no argument it replays the Weka excerpt
shipped in the package on 16 H20 instances with the global KV$ tier, all seven policies.

``sweep`` runs the full grid load × policy × seed (× global tier on/off) in parallel and
reports, per policy, the peak TPS under SLO and the highest load whose attainment stays ≥ 90%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from smetric import POLICIES, __version__
from smetric._core import sim_profiles
from smetric.errors import InvalidArgumentError, InvalidConfigError
from smetric.sim.config import (
    DECODE_RULES,
    ENGINE_DEFAULTS,
    FORMATS,
    INDEX_FEEDS,
    NAMED_SLOS,
    POLICY_VARIANTS,
    REPLICA_SYNCS,
    SESSION_ADMISSIONS,
    SLO,
    TIER_PATHS,
    TURN_FEEDS,
    SimulationConfig,
    TraceSpec,
    Window,
    guess_format,
    policy_router,
)
from smetric.sim.report import (
    comparison_table,
    index_feed_table,
    plot_tps_vs_load,
    slo_lines,
    verdict_line,
    write_outputs,
)
from smetric.sim.runner import (
    COLLAPSE_ATTAINMENT,
    LADDER_STEP,
    MAX_EXTRA_RUNGS,
    PolicySummary,
    RunResult,
    RunSpec,
    load_trace,
    load_unit,
    run_grid,
    run_until_collapse,
    summarize,
)

LADDER: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 2.5)
"""Loads of ``simulate``'s TPS-vs-load curve, as multiples of ``--load``: from half the
nominal load to past the knee where attainment collapses (2.5× on the embedded trace)."""


PROFILE_FLAGS: tuple[tuple[str, str, float, type], ...] = (
    ("--kv-read-efficiency", "kv_read_efficiency", 1.0, float),
    ("--weight-read-efficiency", "weight_read_efficiency", 1.0, float),
    ("--step-overhead-ms", "step_overhead_s", 1e-3, float),
    ("--linear-us-per-token", "linear_s_per_token", 1e-6, float),
    ("--attention-ns-per-pair", "attention_s_per_pair", 1e-9, float),
    ("--frontend-ms", "frontend_base_s", 1e-3, float),
    ("--kv-capacity-tokens", "kv_capacity_tokens", 1.0, int),
)
"""The knobs a calibration fits, one flag each: ``(flag, Profile field, field units per flag unit,
type)``. Each sets its field on top of ``--profile`` or ``--profile-file``; a profile file sets
any field."""


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _add_common(p: argparse.ArgumentParser) -> None:
    w = Window()
    p.add_argument(
        "--trace",
        action="append",
        metavar="PATH",
        help="trace file (repeat for several Weka files); default: the Weka excerpt shipped in the package",
    )
    p.add_argument("--format", choices=FORMATS, help="trace format (default: guessed from the file name)")
    p.add_argument(
        "--codex-seed",
        type=int,
        default=0,
        help="with --format codex: the generator's seed (default %(default)s; report on seeds not tuned on)",
    )
    p.add_argument(
        "--instances", type=int, default=ENGINE_DEFAULTS["instances"], help="vLLM instances (default %(default)s)"
    )
    p.add_argument(
        "--profile",
        choices=sim_profiles(),
        default=ENGINE_DEFAULTS["profile"],
        metavar="NAME",
        help=f"hardware/model profile, one of {', '.join(sim_profiles())} (default %(default)s)",
    )
    p.add_argument(
        "--profile-file",
        metavar="PATH",
        help="a profile file (smetric-profile/1, docs/perf-model.md section 9) to run instead of --profile; the "
        "served model (router l_eq, --slo paper) is then the file's base, or --profile's when it has none",
    )
    knobs = p.add_argument_group("profile knobs", "set one constant on top of the profile or profile file")
    helps = {
        "kv_read_efficiency": "KV-read efficiency eta_kv, a fraction of HBM bandwidth",
        "weight_read_efficiency": "weight-streaming efficiency eta_m, a fraction of HBM bandwidth",
        "step_overhead_s": "fixed cost of every engine step t_fix, ms",
        "linear_s_per_token": "linear prefill cost a, us per batched token",
        "attention_s_per_pair": "attention cost b, ns per (query, key) token pair",
        "frontend_base_s": "frontend cost per request, ms",
        "kv_capacity_tokens": "GPU KV cache of one instance, tokens",
    }
    for flag, field_name, _, kind in PROFILE_FLAGS:
        knobs.add_argument(
            flag, type=kind, metavar="N" if kind is int else "X", help=f"{helps[field_name]} (default: the profile's)"
        )
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated policies (default: all of them; also: {', '.join(POLICY_VARIANTS)})",
    )
    p.add_argument("--no-global-tier", action="store_true", help="switch the global KV$ tier off")
    p.add_argument(
        "--tier-path",
        choices=TIER_PATHS,
        default=ENGINE_DEFAULTS["global_tier"]["path"],
        help="how KV moves to and from the tier: LMCache's connector (loads stall the batch, Mooncake over RDMA), "
        "vLLM's Mooncake-store connector (asynchronous, RDMA) or vLLM's offloading connector (asynchronous, "
        "host DRAM) (default %(default)s)",
    )
    p.add_argument(
        "--layerwise",
        action="store_true",
        help="with --tier-path lmcache: LMCache's layer-wise pipelining (the load overlaps the step's compute)",
    )
    p.add_argument(
        "--turns",
        choices=TURN_FEEDS,
        default=ENGINE_DEFAULTS["turns"],
        help="what the router hears of a request's turn: request (the turn it carries, as its re-sent history "
        "shows) or index (nothing: inferred from the index); sessionless traces carry none (default %(default)s)",
    )
    p.add_argument(
        "--answer-rerender-share",
        type=float,
        default=ENGINE_DEFAULTS["answer_rerender_share"],
        help="share of an answer's tokens the next turn re-sends token for token; their blocks stay cached on "
        "the instance that generated them, so the next turn hits them there (default %(default)s)",
    )
    p.add_argument(
        "--router-replicas",
        type=int,
        default=ENGINE_DEFAULTS["router_replicas"],
        help="router replicas behind a round-robin load balancer, each with its own index and load board "
        "(default %(default)s)",
    )
    p.add_argument(
        "--replica-sync",
        choices=REPLICA_SYNCS,
        default=ENGINE_DEFAULTS["replica_sync"],
        help="with --router-replicas > 1: off (each replica counts only its own requests) or bus (each applies "
        "the others' load effects --replica-sync-delay-ms late, as smetric serve --replica-bus) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--replica-sync-delay-ms",
        type=float,
        default=1e3 * ENGINE_DEFAULTS["replica_sync_delay_s"],
        help="with --replica-sync bus: ms from a replica's load effect to the others' boards (default %(default)g)",
    )
    p.add_argument(
        "--session-admission",
        choices=SESSION_ADMISSIONS,
        default=ENGINE_DEFAULTS["session_admission"],
        help="session admission after the policy: off, pause (ThunderAgent's per-pod form: pause idle sessions, "
        "else hold the request at its instance) or smetric (else place it on another instance with KV room and the "
        "cheapest source for its prefix, else hold) (default %(default)s)",
    )
    p.add_argument(
        "--admission-max-hold-s",
        type=float,
        default=None,
        help="with --session-admission: the longest a request is held before it is admitted where its policy sent "
        "it (default: the mode's own; pause holds until there is room)",
    )
    p.add_argument(
        "--tpot-ms",
        default=",".join(f"{1e3 * t:g}" for t in ENGINE_DEFAULTS["slo"]["tpot_s"]),
        help="TPOT bounds in ms, the first is the headline (default %(default)s)",
    )
    p.add_argument(
        "--tbt-tail-ms",
        default="",
        help="tail-TBT bounds in ms (mean of a request's longest tenth of token gaps, Mooncake's TBT); each adds "
        "an SLO setting: the headline TTFT and TPOT bounds plus that bound (default: none)",
    )
    p.add_argument(
        "--slo",
        default="",
        help="named SLO settings to score beside the others, comma-separated: "
        + ", ".join(
            f"{name} ({slo(ENGINE_DEFAULTS['profile']).label} for the default profile)"
            for name, slo in NAMED_SLOS.items()
        )
        + " (default: none)",
    )
    p.add_argument(
        "--ttft-base-s",
        type=float,
        default=ENGINE_DEFAULTS["slo"]["ttft_base_s"],
        help="TTFT bound at zero prompt tokens (default %(default)s s)",
    )
    p.add_argument(
        "--ttft-ms-per-token",
        type=float,
        default=1e3 * ENGINE_DEFAULTS["slo"]["ttft_s_per_token"],
        help="TTFT bound growth per prompt token (default %(default)s ms)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=w.duration_s,
        help="session traces: sessions start for this long; the window ends here (default %(default)s)",
    )
    p.add_argument("--warmup-s", type=float, default=w.warmup_s, help="not measured (default %(default)s s)")
    p.add_argument(
        "--max-think-s",
        type=float,
        default=w.max_think_s,
        help="cap on think times, session traces (default %(default)s s)",
    )
    p.add_argument("--coarsen", type=int, help="Weka: 64-token ids per block (loader default: 4)")
    p.add_argument(
        "--no-shared-prefix",
        action="store_true",
        help="Weka: do not share the tool + system-prompt blocks across sessions",
    )
    p.add_argument(
        "--pd",
        action="store_true",
        help="disaggregated prefill/decode: --prefill-instances run prefills, --decode-instances pull the KV "
        "and decode",
    )
    p.add_argument("--prefill-instances", type=int, help="with --pd: prefill instances")
    p.add_argument("--decode-instances", type=int, help="with --pd: decode instances")
    p.add_argument(
        "--decode-rule",
        choices=DECODE_RULES,
        help="with --pd: decode-side rule (default: the policy's peer form: kv_fit for smetric, round_robin "
        "for round_robin, power_of_two otherwise)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _trace(args: argparse.Namespace) -> TraceSpec:
    if args.format == "synthetic":
        # Generated agent sessions at the generator's defaults (no file).
        return TraceSpec.synthetic_sessions() if not args.trace else _die("--format synthetic reads no --trace")
    if args.format == "codex":
        # Sessions from the Codex trace's published statistics (no file), seeded.
        if args.trace:
            _die("--format codex reads no --trace")
        return TraceSpec.codex_sessions(seed=args.codex_seed)
    if not args.trace:
        return TraceSpec.embedded() if args.format in (None, "weka") else _die("--format needs --trace")
    fmt = args.format or guess_format(args.trace[0])
    if fmt is None:
        _die(f"cannot guess the format of {args.trace[0]}; pass --format")
    return TraceSpec(
        paths=tuple(args.trace),
        format=fmt,
        coarsen=args.coarsen,
        shared_prefix=False if args.no_shared_prefix else None,
    )


def _names(text: str, known: tuple[str, ...] | None, flag: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if known is not None and x not in known]
    if unknown:
        _die(f"{flag}: unknown {', '.join(unknown)}; known: {', '.join(known or ())}")
    return names


def _die(message: str) -> NoReturn:
    print(f"smetric: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _replicas_label(config: SimulationConfig) -> str:
    if config.router_replicas == 1:
        return ""
    sync = f"bus {1e3 * config.replica_sync_delay_s:g} ms" if config.replica_sync == "bus" else "unsynced"
    return f"{config.router_replicas} router replicas ({sync}), "


def _config(args: argparse.Namespace) -> tuple[SimulationConfig, Window, list[str]]:
    base = SLO(ttft_base_s=args.ttft_base_s, ttft_s_per_token=args.ttft_ms_per_token / 1e3)
    slos = tuple(replace(base, tpot_s=t / 1e3) for t in _floats(args.tpot_ms))
    if not slos:
        _die("--tpot-ms needs at least one bound")
    tails = _floats(args.tbt_tail_ms)
    if any(not t > 0 for t in tails):
        _die("--tbt-tail-ms bounds must be > 0")
    slos += tuple(replace(slos[0], tbt_tail_s=t / 1e3) for t in tails)
    config = _profile(SimulationConfig(instances=args.instances, profile=args.profile), args)
    for name in _names(args.slo, tuple(NAMED_SLOS), "--slo"):
        slos += (NAMED_SLOS[name](config.profile),)
    if not 0.0 <= args.answer_rerender_share <= 1.0:
        _die("--answer-rerender-share must be in [0, 1]")
    config = replace(config, slos=slos, answer_rerender_share=args.answer_rerender_share)
    if args.layerwise and args.tier_path != "lmcache":
        _die("--layerwise needs --tier-path lmcache")
    config = config.with_tier_path(args.tier_path, layerwise=args.layerwise)
    if args.no_global_tier:
        config = config.with_tier(False)
    config = config.with_turns(args.turns)
    if args.router_replicas < 1:
        _die("--router-replicas must be >= 1")
    if not args.replica_sync_delay_ms >= 0:
        _die("--replica-sync-delay-ms must be >= 0")
    if args.router_replicas > 1 and args.pd:
        _die("--router-replicas > 1 runs co-located (PD mode runs one router)")
    if args.session_admission != "off" and (args.pd or args.router_replicas > 1):
        _die("--session-admission runs with one co-located router")
    if args.admission_max_hold_s is not None and not (0 <= args.admission_max_hold_s < math.inf):
        _die("--admission-max-hold-s must be a finite number >= 0")
    config = replace(
        config,
        session_admission=args.session_admission,
        session_admission_max_hold_s=args.admission_max_hold_s,
        router_replicas=args.router_replicas,
        replica_sync=args.replica_sync,
        replica_sync_delay_s=args.replica_sync_delay_ms / 1e3,
    )
    if args.pd:
        if args.prefill_instances is None or args.decode_instances is None:
            _die("--pd needs --prefill-instances and --decode-instances")
        try:
            config = config.with_pd(args.prefill_instances, args.decode_instances, args.decode_rule)
        except ValueError as e:
            _die(str(e))
    elif args.prefill_instances is not None or args.decode_instances is not None or args.decode_rule is not None:
        _die("--prefill-instances, --decode-instances and --decode-rule need --pd")
    window = Window(duration_s=args.duration_s, warmup_s=args.warmup_s, max_think_s=args.max_think_s)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        policy_router(p)  # raises UnknownPolicyError early
    return config, window, policies


def _profile(config: SimulationConfig, args: argparse.Namespace) -> SimulationConfig:
    """``config`` with ``--profile-file`` and the profile knobs applied (checked by the engine now)."""
    overrides: dict[str, float] = {}
    for flag, field_name, scale, _ in PROFILE_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            overrides[field_name] = value * scale if scale != 1.0 else value
    try:
        if args.profile_file:
            config = config.with_profile_file(args.profile_file)
        if overrides:
            config = config.with_profile_overrides(**overrides)
    except InvalidConfigError as e:
        _die(f"{e.field}: {e.reason}")
    except OSError as e:
        _die(f"--profile-file: {e}")
    return config


def _run_info(trace: TraceSpec, config: SimulationConfig, window: Window, **extra: Any) -> dict[str, Any]:
    return {
        "smetric_version": __version__,
        "trace": {"name": trace.name, "paths": list(trace.paths), "format": trace.format},
        "config": config.describe(),
        "window": {
            "duration_s": window.duration_s,
            "warmup_s": window.warmup_s,
            "max_think_s": window.max_think_s,
            "open_warmup_share": window.open_warmup_share,
        },
        **extra,
    }


def _tier_label(config: SimulationConfig) -> str:
    tier = config.global_tier
    if not tier.enabled:
        return "off"
    return f"on ({tier.path}{', layer-wise' if tier.layerwise else ''})"


def simulate_command(args: argparse.Namespace) -> int:
    """``smetric simulate``."""
    started = time.perf_counter()
    trace = _trace(args)
    config, window, policies = _config(args)
    feeds = _names(args.index_feeds, INDEX_FEEDS, "--index-feeds")
    feed_policies = [p for p in _names(args.feed_policies, None, "--feed-policies") if p in policies]
    if args.event_delay_ms < 0:
        _die("--event-delay-ms must be >= 0")
    workload = load_trace(trace)
    unit = load_unit(workload)
    nominal = (
        args.load
        if args.load is not None
        else (
            ENGINE_DEFAULTS["session_rate_per_s"]
            if workload.arrival == "closed_loop"
            else ENGINE_DEFAULTS["time_scale"]
        )
    )
    loads = sorted({round(nominal * f, 9) for f in _floats(args.ladder)} | {nominal})
    print(
        f"smetric {__version__} simulate: {trace.name} ({len(workload):,} requests, {workload.sessions} sessions, "
        f"{workload.arrival}), {config.instances} x {config.profile_label}"
        f"{f' (PD {config.pd.label})' if config.pd else ''}, global tier "
        f"{_tier_label(config)}, turns from {config.turns}, {_replicas_label(config)}policies {', '.join(policies)}, "
        f"loads {', '.join(f'{x:g}' for x in loads)} {unit}",
        file=sys.stderr,
    )
    specs = [
        RunSpec(trace, config, window, policy=p, load=x, seed=args.seed, detail=x == nominal)
        for p in policies
        for x in loads
    ]
    feed_specs = [
        RunSpec(trace, config.with_feed(f, args.event_delay_ms / 1e3), window, policy=p, load=nominal, seed=args.seed)
        for p in feed_policies
        for f in feeds
        if f != config.index_feed
    ]
    results = run_grid(specs + feed_specs, jobs=args.jobs, progress=False if args.no_progress else None)
    feed_runs = [r for r in results if r.spec.config.index_feed != config.index_feed]
    results = [r for r in results if r.spec.config.index_feed == config.index_feed]
    # Each feed policy's run with the default feed is the main grid's nominal run.
    feed_runs += [r for r in results if r.spec.detail and r.spec.policy in feed_policies]
    feed_runs.sort(key=lambda r: (feed_policies.index(r.spec.policy), INDEX_FEEDS.index(r.spec.config.index_feed)))
    at_nominal = [r for r in results if r.spec.load == nominal]
    summaries = summarize(results)
    print(comparison_table(at_nominal, summaries, slos=config.slos, load_unit=unit))
    verdict = verdict_line(results, summaries, load_unit=unit)
    if verdict:
        print("\n" + verdict)
    if len(feed_runs) > len(feed_policies):
        print("\n" + index_feed_table(feed_runs, slos=config.slos))
    info = _run_info(
        trace,
        config,
        window,
        load=nominal,
        load_unit=unit,
        loads=loads,
        seed=args.seed,
        policies=policies,
        index_feeds={"policies": feed_policies, "feeds": feeds, "event_delay_s": args.event_delay_ms / 1e3},
        wall_s=time.perf_counter() - started,
        run_wall_s={
            f"{r.spec.policy}@{r.spec.load:g}[{r.spec.config.index_feed}]": r.wall_s for r in results + feed_runs
        },
    )
    paths = write_outputs(
        Path(args.out),
        nominal=at_nominal,
        summaries=summaries,
        slos=config.slos,
        load_unit=unit,
        run_info=info,
        feeds=feed_runs if len(feed_runs) > len(feed_policies) else (),
    )
    print(f"\nwrote {', '.join(str(p) for p in paths)} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _sweep_table(summaries: list[PolicySummary], unit: str, slo: SLO) -> str:
    lines = [
        f"{slo.label}",
        f"{'policy':<20} {'tier':>4} {'peak TPS<=SLO':>13} {'at load':>8} {'max load, attain>=90%':>22} "
        f"{'collapsed at':>12}",
    ]
    for s in sorted(summaries, key=lambda s: (not s.tier, s.policy)):
        sustainable = "none" if s.max_load_at_target is None else f"{s.max_load_at_target:g}"
        collapsed = "not reached" if s.collapsed_at is None else f"{s.collapsed_at:g}"
        lines.append(
            f"{s.policy:<20} {'on' if s.tier else 'off':>4} {s.peak_tps_under_slo:>13,.0f} "
            f"{s.load_at_peak:>8g} {sustainable:>22} {collapsed:>12}"
        )
    return (
        "\n".join(lines)
        + f"\n(loads in {unit}; collapsed: attainment < {COLLAPSE_ATTAINMENT:.0%} at or past the peak, which the"
        + " ladder then brackets)"
    )


def sweep_command(args: argparse.Namespace) -> int:
    """``smetric sweep``."""
    started = time.perf_counter()
    trace = _trace(args)
    config, window, policies = _config(args)
    workload = load_trace(trace)
    unit = load_unit(workload)
    tiers = {"on": [True], "off": [False], "both": [True, False]}[args.tier]
    if args.no_global_tier:
        tiers = [False]
    seeds = [int(s) for s in args.seeds.split(",")]
    loads = _floats(args.loads)
    specs = [
        RunSpec(trace, config.with_tier(t), window, policy=p, load=x, seed=s)
        for t in tiers
        for p in policies
        for x in loads
        for s in seeds
    ]
    print(
        f"smetric sweep: {trace.name}, {len(specs)} runs ({len(policies)} policies x {len(loads)} loads x "
        f"{len(seeds)} seeds x {len(tiers)} tier settings), {args.jobs} processes",
        file=sys.stderr,
    )
    progress = False if args.no_progress else None
    if args.until_collapse and not (args.ladder_step > 1.0 and args.max_extra_rungs >= 0):
        _die("--ladder-step must be > 1 and --max-extra-rungs >= 0")
    if args.until_collapse:
        results = run_until_collapse(
            specs, step=args.ladder_step, max_extra_rungs=args.max_extra_rungs, jobs=args.jobs, progress=progress
        )
    else:
        results = run_grid(specs, jobs=args.jobs, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("\n".join(slo_lines(config.slos)))
    by_slo = []
    for k, slo in enumerate(config.slos):
        summaries = summarize(results, slo_index=k)
        print("\n" + _sweep_table(summaries, unit, slo))
        verdict = verdict_line(results, summaries, load_unit=unit, slo_index=k)
        if verdict:
            print(verdict)
        by_slo.append({"slo": slo.label, "policies": [vars(s) for s in summaries]})
        plot_tps_vs_load(
            out / f"tps_vs_load_slo{k}.png",
            summaries,
            load_unit=unit,
            slo=slo,
            title=f"{trace.name}, {config.instances} instances",
        )
    payload = {
        "run": _run_info(
            trace,
            config,
            window,
            loads=loads,
            until_collapse={"step": args.ladder_step, "max_extra_rungs": args.max_extra_rungs}
            if args.until_collapse
            else None,
            seeds=seeds,
            tiers=tiers,
            policies=policies,
            load_unit=unit,
            wall_s=time.perf_counter() - started,
        ),
        "summaries": by_slo,
        "runs": [_run_record(r) for r in results],
    }
    (out / "sweep.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(
        f"\nwrote {out / 'sweep.json'} and {len(config.slos)} plot(s) in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


def _run_record(r: RunResult) -> dict[str, Any]:
    return {
        "policy": r.spec.policy,
        "load": r.spec.load,
        "seed": r.spec.seed,
        "global_tier": r.spec.tier,
        "wall_s": r.wall_s,
        "metrics": r.metrics,
        "by_slo": r.slos,
    }


def configure(command: str, parser: argparse.ArgumentParser) -> None:
    """Adds the arguments of ``simulate`` or ``sweep`` to the parser :mod:`smetric.cli` made for it.

    Raises:
        InvalidArgumentError: ``command`` is neither.
    """
    if command == "simulate":
        _configure_simulate(parser)
    elif command == "sweep":
        _configure_sweep(parser)
    else:
        raise InvalidArgumentError(
            f"not a simulator command: {command!r}", argument="command", reason="neither simulate nor sweep"
        )


def _configure_simulate(sim: argparse.ArgumentParser) -> None:
    sim.description = __doc__.split("\n\n")[1] if __doc__ else None
    _add_common(sim)
    sim.add_argument(
        "--load",
        type=float,
        help="sessions/s (session traces) or trace speed-up (timestamped "
        "traces); default: the engine's session rate, or 1x",
    )
    sim.add_argument(
        "--ladder",
        default=",".join(f"{f:g}" for f in LADDER),
        help="loads of the TPS-vs-load curve, as multiples of --load (default %(default)s)",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--index-feeds",
        default=",".join(INDEX_FEEDS),
        help="router index feeds to compare at the nominal load: approximate (insert on route), events "
        "(vLLM KV-event batches), oracle (default %(default)s)",
    )
    sim.add_argument(
        "--feed-policies",
        default="smetric",
        help="policies run under every --index-feeds entry (default %(default)s; empty: none)",
    )
    sim.add_argument(
        "--event-delay-ms",
        type=float,
        default=1e3 * ENGINE_DEFAULTS["event_delay_s"],
        help="KV-event publication-to-index delay of the events feed (default %(default)s ms)",
    )
    sim.add_argument("--out", default="results/simulate", help="output directory (default %(default)s)")
    sim.set_defaults(func=simulate_command)


def _configure_sweep(sweep: argparse.ArgumentParser) -> None:
    _add_common(sweep)
    sweep.add_argument("--loads", required=True, help="comma-separated loads (sessions/s or speed-up)")
    sweep.add_argument("--seeds", default="0", help="comma-separated seeds (default %(default)s)")
    sweep.add_argument("--tier", choices=("on", "off", "both"), default="on", help="global KV$ tier (default on)")
    sweep.add_argument(
        "--until-collapse",
        action="store_true",
        # `%` doubled: argparse formats help strings with `%`.
        help=f"extend each policy's ladder past --loads, x{LADDER_STEP:g} a rung, until its attainment falls below "
        f"{COLLAPSE_ATTAINMENT:.0%}% under every SLO (or --max-extra-rungs), so that every peak is bracketed",
    )
    sweep.add_argument(
        "--ladder-step",
        type=float,
        default=LADDER_STEP,
        help="--until-collapse: load ratio between rungs (default %(default)s)",
    )
    sweep.add_argument(
        "--max-extra-rungs",
        type=int,
        default=MAX_EXTRA_RUNGS,
        help="--until-collapse: rungs added at most per policy (default %(default)s)",
    )
    sweep.add_argument("--out", default="results/sweep", help="output directory (default %(default)s)")
    sweep.set_defaults(func=sweep_command)
