"""The cluster simulator: replay agent traces on a simulated vLLM fleet and compare policies.

The engine is Rust (``smetric-sim``, bound as :func:`smetric._core.simulate`); it routes
every request through the same ``Router`` the package ships. This package adds the typed
configuration (:mod:`.config`), parallel runs and load sweeps (:mod:`.runner`) and the
tables, ``results.json`` and plots (:mod:`.report`). The command line is ``smetric simulate``
and ``smetric sweep``.

    >>> from smetric.sim import RunSpec, SimulationConfig, TraceSpec, Window, run_one
    >>> spec = RunSpec(TraceSpec.embedded(), SimulationConfig(), Window(), policy="smetric", load=0.05)
    >>> result = run_one(spec)  # doctest: +SKIP
    >>> result.metrics["tps_under_slo"], result.metrics["follow_up_return"]  # doctest: +SKIP
"""

from __future__ import annotations

from smetric._core import (
    Workload,
    load_workload,
    sim_config_defaults,
    sim_profiles,
    sim_tier_paths,
    simulate,
    synthetic_defaults,
    workload_reuse_stats,
)
from smetric._types import (
    ArrivalKind,
    GlobalTierSettings,
    IndexFeed,
    LoadSeries,
    Percentiles,
    RequestRecords,
    SimConfigDefaults,
    SimReport,
    SloResult,
    SloSettings,
    SyntheticOptions,
    TierPath,
    TraceFormat,
    TurnFeed,
)
from smetric.sim.config import (
    DECODE_RULES,
    DEFAULT_SLOS,
    FORMATS,
    INDEX_FEEDS,
    MOONCAKE_SEGMENT_BYTES_PER_RANK,
    NAMED_SLOS,
    PAPER_SLO,
    PAPER_SLO_235B,
    PD_DEFAULTS,
    POLICY_VARIANTS,
    SLO,
    SYNTHETIC_DEFAULTS,
    TIER_PATHS,
    TURN_FEEDS,
    GlobalTier,
    PdLayout,
    SimulationConfig,
    TraceSpec,
    Window,
    embedded_trace_path,
    policy_router,
)
from smetric.sim.runner import (
    ATTAINMENT_TARGET,
    COLLAPSE_ATTAINMENT,
    PolicySummary,
    RunResult,
    RunSpec,
    load_trace,
    load_unit,
    run_grid,
    run_one,
    run_until_collapse,
    summarize,
)

__all__ = [
    "ATTAINMENT_TARGET",
    "COLLAPSE_ATTAINMENT",
    "DECODE_RULES",
    "DEFAULT_SLOS",
    "FORMATS",
    "INDEX_FEEDS",
    "MOONCAKE_SEGMENT_BYTES_PER_RANK",
    "NAMED_SLOS",
    "PAPER_SLO",
    "PAPER_SLO_235B",
    "PD_DEFAULTS",
    "POLICY_VARIANTS",
    "SLO",
    "SYNTHETIC_DEFAULTS",
    "TIER_PATHS",
    "TURN_FEEDS",
    "ArrivalKind",
    "GlobalTier",
    "GlobalTierSettings",
    "IndexFeed",
    "LoadSeries",
    "PdLayout",
    "Percentiles",
    "PolicySummary",
    "RequestRecords",
    "RunResult",
    "RunSpec",
    "SimConfigDefaults",
    "SimReport",
    "SimulationConfig",
    "SloResult",
    "SloSettings",
    "SyntheticOptions",
    "TierPath",
    "TraceFormat",
    "TraceSpec",
    "TurnFeed",
    "Window",
    "Workload",
    "embedded_trace_path",
    "load_trace",
    "load_unit",
    "load_workload",
    "policy_router",
    "run_grid",
    "run_one",
    "run_until_collapse",
    "sim_config_defaults",
    "sim_profiles",
    "sim_tier_paths",
    "simulate",
    "summarize",
    "synthetic_defaults",
    "workload_reuse_stats",
]
