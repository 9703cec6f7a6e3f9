"""Typed configuration of a simulation run.

Every engine default comes from the Rust ``SimConfig::default()`` through
:func:`smetric._core.sim_config_defaults` — nothing here restates an engine number. What this
module adds is the *experiment design* the engine leaves to its caller:

* :class:`SLO` — one SLO setting (length-aware TTFT bound + TPOT bound, optionally a tail-TBT
  bound). The defaults are the engine's: TTFT ≤ 2 s + 0.1 ms per prompt token (the 2 s is
  perf-model §5's fixed tier for short prompts; the slope is twice the H20 prefill cost of
  50 µs/token, so a cold prompt on an idle instance meets it up to ≈35K tokens and longer ones
  only with cache hits), TPOT ≤ 100 ms and ≤ 50 ms (§5's two tiers; the first is the headline),
  no tail-TBT bound (Mooncake's TBT: the mean of a request's longest tenth of token gaps; a
  stall that a mean TPOT hides shows in it).
* :class:`TraceSpec` — which trace, in which format, with which loader options.
* :class:`Window` — how a closed-loop (session) trace becomes a steady load: sessions start
  as a Poisson stream for ``duration_s`` seconds (the trace is replicated with private block
  ids as often as the rate needs), the first ``warmup_s`` seconds are not measured, nothing
  is issued after ``duration_s``, and think times are capped at ``max_think_s``.
* :data:`POLICY_VARIANTS` — report names that are a policy plus a router setting
  (``cache_first_max_hit``: the deterministic variant of the Bailian scheduler).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Final, get_args

from smetric import POLICIES
from smetric._core import (
    DECODE_RULES as CORE_DECODE_RULES,
)
from smetric._core import (
    L_EQ_QWEN3_235B_A22B,
    L_EQ_QWEN3_CODER_30B_A3B,
    MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK,
    RouterConfig,
    sim_config_defaults,
    sim_pd_defaults,
    sim_profile,
    synthetic_defaults,
)
from smetric._types import (
    DecodeRule,
    GlobalTierSettings,
    IndexFeed,
    PdSettings,
    PolicyName,
    ReplicaSync,
    ResolvedProfile,
    SessionAdmissionMode,
    SimConfigDefaults,
    SloSettings,
    SyntheticOptions,
    TierPath,
    TraceFormat,
    TurnFeed,
)
from smetric.errors import UnknownPolicyError

ENGINE_DEFAULTS: Final[SimConfigDefaults] = sim_config_defaults()
"""The engine's `SimConfig::default()` (read, never restated)."""
_TIER: Final[GlobalTierSettings] = ENGINE_DEFAULTS["global_tier"]
_SLO: Final[SloSettings] = ENGINE_DEFAULTS["slo"]

DECODE_RULES: Final[tuple[DecodeRule, ...]] = CORE_DECODE_RULES
"""How a PD run picks decode instances (``PdLayout.decode_rule``; ``None`` there: the prefill
policy's peer form)."""

PD_DEFAULTS: Final[PdSettings] = sim_pd_defaults()
"""The engine's `PdSimConfig::default()`: a PD run's transfer settings (read, never restated)."""

SYNTHETIC_DEFAULTS: Final[SyntheticOptions] = synthetic_defaults()
"""The synthetic agent-session generator's `SyntheticOptions::default()` (read, never restated)."""

CODEX_OPTIONS: Final[tuple[str, ...]] = ("sessions", "seed", "block_tokens", "max_context_tokens")
"""Options of the ``"codex"`` generator (``rust/smetric-sim/src/workload/codex.rs``)."""

FORMATS: Final[tuple[TraceFormat, ...]] = get_args(TraceFormat)
"""Trace formats :func:`smetric._core.load_workload` reads."""


def _rule_fields(config: RouterConfig) -> dict[str, Any]:
    """The ``smetric_*`` fields of a preset but ``smetric_l_eq_tokens``, a property of the served
    model that the run's profile sets (:func:`profile_l_eq_tokens`)."""
    return {k: v for k, v in config.to_dict().items() if k.startswith("smetric_") and k != "smetric_l_eq_tokens"}


