"""The shapes of the dicts ``smetric._core`` returns, and the string values it accepts and reports.

The compiled core builds plain dicts (cheap to make, easy to print and serialise); these
``TypedDict`` classes tell a type checker what is in them, and the ``Literal`` aliases which
strings an argument or field can be. ``_core.pyi`` imports them from here, and :mod:`smetric`,
:mod:`smetric.events` and :mod:`smetric.sim` re-export the ones their API returns.

Nothing here is checked at run time. ``tests/test_typing.py`` ties each ``TypedDict`` to the keys
the core really returns, and each ``Literal`` to the core's own list where it exposes one.
"""

# No `from __future__ import annotations`: `NotRequired` must be evaluated for
# `SimReport.__optional_keys__` to be right at run time.
from typing import Literal, NotRequired, TypeAlias, TypedDict

__all__ = [
    "ArrivalKind",
    "CacheFirstMode",
    "DecodeLoad",
    "DecodeRule",
    "GlobalTierSettings",
    "IndexFeed",
    "IndexMode",
    "IngestSourceStats",
    "IngestStats",
    "InstanceLoad",
    "LoadSeries",
    "PdRouterStats",
    "PdRunReport",
    "PdSettings",
    "Percentiles",
    "PolicyName",
    "Reason",
    "ReplicaSync",
    "RequestRecords",
    "ReuseStats",
    "RouterConfigFields",
    "RouterStats",
    "SessionAdmissionMode",
    "SimConfigDefaults",
    "SimReport",
    "SloResult",
    "SloSettings",
    "SmetricMigration",
    "SmetricRule",
    "SyntheticOptions",
    "Tier",
    "TierPath",
    "TraceFormat",
    "TurnFeed",
    "TurnSource",
    "VllmHashAlgo",
    "VllmRouterSmetricForm",
]

# --- strings ---------------------------------------------------------------------------------------

PolicyName: TypeAlias = Literal[
    "round_robin",
    "least_load",
    "cache_first",
    "linear",
    "lmetric",
    "lpwl",
    "llmd_prefix_load",
    "dynamo_host_tier",
    "bailian_top3",
    "vllm_router_smetric",
    "preble",
    "llmd_session_affinity",
    "consistent_hash",
    "rendezvous_hash",
    "power_of_two",
    "vllm_router_cache_aware",
    "smetric",
]
"""A routing policy (``smetric.POLICIES`` lists them in report order)."""

IndexMode: TypeAlias = Literal["approximate", "exact"]
"""``RouterConfig.index_mode``: insert on route, or only what ``store_blocks`` / KV events say."""

CacheFirstMode: TypeAlias = Literal["weighted", "argmax", "max_hit"]
"""``RouterConfig.cache_first_mode``: how ``cache_first`` turns its score into a choice."""

SmetricMigration: TypeAlias = Literal["threshold", "cost", "work", "fetch"]
"""``RouterConfig.smetric_migration``: the paper's fixed thresholds, a score comparison, a
comparison of pending work (no batch factor), or the score comparison only where the global
tier holds the prompt (else the thresholds)."""

VllmRouterSmetricForm: TypeAlias = Literal["tokens", "pr_literal"]
"""``RouterConfig.vllm_router_smetric_form``: our token-level port of vllm-router's SMetric (PR
#330), or the PR as it ships (linear work, its constants; ``docs/routing-semantics.md`` §6 item 12)."""

DecodeMask: TypeAlias = Literal["off", "oracle", "honest"]
"""``RouterConfig.smetric_decode_mask``: no decode-contract mask, the mask with each live decode's
balance projected to its end from its recorded output length (a simulator's oracle), or the
authors' backward-looking balance from the tokens estimated emitted by now (honest)."""

SmetricRule: TypeAlias = Literal["v1", "v2"]
"""``RouterConfig.smetric_rule``: the July paper's overload thresholds (v1), or the paper's
current TTFT-feasibility gate with attention-aware work and a learned drain rate (v2)."""