POLICY_VARIANTS: Final[dict[str, tuple[PolicyName, dict[str, Any]]]] = {
    "cache_first_max_hit": ("cache_first", {"cache_first_mode": "max_hit"}),
    "cache_first_argmax": ("cache_first", {"cache_first_mode": "argmax"}),
    "smetric_paper": ("smetric", _rule_fields(RouterConfig().paper())),
    "smetric_v2_port": ("smetric", _rule_fields(RouterConfig().v2_port())),
    # The shipped configuration's ablations: the mask told each request's recorded output
    # length (the simulator's oracle), and the drain rate learned instead of fixed.
    "smetric_paper_oracle": ("smetric", _rule_fields(RouterConfig().paper()) | {"smetric_decode_mask": "oracle"}),
    "smetric_paper_learned_rate": ("smetric", _rule_fields(RouterConfig().paper()) | {"smetric_drain_rate": None}),
    "smetric_v1": ("smetric", _rule_fields(RouterConfig().v1())),
    "vllm_router_smetric_pr": ("vllm_router_smetric", {"vllm_router_smetric_form": "pr_literal"}),
}
"""Extra report names: the core policy and the :class:`RouterConfig` fields it sets.
``smetric_paper`` is SMetric as its authors ship it co-located (the v2 SLO-feasibility rule with
local-only pricing, the honest decode-contract mask and a fixed drain rate: ``RouterConfig.paper()``,
the core's ``RouterConfig::PAPER``); ``smetric_v2_port`` is our port of the v2 rule that
``smetric_paper`` named before (a global hit free, no mask, a learned rate:
``RouterConfig.v2_port()``, ``RouterConfig::V2_PORT``); ``smetric_paper_oracle`` and
``smetric_paper_learned_rate`` are the shipped configuration's ablations (the mask with recorded
output lengths; the learned drain rate); ``smetric_v1`` is the July paper's
overload-threshold rule (``RouterConfig.v1()``, ``RouterConfig::V1``: what ``smetric_paper``
named before v2), next to ``smetric`` with its smetric+ defaults. A variant
sets every ``smetric_*`` field; the smetric+ switches (``smetric_kv_fit``,
``smetric_migration``) sit on top of either rule as ``smetric`` with ``smetric_rule`` and the
switches in its router config. ``vllm_router_smetric_pr`` is vllm-router's SMetric as PR #330
ships it (``RouterConfig.vllm_router_smetric_form = "pr_literal"``)."""


def is_235b_profile(profile: str) -> bool:
    """Whether a simulator profile serves Qwen3-235B-A22B (else it serves Qwen3-Coder-30B-A3B)."""
    return "qwen3-235b" in profile


def profile_l_eq_tokens(profile: str) -> float:
    """``RouterConfig.smetric_l_eq_tokens`` of the model a simulator profile serves."""
    return L_EQ_QWEN3_235B_A22B if is_235b_profile(profile) else L_EQ_QWEN3_CODER_30B_A3B


TIER_PATHS: Final[tuple[TierPath, ...]] = get_args(TierPath)
"""How KV moves to and from the global tier (the engine's ``TierPath``; the default first):
``lmcache`` — LMCache's connector, loads inside the admitting step (the batch waits), Mooncake
over RDMA; ``mooncake-store`` — vLLM's Mooncake-store connector, asynchronous loads, RDMA;
``cpu-offload`` — vLLM's offloading connector, asynchronous, host DRAM."""

MOONCAKE_SEGMENT_BYTES_PER_RANK: Final[int] = MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK
"""The store capacity each rank contributes under vLLM's Mooncake-store defaults (4 GiB):
``GlobalTier(capacity_bytes=instances · tp · MOONCAKE_SEGMENT_BYTES_PER_RANK)`` is the small end
of a capacity sweep."""

INDEX_FEEDS: Final[tuple[IndexFeed, ...]] = get_args(IndexFeed)
"""How the router's KV$ index can be fed in a run: insert on route; the engines' vLLM KV-event
batches (through the production encoder and ingestor, ``event_delay_s`` late); or an oracle that
sees every cache change the instant it happens."""

TURN_FEEDS: Final[tuple[TurnFeed, ...]] = get_args(TurnFeed)
REPLICA_SYNCS: Final[tuple[ReplicaSync, ...]] = get_args(ReplicaSync)
"""How simulated router replicas share their in-flight work (``SimulationConfig.replica_sync``)."""
SESSION_ADMISSIONS: Final[tuple[SessionAdmissionMode, ...]] = get_args(SessionAdmissionMode)
"""Session admission modes (``SimulationConfig.session_admission``)."""
"""What a run tells the router of each request's turn: ``request`` — the turn the request carries
(a session's k-th request has turn k, as its re-sent history shows a real router); ``index`` —
nothing, the router infers first turns from its index. Sessionless traces (Mooncake, Azure)
carry no turn, so both route them alike."""