Tier: TypeAlias = Literal["local", "global", "host"]
Offload: TypeAlias = Literal["shared", "host"]
"""Where a KV-event source's CPU/STORAGE blocks live: a store every instance reads, or the
instance's own host memory (docs/routing-semantics.md §2.8)."""
"""Where blocks live: an instance's GPU cache, or the cluster-wide global KV$ tier."""

TurnSource: TypeAlias = Literal["hint", "messages", "index"]
"""Where ``Decision.first_turn`` came from: the caller's ``turn``, the chat roles, or the index."""

Reason: TypeAlias = Literal[
    "round-robin",
    "least-load",
    "cache-first: weighted",
    "cache-first: argmax",
    "cache-first: max-hit",
    "linear",
    "lmetric",
    "lpwl",
    "llmd-prefix-load",
    "dynamo-host-tier",
    "bailian-top3",
    "preble: exploit",
    "preble: explore",
    "llmd-session-affinity",
    "consistent-hash",
    "rendezvous-hash",
    "power-of-two",
    "vllm-router-cache-aware: load balance",
    "vllm-router-cache-aware: cache affinity",
    "vllm-router-cache-aware: low match",
    "first-turn: least-loaded",
    "follow-up: sticky",
    "follow-up: migrate (local KV$ evicted)",
    "follow-up: migrate (home overloaded)",
    "follow-up: migrate (cheaper elsewhere)",
    "follow-up: migrate (home misses TTFT budget)",
    "follow-up: sticky (no instance meets TTFT budget)",
    "follow-up: migrate (home would break a live decode)",
    "follow-up: sticky (every target churning)",
    "follow-up: sticky (fleet KV-bound)",
    "follow-up: migrate (home misses TPOT budget)",
]
"""Why a policy chose an instance (``Decision.reason``; the keys of ``stats()["reasons"]``)."""

ArrivalKind: TypeAlias = Literal["closed_loop", "open_loop", "gated_open_loop"]
"""How a simulated workload's requests arrive (``Workload.arrival``)."""

TraceFormat: TypeAlias = Literal["weka", "bailian", "mooncake", "azure", "synthetic", "codex"]
"""Trace formats :func:`smetric._core.load_workload` reads (``"synthetic"``: generated agent
sessions, no file; ``"codex"``: sessions generated from the Codex SWE-bench Pro trace's published
statistics, no file, ``docs/codex-workload.md``)."""

TierPath: TypeAlias = Literal["lmcache", "mooncake-store", "cpu-offload"]
"""``SimConfig.global_tier.path``: how KV moves to and from the global tier — LMCache's connector
(synchronous loads, Mooncake over RDMA), vLLM's Mooncake-store connector (asynchronous, RDMA), or
vLLM's offloading connector (asynchronous, host DRAM); :func:`smetric._core.sim_tier_paths`."""

IndexFeed: TypeAlias = Literal["approximate", "events", "oracle"]
"""How a simulation feeds the router's index: insert on route, the engines' KV events, or an oracle."""

DecodeRule: TypeAlias = Literal["kv_fit", "least_batch", "power_of_two", "round_robin"]
"""How a PD router picks the decode instance (``PdRouter``, ``config["pd"]["decode_rule"]``):
least resident KV plus transfer among instances where the context fits (smetric's), fewest
requests, vllm-router's power-of-two, or round-robin."""

TurnFeed: TypeAlias = Literal["request", "index"]
"""What a simulation tells the router of a request's turn: the turn it carries (a real request
re-sends its history), or nothing (the router infers first turns from its index). Requests of
sessionless traces (Mooncake, Azure) carry no turn either way."""

ReplicaSync: TypeAlias = Literal["off", "bus"]
"""How simulated router replicas share their in-flight work: not at all, or over a bus with a
delay (what ``smetric serve --replica-bus`` does)."""

SessionAdmissionMode: TypeAlias = Literal["off", "pause", "smetric"]
"""Session admission after the policy (the core's ``session_admission``): none; ThunderAgent's
per-pod form (pause idle sessions, else hold the request at its instance); or smetric's (pause
idle sessions, else place it on another instance with room and the cheapest source, else hold)."""

VllmHashAlgo: TypeAlias = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
"""vLLM's ``--prefix-caching-hash-algo``."""

# --- the router ------------------------------------------------------------------------------------


class RouterConfigFields(TypedDict):
    """``RouterConfig.to_dict()``: every field (``RouterConfig(**fields)`` makes it again). What
    each one means and why its default is what it is: ``docs/routing-semantics.md`` §9."""

    hash_seed: int
    index_mode: IndexMode
    local_capacity_blocks: int
    global_capacity_blocks: int
    host_capacity_blocks: int
    local_ttl_s: float | None
    exact_pending_ttl_s: float
    exact_answer_credit: bool
    engine_load_staleness_s: float
    first_turn_min_branches: int
    cache_first_mode: CacheFirstMode
    cache_first_weights: tuple[float, float, float]
    linear_prefill_weight: float
    global_fetch_cost: float
    host_fetch_cost: float
    min_local_hit_ratio: float
    overload_factor: float
    overload_slack_tokens: float
    overload_slack_requests: float
    smetric_active_weight: float
    smetric_batch_term: bool
    smetric_migration: SmetricMigration
    smetric_migration_margin: float
    smetric_kv_fit: bool
    smetric_growth_headroom_tokens: float
    smetric_retention_s: float
    smetric_kv_bound_share: float
    smetric_tpot_budget_s: float
    smetric_rule: SmetricRule
    smetric_l_eq_tokens: float
    smetric_ttft_slack: float
    smetric_ttft_base_s: float
    smetric_ttft_s_per_token: float
    smetric_drain_rate: float | None
    smetric_drain_rate_fallback: float
    smetric_drain_window: int
    smetric_drain_min_samples: int
    smetric_store_pricing: bool
    smetric_learn_fetch_cost: bool
    smetric_decode_mask: DecodeMask
    smetric_contract_base_s: float
    smetric_contract_input_tokens_per_s: float
    smetric_contract_tpot_s: float
    preble_window_s: float
    preble_hit_threshold: float
    preble_imbalance_requests: int
    cache_aware_cache_threshold: float
    cache_aware_balance_abs_threshold: int
    cache_aware_balance_rel_threshold: float
    vllm_router_smetric_form: VllmRouterSmetricForm


class InstanceLoad(TypedDict):
    """``Router.load(instance)``: the router's own counters of one instance and the engine's last
    load report (``Router.update_load``), which the policies fuse while it is fresh
    (``docs/routing-semantics.md`` §3)."""

    batch_size: int
    """Requests routed here and not yet finished or aborted (the router's count of the batch)."""
    waiting: int
    """Requests routed here whose prefill is not yet done."""
    queued: int
    """Uncached prompt tokens of the requests routed here and not yet prefilled."""
    queued_work: int
    """Prefill work of those requests in cold-token equivalents (``n + n·(L − n/2)/L_EQ`` each,
    rounded up): ``smetric`` v2's queue ``q``."""
    active: int
    """Prompt tokens of the requests in flight here."""
    drain_rate: float | None
    """Prefill work this instance drains per second, learned from first-token latencies (the
    median of the last ``smetric_drain_window`` samples); ``None`` before
    ``smetric_drain_min_samples`` samples."""
    fetch_cost: float | None
    """Work units one token loaded from the shared store costs here, learned the same way (only
    with ``smetric_learn_fetch_cost``); ``None`` before ``smetric_drain_min_samples`` samples."""
    engine_running: int
    """Requests the engine last reported running (``update_load(running=...)``; 0 before any)."""
    engine_waiting: int
    """Requests the engine last reported waiting (``update_load(waiting=...)``; 0 before any)."""
    kv_usage: float
    """GPU KV-cache usage in [0, 1] the engine last reported (``update_load(kv_usage=...)``)."""