EMBEDDED_TRACE: Final[str] = "weka_excerpt.jsonl.gz"
"""The Weka excerpt shipped in ``smetric/data`` (licence: ``LICENSE-weka-excerpt.txt``)."""


def policy_router(name: str, base: RouterConfig | None = None) -> tuple[PolicyName, RouterConfig | None]:
    """The core policy and router config behind a report name (a policy or a variant).

    Raises:
        UnknownPolicyError: ``name`` is neither a policy nor a variant.
    """
    if name in POLICIES:
        return name, base
    if name in POLICY_VARIANTS:
        policy, fields = POLICY_VARIANTS[name]
        settings: dict[str, Any] = dict(base.to_dict()) if base is not None else {}
        settings.update(fields)
        return policy, RouterConfig(**settings)
    known = [*POLICIES, *POLICY_VARIANTS]
    raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(known)}", name=name, known=known)


@dataclass(frozen=True)
class SLO:
    """One SLO setting: TTFT ≤ ``ttft_base_s + ttft_s_per_token · prompt tokens``, TPOT ≤ ``tpot_s``
    and, when ``tbt_tail_s`` is set, tail TBT (mean of the longest tenth of token gaps) ≤ it.

    With ``e2e_s_per_output_token`` set it is instead the SMetric paper's end-to-end form
    (:mod:`smetric.sim.end_to_end_slo`): finish − arrival ≤ the TTFT bound +
    ``e2e_s_per_output_token · output tokens``, scored from the run's request records; requests
    whose output exceeds ``max_output_tokens`` are then not measured. :data:`PAPER_SLO` is the
    paper's setting."""

    ttft_base_s: float = _SLO["ttft_base_s"]
    ttft_s_per_token: float = _SLO["ttft_s_per_token"]
    tpot_s: float = _SLO["tpot_s"][0]
    tbt_tail_s: float | None = _SLO["tbt_tail_s"]
    e2e_s_per_output_token: float | None = None
    max_output_tokens: int | None = None

    @property
    def end_to_end(self) -> bool:
        """Whether this is an end-to-end budget (scored in Python, not by the engine)."""
        return self.e2e_s_per_output_token is not None

    @property
    def label(self) -> str:
        """A short human-readable form, e.g. ``TTFT≤2s+0.1ms/tok TPOT≤100ms`` (``… TBTtail≤200ms``),
        or ``e2e≤1s+0.0625ms/tok+20ms/out (out≤16384)`` for an end-to-end budget."""
        ttft = f"{self.ttft_base_s:g}s+{self.ttft_s_per_token * 1e3:g}ms/tok"
        if self.e2e_s_per_output_token is not None:
            label = f"e2e≤{ttft}+{self.e2e_s_per_output_token * 1e3:g}ms/out"
            return label if self.max_output_tokens is None else f"{label} (out≤{self.max_output_tokens})"
        label = f"TTFT≤{ttft} TPOT≤{self.tpot_s * 1e3:g}ms"
        return label if self.tbt_tail_s is None else f"{label} TBTtail≤{self.tbt_tail_s * 1e3:g}ms"

    def to_dict(self) -> dict[str, float | None]:
        """Plain fields (for results.json)."""
        return {
            "ttft_base_s": self.ttft_base_s,
            "ttft_s_per_token": self.ttft_s_per_token,
            "tpot_s": self.tpot_s,
            "tbt_tail_s": self.tbt_tail_s,
            "e2e_s_per_output_token": self.e2e_s_per_output_token,
            "max_output_tokens": self.max_output_tokens,
        }


PAPER_SLO: Final[SLO] = SLO(
    ttft_base_s=1.0,
    ttft_s_per_token=1.0 / 16_000.0,
    tpot_s=0.020,
    tbt_tail_s=None,
    e2e_s_per_output_token=0.020,
    max_output_tokens=16_384,
)
"""The SMetric paper's SLO for Qwen3-Coder-30B-A3B co-located (the simulator's profile; the
235B profile's is 33 ms per output token): end-to-end ≤ 1 s + input/16,000 s + 20 ms per output
token, requests with more than 16,384 output tokens dropped. Its TTFT part, ``1 + input/16000``,
is the paper's prefill-only budget (the run's ``prefill_tps_under_slo``)."""