class RouterStats(TypedDict):
    """``Router.stats()``: counters of decisions, lifecycle calls and the index."""

    routed: int
    """Decisions made."""
    first_turns: int
    """Decisions that treated their request as a session's first turn."""
    reasons: dict[Reason, int]
    """Decisions per reason (every reason, zeros included)."""
    unknown_request_events: int
    """Lifecycle calls for a request the router does not know (unknown or already finished)."""
    in_flight: int
    """Requests routed and not yet finished or aborted."""
    output_tokens: int
    """Output tokens reported by ``on_finished``, summed."""
    random_draws: int
    """Random draws the tie-breaks and weighted samples took."""
    decision_retries: int
    """Decisions taken again because another thread's decision committed on the chosen instance
    between their load read and their commit (0 from one thread)."""
    index_entries: int
    """Blocks in the index (any tier)."""
    index_local_blocks: dict[str, int]
    """Blocks each live instance holds, by name in slot order."""
    index_global_blocks: int
    """Blocks the global tier holds."""
    index_host_blocks: dict[str, int]
    """Blocks each live instance's host pool holds, by name in slot order."""
    index_evictions: int
    """Blocks the index evicted for capacity or age."""
    index_bytes: int
    """Heap bytes of the index."""
    index_breakdown: dict[str, int]
    """``index_bytes`` by component."""


# --- KV-event ingestion ----------------------------------------------------------------------------


class IngestSourceStats(TypedDict):
    """``KvEventIngestor.stats(source)``: the counters of one source (``docs/kv-events.md``)."""

    messages: int
    """Messages handed in: PUB messages and replayed batches (end markers excluded)."""
    batches: int
    """Batches applied to the index."""
    events: int
    """Known events applied (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``)."""
    stored_blocks: int
    """smetric blocks written to the index by ``BlockStored`` events (re-stores included)."""
    removed_blocks: int
    """smetric blocks removed from the index (removals, clears, resets, map evictions)."""
    cleared: int
    """``AllBlocksCleared`` events."""
    decode_errors: int
    """Messages or replay replies that failed to decode (dropped)."""
    unknown_event_types: int
    """Events of a type the decoder does not know (skipped)."""
    unmapped_hashes: int
    """Engine hashes that could not be resolved to smetric blocks."""
    block_size_mismatches: int
    """``BlockStored`` events skipped: their block size is not a multiple of the router's."""
    unsupported_extra_keys: int
    """``BlockStored`` events cut short at a block with extra keys other than the LoRA name."""
    malformed_events: int
    """``BlockStored`` events whose token count is not ``len(block_hashes) * block_size``."""
    other_groups: int
    """Events of a KV-cache group other than 0 (skipped)."""
    unknown_media: int
    """Events with a medium other than GPU, CPU or STORAGE (skipped)."""
    unknown_instances: int
    """Index writes refused because the source's instance is not in the router."""
    sink_errors: int
    """Index writes refused for any other reason."""
    gaps: int
    """Sequence gaps seen on the PUB socket."""
    replays: int
    """Replays requested."""
    replay_failures: int
    """Replays that did not fill their gap (the source was reset instead)."""
    resets: int
    """Source resets: everything the source had put in the index was removed."""
    restarts: int
    """Publisher restarts (the sequence number went back, or the data-parallel rank changed)."""
    late_joins: int
    """First messages with a sequence number above 0 and no replay endpoint to catch up from."""
    stale_messages: int
    """Messages already applied (duplicates from a replay overlapping live messages)."""
    map_evictions: int
    """Engine-hash map entries evicted for capacity (their blocks leave the index)."""
    mapped_blocks: int
    """Engine blocks currently mapped (a gauge)."""
    decode_errors_by_kind: dict[str, int]
    """``decode_errors`` by kind (``"truncated"``, ``"wrong_type"``, ...)."""


class IngestStats(IngestSourceStats):
    """``KvEventIngestor.stats()``: the counters summed over every source, and what the sources'
    events hold in the index now."""

    held_local_blocks: int
    """Blocks the sources' events hold in their instances' tiers."""
    held_global_blocks: int
    """Blocks the sources' events hold in the global tier."""


# --- the simulator ---------------------------------------------------------------------------------


class GlobalTierSettings(TypedDict):
    """``SimConfig.global_tier``: the cluster-wide CPU KV store."""

    enabled: bool
    path: TierPath
    layerwise: bool
    """With ``path="lmcache"``: the load overlaps the step's compute (LMCache's ``use_layerwise``)."""
    capacity_bytes: int
    fetch_latency_s: float
    bandwidth_bytes_per_s: float | None
    """Load rate per rank; ``None``: the path's measured rate."""
    gpus_per_node: int
    nic_bytes_per_s: float
    """A node's NIC per direction, shared fairly by its transfers."""
    pcie_bytes_per_s: float
    """A GPU's host link per direction: caps each rank's transfers."""
    connector_step_overhead_s: float
    """Added to every engine step while the tier is on."""


class SloSettings(TypedDict):
    """``SimConfig.slo``: TTFT ≤ ``ttft_base_s + ttft_s_per_token · prompt tokens``, TPOT ≤ each bound."""

    ttft_base_s: float
    ttft_s_per_token: float
    tpot_s: list[float]
    """TPOT bounds to report, seconds; the first is the headline."""
    tbt_tail_s: float | None
    """Tail-TBT bound (mean of a request's longest tenth of token gaps), seconds; ``None``: none."""


class ResolvedProfile(TypedDict):
    """:func:`smetric._core.sim_profile`: a profile resolved from a built-in name or a profile file
    (``docs/perf-model.md`` §9), overrides applied: its name, its base, and every ``Profile`` field
    in the struct's units (seconds, bytes, bytes/s, tokens)."""

    name: str
    base: str | None
    """The built-in profile it starts from (a built-in profile's own name); ``None``: a file that
    gives every field."""
    tp: int
    layers: int
    hidden: int
    moe_layers: int
    experts: int
    top_k: int
    dense_weight_bytes: float
    expert_weight_bytes: float
    kv_bytes_per_token_rank: float
    kv_bytes_per_token: float
    hbm_bytes_per_s: float
    weight_read_efficiency: float
    kv_read_efficiency: float
    step_overhead_s: float
    linear_s_per_token: float
    attention_s_per_pair: float
    allreduce_latency_s: float
    allreduce_bytes_per_s: float
    frontend_base_s: float
    frontend_s_per_token: float
    kv_capacity_tokens: int
    max_context_tokens: int


class PdSettings(TypedDict):
    """``config["pd"]`` of a PD (disaggregated prefill/decode) run; :func:`smetric._core.sim_pd_defaults`."""

    prefill_instances: int
    decode_instances: int
    decode_rule: DecodeRule | None
    """``None``: the prefill policy's peer form (``kv_fit`` for smetric, ``round_robin`` for
    round_robin, ``power_of_two`` for every other)."""
    transfer_rank_bytes_per_s: float
    transfer_latency_s: float


class SimConfigDefaults(TypedDict):
    """:func:`smetric._core.sim_config_defaults`: ``SimConfig::default()`` (the router's are
    ``RouterConfig()``'s). ``simulate(config=...)`` takes any subset of these keys."""

    instances: int
    profile: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None
    kv_capacity_tokens: int | None
    global_tier: GlobalTierSettings
    time_scale: float
    session_rate_per_s: float
    max_think_s: float | None
    arrivals_until_s: float | None
    seed: int
    slo: SloSettings
    measure_start_s: float
    measure_end_s: float | None
    sample_interval_s: float
    load_report_interval_s: float | None
    series_interval_s: float | None
    max_events: int | None
    keep_records: bool
    index_feed: IndexFeed
    event_delay_s: float
    turns: TurnFeed
    pd: PdSettings | None
    """Disaggregated prefill/decode; ``None``: co-located."""
    answer_rerender_share: float
    """Share of an answer's tokens the next turn of its session re-sends token for token: their
    blocks stay cached on the instance that generated them, in [0, 1]."""
    router_replicas: int
    """Router replicas behind a round-robin balancer, each with its own index and board."""
    replica_sync: ReplicaSync
    replica_sync_delay_s: float
    """With ``replica_sync="bus"``: seconds from a replica's load effect to the others' boards."""
    session_admission: SessionAdmissionMode
    session_admission_max_hold_s: float | None
    """The longest session admission holds a request, seconds; ``None``: the mode's own."""