PAPER_SLO_235B: Final[SLO] = replace(PAPER_SLO, tpot_s=0.033, e2e_s_per_output_token=0.033)
"""The paper's SLO for Qwen3-235B-A22B: 33 ms per output token."""


def paper_slo(profile: str) -> SLO:
    """The paper's SLO for the model a simulator profile serves."""
    return PAPER_SLO_235B if is_235b_profile(profile) else PAPER_SLO


NAMED_SLOS: Final[dict[str, Callable[[str], SLO]]] = {"paper": paper_slo}
"""SLO settings by name (``smetric simulate/sweep --slo NAME``), each a function of the profile."""


DEFAULT_SLOS: Final[tuple[SLO, ...]] = tuple(SLO(tpot_s=t) for t in _SLO["tpot_s"])
"""The engine's SLOs: its TTFT bound with each of its TPOT bounds (the first is the headline)."""


@dataclass(frozen=True)
class GlobalTier:
    """The cluster-wide KV$ store, the connector that reaches it, and the links it shares."""

    enabled: bool = _TIER["enabled"]
    path: TierPath = _TIER["path"]
    """One of :data:`TIER_PATHS`."""
    layerwise: bool = _TIER["layerwise"]
    """With ``path="lmcache"``: LMCache's layer-wise pipelining (the load overlaps the step)."""
    capacity_bytes: int = _TIER["capacity_bytes"]
    fetch_latency_s: float = _TIER["fetch_latency_s"]
    bandwidth_bytes_per_s: float | None = _TIER["bandwidth_bytes_per_s"]
    """Load rate per rank; ``None``: the path's measured rate."""
    gpus_per_node: int = _TIER["gpus_per_node"]
    nic_bytes_per_s: float = _TIER["nic_bytes_per_s"]
    pcie_bytes_per_s: float = _TIER["pcie_bytes_per_s"]
    connector_step_overhead_s: float = _TIER["connector_step_overhead_s"]

    def settings(self) -> GlobalTierSettings:
        """The engine's ``global_tier`` dict."""
        return {
            "enabled": self.enabled,
            "path": self.path,
            "layerwise": self.layerwise,
            "capacity_bytes": self.capacity_bytes,
            "fetch_latency_s": self.fetch_latency_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "gpus_per_node": self.gpus_per_node,
            "nic_bytes_per_s": self.nic_bytes_per_s,
            "pcie_bytes_per_s": self.pcie_bytes_per_s,
            "connector_step_overhead_s": self.connector_step_overhead_s,
        }


@dataclass(frozen=True)
class PdLayout:
    """A disaggregated prefill/decode cluster: ``prefill_instances`` run prefills only,
    ``decode_instances`` pull the KV and decode (``rust/smetric-sim/src/cluster/pd.rs``)."""

    prefill_instances: int
    decode_instances: int
    decode_rule: DecodeRule | None = PD_DEFAULTS["decode_rule"]
    """One of :data:`DECODE_RULES`; ``None``: the prefill policy's peer form."""
    transfer_rank_bytes_per_s: float = PD_DEFAULTS["transfer_rank_bytes_per_s"]
    transfer_latency_s: float = PD_DEFAULTS["transfer_latency_s"]

    @property
    def label(self) -> str:
        """``8P:8D``."""
        return f"{self.prefill_instances}P:{self.decode_instances}D"

    def settings(self) -> PdSettings:
        """The engine's ``pd`` dict."""
        return {
            "prefill_instances": self.prefill_instances,
            "decode_instances": self.decode_instances,
            "decode_rule": self.decode_rule,
            "transfer_rank_bytes_per_s": self.transfer_rank_bytes_per_s,
            "transfer_latency_s": self.transfer_latency_s,
        }