class SyntheticOptions(TypedDict):
    """:func:`smetric._core.synthetic_defaults`: the options of the ``"synthetic"`` format
    (``SyntheticOptions::default()``, the centre of the regime map: the published Bailian
    agent-trace statistics). ``load_workload(synthetic=...)`` takes any subset of these keys."""

    sessions: int
    seed: int
    block_tokens: int
    kv_tokens: int
    """One instance's GPU KV in tokens: the unit of ``context_ratio``."""
    context_ratio: float
    """Mean final context of a session ÷ ``kv_tokens``."""
    max_context_tokens: int | None
    mean_turns: float
    growth_tokens: int
    """History appended per follow-up (previous output + tool result)."""
    output_tokens: int
    think_mean_s: float
    """Mean think time (tool latency) before a follow-up."""
    reusable_share: float
    shared_share: float
    """Share of the reuse from system prompts shared across sessions."""
    template_share: float
    """Share of the reuse from task templates shared across sessions."""
    system_prompts: int
    templates: int


class ReuseStats(TypedDict):
    """:func:`smetric._core.workload_reuse_stats`: reuse measured from a workload's chains."""

    requests: int
    reusable_share: float
    shared_reuse_share: float
    same_session_reuse_share: float
    think_within_100s: float
    followup_share: float
    final_context_ratio: float


class Percentiles(TypedDict):
    """A latency's distribution over the measured, served requests, seconds (0 without samples)."""

    p50: float
    p90: float
    p99: float
    mean: float
    count: int
    """Samples."""


class SloResult(TypedDict):
    """How one run did under one SLO (its TPOT bound and the TTFT line)."""

    tpot_s: float
    ttft_base_s: float
    ttft_s_per_token: float
    met: int
    """Measured requests meeting both bounds."""
    attainment: float
    """``met`` ÷ measured requests."""
    ttft_attainment: float
    tpot_attainment: float
    tbt_tail_s: float | None
    """Tail-TBT bound, seconds (``None``: not part of this SLO)."""
    tbt_tail_attainment: float
    """Share of measured requests meeting the tail-TBT bound (every served one without a bound)."""
    tps_under_slo: float
    """(input + output) tokens of the requests meeting the SLO per second of the window."""
    output_tps_under_slo: float
    """Output tokens of the requests meeting the SLO per second of the window."""
    prefill_tps_under_slo: float
    """Prompt tokens of the requests whose TTFT meets the bound (whatever their TPOT) per second."""


class LoadSeries(TypedDict):
    """Per-instance load over time: row ``k`` of each matrix is sampled at ``time_s[k]``, one
    value per instance (empty unless ``series_interval_s`` is set)."""

    instances: int
    time_s: list[float]
    requests: list[list[int]]
    """Requests running or waiting (KV fetches included)."""
    queued_tokens: list[list[int]]
    """Queued (not yet computed) prefill tokens."""
    kv_usage: list[list[float]]
    """Share of GPU KV blocks in use."""