@dataclass(frozen=True, kw_only=True)
class SimulationConfig:
    """Cluster, SLOs and measurement of a run; defaults are the engine's.

    ``slos`` lists every SLO setting to score; the first is the headline. The load
    (``session_rate_per_s`` or ``time_scale``), the seed and the measured window are set per
    run by :mod:`smetric.sim.runner`.
    """

    instances: int = ENGINE_DEFAULTS["instances"]
    profile: str = ENGINE_DEFAULTS["profile"]
    """A built-in profile (:func:`smetric._core.sim_profiles`). With ``profile_file`` set it only
    names the served model (the router's ``smetric_l_eq_tokens``, the paper SLO): the file's base."""
    profile_file: str | None = None
    """A profile file (``docs/perf-model.md`` §9) the engine runs instead of ``profile``; see
    :meth:`with_profile_file`."""
    profile_overrides: tuple[tuple[str, float], ...] = ()
    """``Profile`` fields set on top of the profile (or file), as sorted pairs (a mapping given
    here is turned into them), in the struct's units; see :meth:`with_profile_overrides`."""
    max_num_batched_tokens: int = ENGINE_DEFAULTS["max_num_batched_tokens"]
    max_num_seqs: int = ENGINE_DEFAULTS["max_num_seqs"]
    max_model_len: int | None = ENGINE_DEFAULTS["max_model_len"]
    kv_capacity_tokens: int | None = ENGINE_DEFAULTS["kv_capacity_tokens"]
    global_tier: GlobalTier = field(default_factory=GlobalTier)
    slos: tuple[SLO, ...] = DEFAULT_SLOS
    sample_interval_s: float = ENGINE_DEFAULTS["sample_interval_s"]
    load_report_interval_s: float | None = ENGINE_DEFAULTS["load_report_interval_s"]
    max_events: int | None = ENGINE_DEFAULTS["max_events"]
    """Event budget of one run (``SimulationError`` beyond it); ``None``: no limit."""
    index_feed: IndexFeed = ENGINE_DEFAULTS["index_feed"]
    """One of :data:`INDEX_FEEDS`."""
    event_delay_s: float = ENGINE_DEFAULTS["event_delay_s"]
    """With ``index_feed="events"``: seconds from a batch's publication to its application."""
    turns: TurnFeed = ENGINE_DEFAULTS["turns"]
    """One of :data:`TURN_FEEDS`."""
    pd: PdLayout | None = None
    """Disaggregated prefill/decode (``instances`` is then their sum); ``None``: co-located."""
    answer_rerender_share: float = ENGINE_DEFAULTS["answer_rerender_share"]
    """Share of an answer's tokens that the next turn of its session re-sends token for token; their
    blocks stay cached on the instance that generated them, so the next turn hits them there."""
    router_replicas: int = ENGINE_DEFAULTS["router_replicas"]
    """Router replicas behind a round-robin load balancer, each with its own index and load board
    (``smetric serve`` replicas); 1: one router."""
    replica_sync: ReplicaSync = ENGINE_DEFAULTS["replica_sync"]
    """``"off"``: each replica counts only its own requests; ``"bus"``: each applies the others'
    load effects ``replica_sync_delay_s`` late (``smetric serve --replica-bus``)."""
    replica_sync_delay_s: float = ENGINE_DEFAULTS["replica_sync_delay_s"]
    session_admission: SessionAdmissionMode = ENGINE_DEFAULTS["session_admission"]
    """One of :data:`SESSION_ADMISSIONS`: ``"off"`` serves every request where the policy sends it;
    ``"pause"`` / ``"smetric"`` hold back (or, ``smetric``, place elsewhere) a request whose
    instance's resident sessions leave no KV room (the core's ``session_admission``)."""
    session_admission_max_hold_s: float | None = ENGINE_DEFAULTS["session_admission_max_hold_s"]
    """The longest session admission holds a request before admitting it where its policy sent it,
    seconds; ``None``: the mode's own (``"pause"`` holds until there is room)."""
    router: tuple[tuple[str, Any], ...] = ()
    """:class:`RouterConfig` fields to override, as sorted pairs (a ``RouterConfig`` itself does
    not pickle, and specs travel to worker processes); see :meth:`with_router`."""

    def __post_init__(self) -> None:
        # Accept a mapping too; keep sorted pairs, so that the config hashes and pickles.
        overrides: Any = self.profile_overrides
        if isinstance(overrides, Mapping):
            object.__setattr__(self, "profile_overrides", tuple(sorted(overrides.items())))

    def with_router(self, **fields: Any) -> SimulationConfig:
        """A copy with these :class:`RouterConfig` fields overridden (validated at once)."""
        merged = dict(self.router)
        merged.update(fields)
        RouterConfig(**merged)  # raises InvalidConfigError on a bad value
        return replace(self, router=tuple(sorted(merged.items())))

    def router_config(self) -> RouterConfig | None:
        """The router config to run with (``None``: the defaults). ``smetric_l_eq_tokens`` is the
        profile's model's unless the overrides set it."""
        fields = dict(self.router)
        l_eq = profile_l_eq_tokens(self.profile)
        if "smetric_l_eq_tokens" not in fields and l_eq != RouterConfig().smetric_l_eq_tokens:
            fields["smetric_l_eq_tokens"] = l_eq
        return RouterConfig(**fields) if fields else None

    @property
    def profile_label(self) -> str:
        """The profile for reports: its name or the file's, and any overrides (``h20-… step_overhead_s=0.006``)."""
        label = Path(self.profile_file).name if self.profile_file is not None else self.profile
        return " ".join([label, *(f"{k}={v:g}" for k, v in self.profile_overrides)])

    def resolved_profile(self) -> ResolvedProfile:
        """The profile the engine runs: the file or built-in profile with the overrides set.

        Raises:
            InvalidConfigError: a bad file or override (``field`` names it).
            OSError: the file cannot be read.
        """
        name = None if self.profile_file is not None else self.profile
        return sim_profile(name, file=self.profile_file, overrides=dict(self.profile_overrides) or None)

    def with_profile_file(self, path: str | Path) -> SimulationConfig:
        """A copy that runs the profile file at ``path`` (read and validated at once by the engine);
        ``profile`` becomes the file's base, when it has one, so the served model follows it.

        Raises:
            InvalidConfigError: a bad file (``field`` names the key).
            OSError: the file cannot be read.
        """
        file = str(Path(path).resolve())
        resolved = sim_profile(file=file, overrides=dict(self.profile_overrides) or None)
        return replace(self, profile_file=file, profile=resolved["base"] or self.profile)

    def with_profile_overrides(self, **fields: float) -> SimulationConfig:
        """A copy with these ``Profile`` fields (SI units, e.g. ``step_overhead_s=0.0054``) set on
        top of the profile; validated at once.

        Raises:
            InvalidConfigError: an unknown field or a bad value (``field`` names it).
        """
        merged = dict(self.profile_overrides)
        merged.update(fields)
        config = replace(self, profile_overrides=tuple(sorted(merged.items())))
        config.resolved_profile()
        return config

    def with_feed(self, feed: str, event_delay_s: float | None = None) -> SimulationConfig:
        """A copy whose router index is fed by ``feed`` (one of :data:`INDEX_FEEDS`).

        Raises:
            ValueError: an unknown feed or a negative delay.
        """
        if feed not in INDEX_FEEDS:
            raise ValueError(f"unknown index feed {feed!r}; known: {', '.join(INDEX_FEEDS)}")
        delay = self.event_delay_s if event_delay_s is None else event_delay_s
        if not delay >= 0.0:
            raise ValueError(f"event_delay_s must be >= 0, got {delay}")
        return replace(self, index_feed=feed, event_delay_s=delay)

    def with_turns(self, turns: str) -> SimulationConfig:
        """A copy whose router hears each request's turn as ``turns`` says (one of :data:`TURN_FEEDS`).

        Raises:
            ValueError: an unknown turn source.
        """
        if turns not in TURN_FEEDS:
            raise ValueError(f"unknown turn source {turns!r}; known: {', '.join(TURN_FEEDS)}")
        return replace(self, turns=turns)

    def with_pd(self, prefill: int, decode: int, decode_rule: DecodeRule | None = None) -> SimulationConfig:
        """A PD copy: ``prefill`` prefill and ``decode`` decode instances (``instances`` is
        their sum), decode instances picked by ``decode_rule`` (``None``: the policy's peer form).

        Raises:
            ValueError: a pool of fewer than one instance, or an unknown rule.
        """
        if prefill < 1 or decode < 1:
            raise ValueError(f"a PD cluster needs >= 1 prefill and >= 1 decode instance, got {prefill}P:{decode}D")
        if decode_rule is not None and decode_rule not in DECODE_RULES:
            raise ValueError(f"unknown decode rule {decode_rule!r}; known: {', '.join(DECODE_RULES)}")
        return replace(self, instances=prefill + decode, pd=PdLayout(prefill, decode, decode_rule))

    def with_tier(self, enabled: bool) -> SimulationConfig:
        """A copy with the global tier switched on or off."""
        return replace(self, global_tier=replace(self.global_tier, enabled=enabled))

    def with_tier_path(self, path: TierPath, layerwise: bool = False) -> SimulationConfig:
        """A copy whose tier is reached through ``path`` (one of :data:`TIER_PATHS`).

        Raises:
            ValueError: an unknown path, or ``layerwise`` with a path other than ``lmcache``.
        """
        if path not in TIER_PATHS:
            raise ValueError(f"unknown tier path {path!r}; known: {', '.join(TIER_PATHS)}")
        if layerwise and path != "lmcache":
            raise ValueError(f"layer-wise loading is LMCache's; the {path} path loads asynchronously")
        return replace(self, global_tier=replace(self.global_tier, path=path, layerwise=layerwise))

    def core_config(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[tuple[int, int]]]:
        """The engine's config dict, its extra SLO variants, and where each SLO's result lands.

        The engine scores one TTFT bound (and tail-TBT bound) with several TPOT bounds per run
        and re-scores the same run under further SLOs on request: SLOs sharing the first one's
        TTFT and tail-TBT bounds go in ``slo``, each other one becomes a variant. Entry ``k`` of
        the returned positions is ``(variant, index)`` of ``slos[k]``: variant 0 is
        ``report["slo"]``, variant ``v`` is ``report["slo_variants"][v - 1]``, variant ``-1`` an
        end-to-end SLO the runner scores from the request records (which the config then keeps).
        """
        if not self.slos:
            raise ValueError("a SimulationConfig needs at least one SLO")
        engine_slos = [s for s in self.slos if not s.end_to_end]
        # The engine scores some SLO in every run; with only end-to-end ones, its default.
        head = engine_slos[0] if engine_slos else SLO()

        def shared(s: SLO) -> tuple[float, float, float | None]:
            return (s.ttft_base_s, s.ttft_s_per_token, s.tbt_tail_s)

        same_ttft = [s for s in engine_slos if shared(s) == shared(head)] or [head]
        variants: list[dict[str, Any]] = []
        where: list[tuple[int, int]] = []
        for k, s in enumerate(self.slos):
            if s.end_to_end:
                where.append((-1, k))  # scored from the records (smetric.sim.end_to_end_slo)
            elif s in same_ttft:
                where.append((0, same_ttft.index(s)))
            else:
                variants.append(
                    {
                        "ttft_base_s": s.ttft_base_s,
                        "ttft_s_per_token": s.ttft_s_per_token,
                        "tpot_s": [s.tpot_s],
                        "tbt_tail_s": s.tbt_tail_s,
                    }
                )
                where.append((len(variants), 0))
        config: dict[str, Any] = {
            "instances": self.instances,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "global_tier": self.global_tier.settings(),
            "slo": {
                "ttft_base_s": head.ttft_base_s,
                "ttft_s_per_token": head.ttft_s_per_token,
                "tpot_s": [s.tpot_s for s in same_ttft],
                "tbt_tail_s": head.tbt_tail_s,
            },
            "sample_interval_s": self.sample_interval_s,
            "load_report_interval_s": self.load_report_interval_s,
            "max_events": self.max_events,
            "index_feed": self.index_feed,
            "event_delay_s": self.event_delay_s,
            "turns": self.turns,
            "answer_rerender_share": self.answer_rerender_share,
            "router_replicas": self.router_replicas,
            "replica_sync": self.replica_sync,
            "replica_sync_delay_s": self.replica_sync_delay_s,
        }
        if self.session_admission != ENGINE_DEFAULTS["session_admission"]:
            # Only when on: a run without the stage describes itself as it did before it existed.
            config["session_admission"] = self.session_admission
        if self.session_admission_max_hold_s is not None:
            config["session_admission_max_hold_s"] = self.session_admission_max_hold_s
        if self.profile_file is None:
            config["profile"] = self.profile
        else:
            config["profile_file"] = self.profile_file
        if self.profile_overrides:
            config["profile_overrides"] = dict(self.profile_overrides)
        if self.pd is not None:
            config["pd"] = self.pd.settings()
        if any(s.end_to_end for s in self.slos):
            config["keep_records"] = True
        return config, variants, where

    def describe(self) -> dict[str, Any]:
        """Plain fields (for run.json)."""
        config, _, _ = self.core_config()
        config["slos"] = [s.to_dict() for s in self.slos]
        del config["slo"]
        config["router"] = dict(self.router)
        if self.profile_file is not None or self.profile_overrides:
            config["profile_resolved"] = self.resolved_profile()
        return config


@dataclass(frozen=True)
class TraceSpec:
    """A trace to load: file(s), format and loader options (``None`` keeps the loader's default)."""

    paths: tuple[str, ...]
    format: TraceFormat
    coarsen: int | None = None
    shared_prefix: bool | None = None
    gate_on_parent: bool = False
    synthetic: tuple[tuple[str, Any], ...] = ()
    """``format="synthetic"``: generator options overriding :data:`SYNTHETIC_DEFAULTS`, as
    sorted pairs (a spec is a dict key and travels to worker processes)."""
    codex: tuple[tuple[str, Any], ...] = ()
    """``format="codex"``: generator options (``sessions``, ``seed``, ``block_tokens``,
    ``max_context_tokens``), as sorted pairs."""

    @staticmethod
    def embedded() -> TraceSpec:
        """The Weka excerpt shipped with the package (20 sessions, 1,039 requests)."""
        return TraceSpec(paths=(str(embedded_trace_path()),), format="weka")

    @staticmethod
    def synthetic_sessions(**options: Any) -> TraceSpec:
        """The synthetic agent-session workload with these options (keys of
        :data:`SYNTHETIC_DEFAULTS`; the rest keep the engine's defaults).

        Raises:
            ValueError: an unknown option.
        """
        unknown = sorted(set(options) - set(SYNTHETIC_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown synthetic options {unknown}; known: {', '.join(SYNTHETIC_DEFAULTS)}")
        return TraceSpec(paths=(), format="synthetic", synthetic=tuple(sorted(options.items())))

    @staticmethod
    def codex_sessions(**options: Any) -> TraceSpec:
        """Sessions generated from the Codex SWE-bench Pro trace's published statistics
        (``docs/codex-workload.md``); ``seed`` picks the draw (tune on some seeds, report on others).

        Raises:
            ValueError: an unknown option.
        """
        unknown = sorted(set(options) - set(CODEX_OPTIONS))
        if unknown:
            raise ValueError(f"unknown codex options {unknown}; known: {', '.join(CODEX_OPTIONS)}")
        return TraceSpec(paths=(), format="codex", codex=tuple(sorted(options.items())))

    @property
    def name(self) -> str:
        """The file name(s), for reports (``synthetic(key=value,…)`` / ``codex(…)`` for generated sessions)."""
        if self.format == "synthetic":
            return "synthetic(" + ",".join(f"{k}={v}" for k, v in self.synthetic) + ")"
        if self.format == "codex":
            return "codex(" + ",".join(f"{k}={v}" for k, v in self.codex) + ")"
        return "+".join(Path(p).name for p in self.paths)

    def loader_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`smetric._core.load_workload`."""
        if self.format == "synthetic":
            return {"synthetic": dict(self.synthetic)}
        if self.format == "codex":
            return {"codex": dict(self.codex)}
        options: dict[str, Any] = {"gate_on_parent": self.gate_on_parent}
        if self.coarsen is not None:
            options["coarsen"] = self.coarsen
        if self.shared_prefix is not None:
            options["shared_prefix"] = self.shared_prefix
        return options


def embedded_trace_path() -> Path:
    """Path of the embedded Weka excerpt inside the installed package."""
    return Path(str(resources.files("smetric") / "data" / EMBEDDED_TRACE))


def guess_format(path: str) -> TraceFormat | None:
    """The trace format a file name suggests (``weka_cc_…`` → weka, …), or ``None``."""
    name = Path(path).name.lower()
    guesses: tuple[tuple[TraceFormat, tuple[str, ...]], ...] = (
        ("weka", ("weka",)),
        ("mooncake", ("mooncake",)),
        ("azure", ("azure",)),
        ("bailian", ("bailian", "qwen_")),
    )
    for fmt, hints in guesses:
        if any(h in name for h in hints):
            return fmt
    return None


@dataclass(frozen=True)
class Window:
    """How a session (closed-loop) trace becomes a steady load, and what is measured.

    Closed loop: root sessions start as a Poisson stream at the run's rate for
    ``duration_s`` seconds; the trace is replicated (private block ids per copy, the shared
    system prompt stays shared) until it holds enough sessions; nothing is issued after
    ``duration_s``; requests arriving in ``[warmup_s, duration_s]`` are measured. Think times
    are capped at ``max_think_s``: a longer pause is a user away, which lengthens a session
    without adding load and would stretch the simulated time needed for a steady state.

    Open loop (timestamped traces): the whole trace is replayed at the run's speed-up; the
    first ``open_warmup_share`` of its span is not measured and the window ends with the
    last arrival, so the drain after it does not dilute the rates.
    """

    duration_s: float = 5400.0
    warmup_s: float = 1800.0
    max_think_s: float | None = 300.0
    open_warmup_share: float = 0.1
    spare_sessions: float = 1.25
    """Sessions replicated per expected start (Poisson starts run ahead of their mean)."""