class RequestRecords(TypedDict):
    """Per-request outcomes as columns, one entry per request (``None`` where unknown)."""

    index: list[int]
    instance: list[int | None]
    arrival_s: list[float | None]
    first_token_s: list[float | None]
    finish_s: list[float | None]
    ttft_s: list[float | None]
    tpot_s: list[float | None]
    tbt_tail_s: list[float | None]
    """Mean of the request's longest tenth of token gaps (Mooncake's TBT)."""
    input_tokens: list[int]
    output_tokens: list[int]
    local_hit_tokens: list[int]
    global_hit_tokens: list[int]
    first_turn_truth: list[bool | None]
    first_turn_inferred: list[bool | None]
    reason: list[str]
    """The router's reason (a :data:`Reason`; empty for a request never routed)."""
    rejected: list[bool]
    preemptions: list[int]


class PdRunReport(TypedDict):
    """What a PD run reports beyond the co-located metrics (``SimReport.pd``)."""

    prefill_instances: int
    decode_instances: int
    decode_rule: DecodeRule
    transfers: int
    transfer_bytes: float
    """Bytes pulled from prefill to decode instances (the whole model's KV)."""
    decode_hit_tokens: int
    """Prompt tokens a decode instance's own prefix cache held, so not pulled."""
    transfer_time: Percentiles
    """Pull submission to end, seconds."""
    decode_admission_wait: Percentiles
    """Prefill end to decode allocation, seconds (waiting for decode KV space)."""
    decode_kv_usage_mean: float
    decode_kv_usage_max: float
    decode_preemptions: int


class SimReport(TypedDict):
    """:func:`smetric._core.simulate`: everything one run reports (``SimReport`` field names;
    ``slo_variants`` holds one list of :class:`SloResult` per extra SLO asked for)."""

    policy: str
    workload: str
    profile: str
    instances: int
    requests: int
    completed: int
    rejected: int
    measured: int
    measured_rejected: int
    window_start_s: float
    window_end_s: float
    makespan_s: float
    ttft: Percentiles
    tpot: Percentiles
    tbt_tail: Percentiles
    """Tail TBT (mean of a request's longest tenth of token gaps) of the requests ``tpot`` covers."""
    slo: list[SloResult]
    slo_variants: list[list[SloResult]]
    input_tokens: int
    output_tokens: int
    local_hit_ratio: float
    global_hit_ratio: float
    followup_home_share: float | None
    followups: int
    migrations: int
    router_migrations: int
    turn_inference_accuracy: float | None
    turn_inference_samples: int
    imbalance_queued_cv_mean: float
    imbalance_queued_cv_p90: float
    imbalance_requests_cv_mean: float
    imbalance_samples: int
    preemptions: int
    gpu_evictions: int
    tier_evictions: int
    tier_fetches: int
    tier_fetch_bytes: float
    iterations: int
    events: int
    reasons: dict[str, int]
    index_feed: IndexFeed
    event_delay_s: float
    turns: TurnFeed
    local_hit_overpredicted_share: float
    local_hit_prediction_error: float
    feed_counters: dict[str, int]
    load_series: LoadSeries
    pd: PdRunReport | None
    """PD runs only; ``None`` co-located."""
    records: NotRequired[RequestRecords]
    """Only with ``keep_records``."""


class DecodeLoad(TypedDict):
    """``PdRouter.decode_load(instance)``: the PD router's counters of one decode instance."""

    batch_size: int
    """Requests routed here and not yet finished or aborted."""
    reserved_blocks: int
    """KV blocks of those requests' contexts."""
    pulling: int
    """Requests whose KV transfer has not ended (``on_transferred``)."""
    pull_tokens: int
    """Tokens those transfers move."""
    kv_usage: float
    """KV-cache usage in [0, 1] the engine last reported (``update_decode_load``)."""


class PdRouterStats(TypedDict):
    """``PdRouter.stats()``: PD counters (the prefill side counts as a ``Router``)."""

    routed: int
    transfer_tokens: int
    """Tokens the decisions transfer from prefill to decode instances, summed."""
    unknown_request_events: int
    in_flight: int
    output_tokens: int
    decode: dict[str, DecodeLoad]
    """Every decode instance's counters, by name."""
