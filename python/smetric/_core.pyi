"""Type stubs of ``smetric._core``, the compiled routing core (hand-written, checked by stubtest)."""

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Self, TypeAlias, final, overload

import numpy as np
import numpy.typing as npt

from smetric._types import (
    ArrivalKind,
    CacheFirstMode,
    DecodeLoad,
    DecodeMask,
    DecodeRule,
    IndexMode,
    IngestSourceStats,
    IngestStats,
    InstanceLoad,
    Offload,
    PdRouterStats,
    PdSettings,
    PolicyName,
    Reason,
    ResolvedProfile,
    ReuseStats,
    RouterConfigFields,
    RouterStats,
    SessionAdmissionMode,
    SimConfigDefaults,
    SimReport,
    SmetricMigration,
    SmetricRule,
    SyntheticOptions,
    Tier,
    TierPath,
    TraceFormat,
    TurnSource,
    VllmHashAlgo,
    VllmRouterSmetricForm,
)

__all__ = [
    "DECODE_RULES",
    "DEFAULT_BLOCK_SIZE",
    "GATEWAY_ADMITTED_HEADER",
    "GATEWAY_HEADER",
    "GATEWAY_REFUSED_HEADER",
    "GATEWAY_SESSION_END_RECORD",
    "GATEWAY_TURN_HEADER",
    "L_EQ_QWEN3_235B_A22B",
    "L_EQ_QWEN3_CODER_30B_A3B",
    "MAX_JSON_NESTING",
    "MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK",
    "POLICIES",
    "SESSION_ENTRY_BYTES",
    "SHARED_AFFINITY_ATTRIBUTES",
    "SHARED_AFFINITY_COOKIE",
    "SHARED_BAD_END_HEADER",
    "SHARED_BILLING_HEADER_PREFIX",
    "SHARED_BYTE_CHUNK_BYTES",
    "SHARED_CUT_MESSAGE",
    "SHARED_ECHOED_CHARS",
    "SHARED_END_HEADERS",
    "SHARED_END_WITHOUT_SESSION",
    "SHARED_HOP_BY_HOP",
    "SHARED_IDS_ONLY",
    "SHARED_LOST_STATE",
    "SHARED_LOST_STATE_FAILED",
    "SHARED_LOST_STATE_LEFT",
    "SHARED_MAX_SESSION_ID_BYTES",
    "SHARED_NO_ROUTE",
    "SHARED_PARENT_HEADERS",
    "SHARED_PIN_MAC_HEX",
    "SHARED_PIN_TAG_HEX",
    "SHARED_REFUSED_AT_CAPACITY",
    "SHARED_REFUSED_DRAINING",
    "SHARED_REFUSED_QUEUE_TIMEOUT",
    "SHARED_ROUTES",
    "SHARED_SESSION_HEADERS",
    "SHARED_SESSION_ID_CONTROL",
    "SHARED_SESSION_ID_EMPTY",
    "SHARED_SESSION_ID_TOO_LONG",
    "SHARED_USAGE_OPTION",
    "SHARED_WAIT_BUCKETS_S",
    "SHARED_WRONG_METHOD",
    "Decision",
    "EngineLoadScrape",
    "EngineSample",
    "EngineScrapeStats",
    "Gateway",
    "GatewayNative",
    "GatewayRecord",
    "GatewayTokenSource",
    "IndexHits",
    "IngestStep",
    "KvEventIngestor",
    "OpenAIBody",
    "PdDecision",
    "PdRouter",
    "PerfModel",
    "Router",
    "RouterConfig",
    "SessionAdmission",
    "SessionTable",
    "Workload",
    "__version__",
    "encode_kv_batch",
    "engine_sample",
    "escapes_lone_surrogate",
    "gateway_routing_ids",
    "json_syntax_error",
    "load_workload",
    "nests_too_deep",
    "parse_openai_body",
    "parse_prometheus",
    "session_digest",
    "sim_config_defaults",
    "sim_pd_defaults",
    "sim_profile",
    "sim_profiles",
    "sim_tier_paths",
    "simulate",
    "synthetic_defaults",
    "vllm_block_hashes",
    "vllm_cache_namespace",
    "vllm_event_hash",
    "workload_reuse_stats",
]

__version__: Final[str]
DEFAULT_BLOCK_SIZE: Final[int]
L_EQ_QWEN3_CODER_30B_A3B: Final[float]
"""``RouterConfig.smetric_l_eq_tokens`` of Qwen3-Coder-30B-A3B (the default): the context length
where a token's attention FLOPs equal its linear FLOPs (the core's ``config.rs`` derives it)."""
L_EQ_QWEN3_235B_A22B: Final[float]
"""``RouterConfig.smetric_l_eq_tokens`` of Qwen3-235B-A22B."""
MAX_JSON_NESTING: Final[int]
"""The deepest nesting of arrays and objects a request body may have (256): the limit
:func:`parse_openai_body` applies, and :func:`nests_too_deep` checks."""
MOONCAKE_VLLM_SEGMENT_BYTES_PER_RANK: Final[int]
"""The global segment each rank gives the Mooncake store under vLLM's Mooncake-store connector
defaults (4 GiB): the small end of a ``global_tier.capacity_bytes`` sweep."""
POLICIES: Final[tuple[PolicyName, ...]]
"""Every policy name, in the order reports list them (the core's ``PolicyKind::ALL``)."""
DECODE_RULES: Final[tuple[DecodeRule, ...]]
"""Every decode rule of a :class:`PdRouter` (the core's ``DecodeRule::ALL``)."""

_TokenArray: TypeAlias = npt.NDArray[np.int32] | npt.NDArray[np.uint32] | npt.NDArray[np.int64]
_Tokens: TypeAlias = Sequence[int] | _TokenArray
_Hashes: TypeAlias = Sequence[int] | npt.NDArray[np.uint64] | npt.NDArray[np.int64]
_RequestId: TypeAlias = int | str
_Message: TypeAlias = Mapping[str, Any] | Any

@final
class RouterConfig:
    """Tunables of a :class:`Router`. Keyword-only.

    Each default is defined once, in the Rust core (``RouterConfig::DEFAULT``); read them from
    ``RouterConfig()`` or ``docs/routing-semantics.md`` §9, which also gives the reasons.
    """

    def __new__(
        cls,
        *,
        hash_seed: int = ...,
        index_mode: IndexMode = ...,
        local_capacity_blocks: int = ...,
        global_capacity_blocks: int = ...,
        host_capacity_blocks: int = ...,
        local_ttl_s: float | None = ...,
        exact_pending_ttl_s: float = ...,
        exact_answer_credit: bool = ...,
        engine_load_staleness_s: float = ...,
        first_turn_min_branches: int = ...,
        cache_first_mode: CacheFirstMode = ...,
        cache_first_weights: tuple[float, float, float] = ...,
        linear_prefill_weight: float = ...,
        global_fetch_cost: float = ...,
        host_fetch_cost: float = ...,
        min_local_hit_ratio: float = ...,
        overload_factor: float = ...,
        overload_slack_tokens: float = ...,
        overload_slack_requests: float = ...,
        smetric_active_weight: float = ...,
        smetric_batch_term: bool = ...,
        smetric_migration: SmetricMigration = ...,
        smetric_migration_margin: float = ...,
        smetric_kv_fit: bool = ...,
        smetric_growth_headroom_tokens: float = ...,
        smetric_retention_s: float = ...,
        smetric_kv_bound_share: float = ...,
        smetric_tpot_budget_s: float = ...,
        smetric_rule: SmetricRule = ...,
        smetric_l_eq_tokens: float = ...,
        smetric_ttft_slack: float = ...,
        smetric_ttft_base_s: float = ...,
        smetric_ttft_s_per_token: float = ...,
        smetric_drain_rate: float | None = ...,
        smetric_drain_rate_fallback: float = ...,
        smetric_drain_window: int = ...,
        smetric_drain_min_samples: int = ...,
        smetric_store_pricing: bool = ...,
        smetric_learn_fetch_cost: bool = ...,
        smetric_decode_mask: DecodeMask = ...,
        smetric_contract_base_s: float = ...,
        smetric_contract_input_tokens_per_s: float = ...,
        smetric_contract_tpot_s: float = ...,
        preble_window_s: float = ...,
        preble_hit_threshold: float = ...,
        preble_imbalance_requests: int = ...,
        cache_aware_cache_threshold: float = ...,
        cache_aware_balance_abs_threshold: int = ...,
        cache_aware_balance_rel_threshold: float = ...,
        vllm_router_smetric_form: VllmRouterSmetricForm = ...,
    ) -> Self: ...
    @property
    def hash_seed(self) -> int: ...
    @property
    def index_mode(self) -> IndexMode: ...
    @property
    def local_capacity_blocks(self) -> int: ...
    @property
    def global_capacity_blocks(self) -> int: ...
    @property
    def host_capacity_blocks(self) -> int: ...
    @property
    def local_ttl_s(self) -> float | None: ...
    @property
    def exact_pending_ttl_s(self) -> float: ...
    @property
    def exact_answer_credit(self) -> bool: ...
    @property
    def engine_load_staleness_s(self) -> float: ...
    @property
    def first_turn_min_branches(self) -> int: ...
    @property
    def cache_first_mode(self) -> CacheFirstMode: ...
    @property
    def cache_first_weights(self) -> tuple[float, float, float]: ...
    @property
    def linear_prefill_weight(self) -> float: ...
    @property
    def global_fetch_cost(self) -> float: ...
    @property
    def host_fetch_cost(self) -> float: ...
    @property
    def min_local_hit_ratio(self) -> float: ...
    @property
    def overload_factor(self) -> float: ...
    @property
    def overload_slack_tokens(self) -> float: ...
    @property
    def overload_slack_requests(self) -> float: ...
    @property
    def smetric_active_weight(self) -> float: ...
    @property
    def smetric_batch_term(self) -> bool: ...
    @property
    def smetric_migration(self) -> SmetricMigration: ...
    @property
    def smetric_migration_margin(self) -> float: ...
    @property
    def smetric_kv_fit(self) -> bool: ...
    @property
    def smetric_growth_headroom_tokens(self) -> float: ...
    @property
    def smetric_retention_s(self) -> float: ...
    @property
    def smetric_kv_bound_share(self) -> float: ...
    @property
    def smetric_tpot_budget_s(self) -> float: ...
    @property
    def smetric_rule(self) -> SmetricRule: ...
    @property
    def smetric_l_eq_tokens(self) -> float: ...
    @property
    def smetric_ttft_slack(self) -> float: ...
    @property
    def smetric_ttft_base_s(self) -> float: ...
    @property
    def smetric_ttft_s_per_token(self) -> float: ...
    @property
    def smetric_drain_rate(self) -> float | None: ...
    @property
    def smetric_drain_rate_fallback(self) -> float: ...
    @property
    def smetric_drain_window(self) -> int: ...
    @property
    def smetric_drain_min_samples(self) -> int: ...
    @property
    def smetric_store_pricing(self) -> bool: ...
    @property
    def smetric_learn_fetch_cost(self) -> bool: ...
    @property
    def smetric_decode_mask(self) -> DecodeMask: ...
    @property
    def smetric_contract_base_s(self) -> float: ...
    @property
    def smetric_contract_input_tokens_per_s(self) -> float: ...
    @property
    def smetric_contract_tpot_s(self) -> float: ...
    @property
    def preble_window_s(self) -> float: ...
    @property
    def preble_hit_threshold(self) -> float: ...
    @property
    def preble_imbalance_requests(self) -> int: ...
    @property
    def cache_aware_cache_threshold(self) -> float: ...
    @property
    def cache_aware_balance_abs_threshold(self) -> int: ...
    @property
    def cache_aware_balance_rel_threshold(self) -> float: ...
    @property
    def vllm_router_smetric_form(self) -> VllmRouterSmetricForm: ...
    def paper(self) -> RouterConfig:
        """This config with SMetric as its authors ship it co-located (the ``smetric_paper``
        preset): the v2 SLO-feasibility rule, local-only pricing, the honest decode-contract
        mask, a fixed drain rate of 21,400 work/s, every smetric+ switch off."""
    def v2_port(self) -> RouterConfig:
        """This config with our port of the paper's v2 rule (the ``smetric_v2_port`` preset): a
        global hit free, no decode mask, the drain rate learned, every smetric+ switch off."""
    def v1(self) -> RouterConfig:
        """This config with SMetric in the July paper's form: the v1 overload-threshold rule,
        every smetric+ switch off (the ``smetric_v1`` preset)."""
    def to_dict(self) -> RouterConfigFields:
        """Every field as a dict."""

@final
class SessionAdmission:
    """Session admission after the policy (``smetric_core::session_admission``): per instance slot,
    the resident sessions (a request in flight, or idle under ``idle_window_s``) and their KV
    working set; a request is admitted, placed elsewhere (``"smetric"``) or held when its slot's
    resident sessions leave it no room."""

    def __new__(
        cls,
        instances: int,
        *,
        mode: SessionAdmissionMode,
        capacity_tokens: int,
        idle_window_s: float = ...,
        output_reserve_tokens: int = ...,
        max_sessions_per_instance: int = ...,
        max_hold_s: float | None = None,
    ) -> SessionAdmission:
        """A stage over ``instances`` slots of ``capacity_tokens`` KV tokens each. The defaults are
        the core's (defined once there): a 30 s idle window, a 1,024-token output reserve, 4,096
        sessions per instance; ``max_hold_s`` ``None``: the mode's own longest hold (``"pause"``
        holds until there is room).

        Raises:
            InvalidConfigError: an unknown mode, a non-finite or negative window, or a negative or
                NaN maximum hold.
        """
    @property
    def mode(self) -> SessionAdmissionMode:
        """The mode's name."""
    def decide(
        self,
        session: int | None,
        chosen: int,
        prompt_tokens: int,
        now: float,
        costs: Sequence[float] | None = None,
        held_since: float | None = None,
    ) -> tuple[Literal["admit", "elsewhere", "hold"], int, int]:
        """``(verdict, instance, paused)`` for a request of ``session`` the policy sent to slot
        ``chosen``; ``costs`` (per slot, prefill-equivalent tokens) is read only by ``"smetric"``
        when ``chosen`` has no room. A held request changes nothing: ask again later, with
        ``held_since`` the time it was first held (admitted at ``chosen`` once its hold ran out)."""
    def release_at(self, held_since: float) -> float | None:
        """When a request first held at ``held_since`` is admitted anyway (``None``: unbounded)."""
    def on_finished(self, session: int, instance: int, context_tokens: int, now: float) -> None:
        """``session``'s request on ``instance`` finished with ``context_tokens`` (prompt + output)."""
    def working_set(self, instance: int, now: float) -> int:
        """Slot ``instance``'s resident sessions' context tokens at ``now`` (0 out of range)."""
    def counters(self) -> dict[str, int]:
        """``admitted`` (``released``: of them, admitted without room once their hold ran out),
        ``moved``, ``held`` and ``paused`` so far."""

@final
class Decision:
    """The outcome of :meth:`Router.route`."""

    @property
    def instance(self) -> str:
        """Name of the chosen instance."""
    @property
    def first_turn(self) -> bool:
        """Whether the request was treated as the first turn of its session."""
    @property
    def turn_source(self) -> TurnSource:
        """``"hint"``, ``"messages"`` or ``"index"``."""
    @property
    def local_hit_tokens(self) -> int:
        """Prompt tokens cached on the chosen instance's GPU."""
    @property
    def global_hit_tokens(self) -> int:
        """Prompt tokens available from the global KV$ tier."""
    @property
    def host_hit_tokens(self) -> int:
        """Prompt tokens held in the chosen instance's host pool (its own host memory, or a
        store shared with its pool)."""
    @property
    def prefill_tokens(self) -> int:
        """Tokens the chosen instance is expected to prefill."""
    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens."""
    @property
    def reason(self) -> Reason:
        """Why the policy chose this instance."""
    @property
    def request_id(self) -> _RequestId:
        """The caller's id, or the one the router issued."""
    @property
    def policy(self) -> PolicyName:
        """The policy that decided."""

@final
class IndexHits:
    """Prefix hits of one prompt, from :meth:`Router.query`."""

    @property
    def local(self) -> dict[str, int]:
        """Instance name → local hit tokens, in slot order."""
    @property
    def global_hit_tokens(self) -> int: ...
    @property
    def host(self) -> dict[str, int]:
        """Instance name → hit tokens in its host pool, in slot order."""
    @property
    def deepest_blocks(self) -> int: ...
    @property
    def branches(self) -> int: ...

@final
class SessionTable:
    """Per-session state of one proxy, shared by the app and the gateway's native path: a
    bounded LRU with an idle timeout, keyed by 16-byte digests of the session keys. An entry
    holds the session's turns counted (a hinted request without roles) and its home (the
    instance that answered it last). O(key length) per call."""

    def __new__(cls, capacity: int = 100000, ttl_s: float = 3600.0) -> Self: ...
    @property
    def capacity(self) -> int: ...
    @property
    def ttl_s(self) -> float: ...
    def next_turn(self, key: str, now: float | None = None) -> int:
        """Counts a request of session ``key`` and returns its turn (1 for a new or idle key)."""
    def place(self, key: str, instance: str, now: float | None = None) -> None:
        """Records that ``instance`` answered session ``key`` (its home from now on)."""
    def home(self, key: str, now: float | None = None) -> str | None:
        """The instance that answered session ``key`` last, or None (unknown, idle, ended); a
        look that neither renews the entry nor moves it in the LRU."""
    def end(self, key: str) -> bool:
        """Drops session ``key``'s entry at once; whether the table held one."""
    def heap_bytes(self) -> int:
        """The heap the table's structures hold (allocated, not used), bytes."""
    def __len__(self) -> int: ...

SESSION_ENTRY_BYTES: Final[int]
"""An upper bound of one ``SessionTable`` entry's memory, bytes."""

def session_digest(key: str) -> bytes:
    """The fixed-size form (16 bytes) a session key is kept in by ``SessionTable``."""

@final
class EngineSample:
    """One instance's load, summed over its engines (data-parallel ranks); every field is None
    when its metric was absent."""

    def __new__(
        cls,
        *,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        prefix_cache_queries: float | None = None,
        prefix_cache_hits: float | None = None,
        external_prefix_cache_queries: float | None = None,
        external_prefix_cache_hits: float | None = None,
    ) -> Self: ...
    @property
    def running(self) -> int | None: ...
    @property
    def waiting(self) -> int | None: ...
    @property
    def kv_usage(self) -> float | None: ...
    @property
    def prefix_cache_queries(self) -> float | None: ...
    @property
    def prefix_cache_hits(self) -> float | None: ...
    @property
    def external_prefix_cache_queries(self) -> float | None: ...
    @property
    def external_prefix_cache_hits(self) -> float | None: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    __hash__: None  # type: ignore[assignment]

def engine_sample(text: str, model_name: str | None = None) -> EngineSample:
    """The load in one ``/metrics`` page; ``model_name`` keeps only that model's series."""

def parse_prometheus(text: str, names: list[str] | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of a Prometheus text page (format 0.0.4) by metric name; with ``names``, only
    those metrics'."""

@final
class EngineScrapeStats:
    """One instance's scrape counters."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def ok(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def slow(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def last(self) -> EngineSample | None: ...
    @property
    def prefix_cache_hit_rate(self) -> float | None: ...
    @property
    def external_prefix_cache_hit_rate(self) -> float | None: ...

@final
class EngineLoadScrape:
    """Scrapes every instance's load on a runtime of its own and feeds the router's
    ``update_load`` (a ``PdRouter``'s prefill pool). ``smetric.engine_load.EngineLoadScraper`` is
    the public face."""

    def __new__(
        cls,
        router: Router | PdRouter,
        instances: list[tuple[str, str]],
        *,
        period_s: float,
        timeout_s: float,
        endpoint: str,
        model_name: str | None,
        headers: dict[str, str],
        max_concurrent: int,
    ) -> Self: ...
    def scrape_once(self) -> list[EngineSample | None]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    @property
    def rounds(self) -> int: ...
    def stats(self) -> list[EngineScrapeStats]: ...

@final
class GatewayRecord:
    """One request the compiled data plane's native path served, as the app takes it into its
    telemetry, fleet health and decision log (the gateway's ``Record``, field for field)."""

    @property
    def request_id(self) -> str:
        """The request's id (the client's ``x-request-id``, or one minted)."""
    @property
    def api(self) -> str:
        """``chat``, ``completions``, ``messages`` or ``responses``."""
    @property
    def session(self) -> str | None:
        """The session key the headers gave."""
    @property
    def parent(self) -> str | None:
        """The parent agent's session key (a sub-agent's request)."""
    @property
    def model(self) -> str | None: ...
    @property
    def instance(self) -> str | None:
        """The instance that answered (or the last one tried)."""
    @property
    def prefill_instance(self) -> str | None:
        """PD: the prefill instance that answered its leg."""
    @property
    def reason(self) -> Reason | None:
        """The core's reason, when a decision was made."""
    @property
    def policy(self) -> PolicyName | None: ...
    @property
    def first_turn(self) -> bool | None: ...
    @property
    def turn(self) -> int | None:
        """The turn counted in the session table (a hinted request without messages)."""
    @property
    def predicted_local_hit(self) -> int | None: ...
    @property
    def predicted_global_hit(self) -> int | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def tokens_source(self) -> str | None:
        """Where the routing ids came from: ``ids`` or ``approximate``."""
    @property
    def decision_s(self) -> float | None: ...
    @property
    def cached_tokens(self) -> int | None:
        """The engine's cached prompt tokens (the realized hit)."""
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def first_byte_s(self) -> float | None:
        """Seconds from the request's arrival to the engine's answer head."""
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def itl_s(self) -> float | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def status(self) -> int: ...
    @property
    def refused(self) -> str | None:
        """The admission refusal's reason, when refused."""
    @property
    def latency_s(self) -> float: ...
    @property
    def succeeded(self) -> bool:
        """The instance the answer came from gets its health back."""
    @property
    def failures(self) -> list[tuple[str, str, bool]]:
        """Attempts that failed before the client had a byte, in order, or a stream cut and not
        continued: ``(instance, cause, charged)`` (charged to its health, else a retry only)."""
    @property
    def ejected(self) -> list[str]:
        """Instances this request's failures ejected from the gateway's fleet view."""
    @property
    def unresumed(self) -> bool:
        """A cut stream ended with the API's error event (not continued)."""
    @property
    def resumed(self) -> int:
        """Cut streams the gateway continued on another instance."""
    @property
    def grouping(self) -> str | None:
        """A sub-agent's request: what the parent rule did (``parent``, ``overloaded``,
        ``parent_unavailable``, ``parent_unknown``)."""
    @property
    def session_end_held(self) -> bool | None:
        """The request ended its session: whether the session table held state for it."""

@final
class Gateway:
    """The compiled data plane (``rust/smetric-gateway``): listens on ``host:port`` on a thread
    of its own and delegates requests to the app on ``127.0.0.1:control_plane_port``; armed
    with ``native``, it admits the APIs' requests and serves chat and completions itself,
    starting from ``instances`` (:meth:`set_fleet` keeps its view of the fleet current).

    Raises:
        InvalidConfigError: a host that is not an IP address, a head limit under 8192 bytes, a field
            limit of 0, a negative time, an empty secret.
        OSError: the address cannot be bound.
    """

    def __new__(
        cls,
        host: str,
        port: int,
        control_plane_port: int,
        *,
        max_head_bytes: int,
        max_field_bytes: int,
        head_timeout_s: float,
        drain_timeout_s: float,
        max_connections: int,
        retry_after_s: int,
        native: GatewayNative | None = None,
        instances: list[str] = ...,
    ) -> Self: ...
    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose for port 0)."""
    def client_errors(self) -> list[tuple[str, int]]:
        """What the door refused or cut so far, by the proxy's kind names (zeros included)."""
    def set_fleet(
        self, instances: list[str], ejected: set[str], models: dict[str, set[str]], adapters: set[str]
    ) -> None:
        """Replaces the native path's view of the fleet. Raises RuntimeError when not armed."""
    def take_records(self) -> list[GatewayRecord]:
        """The native path's records since the last call, oldest first."""
    def records_fd(self) -> int:
        """A descriptor that turns readable when records wait to be taken (the gateway owns it;
        :meth:`take_records` clears it): the app's event loop watches it instead of polling."""
    def records_dropped(self) -> int:
        """Records dropped because they were not taken in time."""
    def admitted(self) -> int:
        """Requests holding an admission slot at the door now."""
    def admission(self) -> dict[str, Any]:
        """The door's admission: ``admitted``, ``capacity``, ``queued``, ``wait_counts``,
        ``wait_sum_s``, ``rejections``."""
    def end_session(self, key: str) -> None:
        """Releases session ``key`` at the session gate (the end endpoint's part that the
        shared session table does not cover); nothing when session admission is off."""
    def session_admission(self) -> dict[str, int] | None:
        """The session admission (None: off): the stage's decisions ``admitted``, ``moved``,
        ``held``, ``paused``, the requests ``holding`` now, the refusals ``held_full`` and
        ``hold_timeout``."""
    def stop(self) -> None:
        """Stops accepting, lets requests in flight finish (at most the drain time); idempotent."""

@final
class GatewayNative:
    """What arms the gateway's native path (``smetric.serve.compiled.native_settings``)."""

    def __new__(
        cls,
        router: Router | PdRouter,
        *,
        secret: str,
        client_keys: list[str],
        upstream_key: str | None,
        max_body_bytes: int,
        body_timeout_s: float,
        connect_timeout_s: float,
        first_byte_timeout_s: float,
        idle_timeout_s: float,
        client_timeout_s: float,
        max_in_flight: int,
        max_in_flight_per_instance: int,
        queue_size: int,
        queue_timeout_s: float,
        chat: bool,
        completions: bool,
        messages: bool,
        responses: bool,
        response_id_key: str,
        resume_streams: bool,
        max_attempts: int,
        eject_after: int,
        labels: dict[str, str],
        max_records: int,
        session_admission: SessionAdmissionMode = "off",
        session_capacity_tokens: int = 0,
        session_max_held: int = 0,
        session_hold_timeout_s: float = 0.0,
        session_max_hold_s: float | None = None,
        tokens: GatewayTokenSource | None = None,
        ids_only: bool = False,
        sessions: SessionTable | None = None,
        parent_affinity_margin: int | None = None,
        approx_chunk_bytes: int | None = None,
    ) -> Self: ...
    @property
    def apis(self) -> list[str]:
        """The APIs the native path serves (``chat``, ``completions``, ``messages``, ``responses``)."""
    @property
    def ids_only(self) -> bool:
        """Whether only token-id prompts are routed (``--tokens ids``; the app refuses the rest)."""

@final
class GatewayTokenSource:
    """A chat template's routing ids for the gateway: a ``tokenizer.json`` (tokenizer mode; None:
    the rendered text's approximate 4-byte ids), the chat templates as ``(name, Jinja text,
    content format)``, the named special tokens and the piece cache's bound in bytes
    (``smetric.serve.compiled.gateway_token_source`` builds it from the app's).

    Raises:
        InvalidConfigError: the tokenizer does not load, a template does not compile, there is no
            ``default`` template, or a content format is not ``string`` or ``openai``.
    """

    def __new__(
        cls,
        tokenizer: str | None,
        *,
        templates: list[tuple[str, str, str]],
        special_tokens: list[tuple[str, str]],
        piece_cache_bytes: int,
        approx_chunk_bytes: int | None = None,
    ) -> Self: ...
    @property
    def exact_pieces(self) -> bool:
        """Texts are encoded piece by piece (a tokenizer that allows it, and the probe agreed)."""

    @property
    def kind(self) -> Literal["tokenizer", "approximate"]:
        """``tokenizer`` (the tokenizer's ids) or ``approximate`` (4-byte chunks of the rendered text)."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> bytes:
        """``text``'s ids as the bytes of an ``array('I')``."""

    def cache_stats(self) -> dict[str, int]:
        """The piece cache's ``hits``, ``misses``, ``pieces`` and charged ``bytes`` (zeros without a tokenizer)."""

    def message_cache_stats(self) -> dict[str, int]:
        """The message cache's ``hits``, ``misses``, ``messages`` (texts kept) and charged ``bytes``: a
        chat body's messages, an Anthropic Messages body's messages and ``system``, a Responses body's
        runs of ``input`` items and ``instructions``, each as the template sees it, kept by its JSON
        text (within ``piece_cache_bytes``)."""

def gateway_routing_ids(
    path: str, raw: bytes, *, tokens: GatewayTokenSource | None = None, approx_chunk_bytes: int | None = None
) -> tuple[bytes, bool | None] | None:
    """The routing ids (as the bytes of an ``array('I')``) and the turn verdict (None: the
    index's) the gateway's native path would route a body posted to ``path`` on, or None when it
    would hand the body to the app; with ``tokens``, with a chat template; without one, plain
    ChatML's approximate ids in chunks of ``approx_chunk_bytes`` bytes (None: 4)."""

SHARED_HOP_BY_HOP: Final[tuple[str, ...]]
"""RFC 9110's hop-by-hop fields, never forwarded (``rust/smetric-gateway/src/shared.rs``)."""
SHARED_SESSION_HEADERS: Final[tuple[str, ...]]
"""Headers naming a request's session, in the order both planes read them (``rust/smetric-gateway/src/shared.rs``)."""
SHARED_PARENT_HEADERS: Final[tuple[str, ...]]
"""Headers naming a sub-agent's parent, in order."""
SHARED_AFFINITY_COOKIE: Final[str]
"""llm-d's session-affinity cookie's name."""
SHARED_AFFINITY_ATTRIBUTES: Final[str]
"""The attributes llm-d sets its session cookie with."""
SHARED_END_HEADERS: Final[tuple[str, ...]]
"""Headers marking a session's last request."""
SHARED_CUT_MESSAGE: Final[str]
"""The error a cut stream ends with when it could not be continued."""
SHARED_ECHOED_CHARS: Final[int]
"""The most characters of a client's value an error message repeats."""
SHARED_MAX_SESSION_ID_BYTES: Final[int]
"""The longest session id the end endpoints accept, in bytes."""
SHARED_REFUSED_AT_CAPACITY: Final[str]
"""The door's 429 when its queue is full (``{admitted}``, ``{queued}`` filled in)."""
SHARED_REFUSED_QUEUE_TIMEOUT: Final[str]
"""The door's 503 after a wait past the queue's timeout (``{seconds}`` filled in)."""
SHARED_REFUSED_DRAINING: Final[str]
"""The door's 503 while the proxy drains."""
SHARED_USAGE_OPTION: Final[bytes]
"""The usage request spliced into a streamed OpenAI body."""
SHARED_WAIT_BUCKETS_S: Final[tuple[float, ...]]
"""Upper bounds (seconds) of the admission queue-wait histogram."""
SHARED_PIN_TAG_HEX: Final[int]
"""Hex digits of a stored-response id's instance tag."""
SHARED_PIN_MAC_HEX: Final[int]
"""Hex digits of a stored-response id's mac."""
SHARED_BYTE_CHUNK_BYTES: Final[int]
"""UTF-8 bytes per id of the byte-chunk tokenizer."""
SHARED_BILLING_HEADER_PREFIX: Final[str]
"""The prefix of Claude Code's billing system block, dropped from Anthropic requests."""
SHARED_ROUTES: Final[tuple[tuple[str, str], ...]]
"""Every route the proxy serves, ``(method, aiohttp path pattern)``."""
SHARED_NO_ROUTE: Final[str]
"""The 404 of a path no route serves (``{path}`` filled in)."""
SHARED_WRONG_METHOD: Final[str]
"""The 405 of a path served with other methods."""
SHARED_BAD_END_HEADER: Final[str]
"""The 400 of an end header neither true nor false (``{name}``: the header)."""
SHARED_END_WITHOUT_SESSION: Final[str]
"""The 400 of an end header on a request that names no session."""
SHARED_IDS_ONLY: Final[str]
"""The 400 of a request without token ids when the proxy routes on token ids only."""
SHARED_LOST_STATE: Final[str]
"""A pinned request's lost state (``{where}``: :data:`SHARED_LOST_STATE_LEFT` or ``_FAILED``)."""
SHARED_LOST_STATE_LEFT: Final[str]
"""Where the lost state lived: an instance that left the fleet."""
SHARED_LOST_STATE_FAILED: Final[str]
"""Where the lost state lived: a failed instance (``{instance}``, ``{cause}``)."""
SHARED_SESSION_ID_EMPTY: Final[str]
"""The 400 of an end endpoint's empty session id."""
SHARED_SESSION_ID_TOO_LONG: Final[str]
"""The 400 of an end endpoint's session id over the limit (``{size}``, ``{max}``: bytes)."""
SHARED_SESSION_ID_CONTROL: Final[str]
"""The 400 of an end endpoint's session id holding a control character."""
GATEWAY_HEADER: Final[str]
"""Carries the gateway's per-process secret on every request it sends the app."""
GATEWAY_ADMITTED_HEADER: Final[str]
"""The gateway admitted the request."""
GATEWAY_REFUSED_HEADER: Final[str]
"""The gateway refused the request admission: the reason."""
GATEWAY_SESSION_END_RECORD: Final[str]
"""The API name of a gateway record that is not a request's: an end endpoint it answered."""
GATEWAY_TURN_HEADER: Final[str]
"""The turn the gateway counted in the session table for a request it hands on."""

@final
class Router:
    """Routes the requests of LLM-agent sessions to a fleet of vLLM instances.

    Arguments:
        instances: unique instance names (e.g. base URLs); at least one.
        policy: one of ``smetric.POLICIES``.
        block_size: tokens per KV block (vLLM's ``--block-size``; a trace's block size).
        seed: seed of the router's random tie-breaks.
        config: a :class:`RouterConfig`; defaults when ``None``.

    Raises:
        NoInstancesError, DuplicateInstanceError, UnknownPolicyError, InvalidBlockSizeError,
        InvalidConfigError.
    """

    def __new__(
        cls,
        instances: Sequence[str],
        *,
        policy: PolicyName = "smetric",
        block_size: int = ...,
        seed: int = 0,
        config: RouterConfig | None = None,
    ) -> Self: ...
    def route(
        self,
        tokens: _Tokens | None = None,
        *,
        hashes: _Hashes | None = None,
        num_tokens: int | None = None,
        messages: Sequence[_Message] | None = None,
        turn: int | None = None,
        request_id: _RequestId | None = None,
        namespace: str | None = None,
        now: float | None = None,
        exclude: Sequence[str] | None = None,
        previous_instance: str | None = None,
        session_key: int | str | None = None,
        output_tokens: int | None = None,
    ) -> Decision:
        """Chooses the instance for one request.

        Arguments:
            tokens: prompt token ids (list or int32/uint32/int64 array), or ``None`` with ``hashes``.
                A contiguous int32/uint32 array is read in place (at an even block size up to
                128), with the GIL released for prompts over 2,048 ids: do not write to it while
                the call runs, as with numpy's own functions (a concurrent write gives a route for
                some mixture of the ids).
            hashes: a pre-hashed block chain (e.g. a trace's ``hash_ids``).
            num_tokens: prompt length when ``hashes`` are given (default ``len(hashes) * block_size``).
            messages: the chat history (dicts or objects with a ``role``), for turn inference.
            turn: the caller's turn number (1 = first turn); overrides every inference.
            request_id: an id for the lifecycle calls; issued by the router when ``None``.
            namespace: mixed into the hash chain (LoRA name, cache salt).
            now: time in seconds (the router's own clock when ``None``).
            exclude: instances this decision must not choose (a retry after a failed attempt,
                ejected instances); unknown names are ignored.
            previous_instance: the instance that served this request's session last, as the
                client knows it (what llm-d's session cookie carries); read by
                ``llmd_session_affinity`` only. A name that is not a candidate counts as none.
            session_key: the request's session (vllm-router's ``x-session-id``): an ``int`` in
                ``[0, 2^64)``, or a ``str`` mapped to ``xxh3_64(utf8, seed=0)``; read by
                ``consistent_hash`` and ``rendezvous_hash`` only, which hash the prompt when
                ``None``.
            output_tokens: the request's recorded output length (a trace replay's); read only
                by ``smetric``'s decode mask in its oracle form (``smetric_decode_mask``).

        Raises:
            InvalidTokenError, UnsupportedDtypeError, MissingPromptError, NoInstancesError
            (also when ``exclude`` leaves no instance), InvalidArgumentError.
        """
    def query(
        self,
        tokens: _Tokens | None = None,
        *,
        hashes: _Hashes | None = None,
        num_tokens: int | None = None,
        namespace: str | None = None,
        now: float | None = None,
    ) -> IndexHits:
        """Prefix hits of a prompt on every instance and in the global tier; changes nothing."""
    def on_prefilled(self, request_id: _RequestId, now: float | None = None) -> bool:
        """The request's prefill is done (its first token is out) at ``now`` (seconds, the clock
        ``route`` was given; the router's own when ``None``). Returns whether a counter changed.

        Lowers the instance's waiting count, queued prefill tokens and queued work once, and
        gives its drain rate one sample (the work drained since routing over the time it took);
        repeated or unknown calls change nothing (an unknown one is counted in
        ``stats()["unknown_request_events"]``).

        Raises:
            InvalidArgumentError: ``now`` is negative or not finite.
        """
    def on_finished(self, request_id: _RequestId, output_tokens: int = 0, now: float | None = None) -> bool:
        """The request finished after generating ``output_tokens`` tokens, at ``now`` (seconds, the
        clock ``route`` was given; the router's own when ``None``). Returns whether a counter changed.

        Lowers the instance's batch and active-token counts (and the prefill ones if
        ``on_prefilled`` never came). The load board weighs prompt tokens only; ``output_tokens`` is
        summed into ``stats()["output_tokens"]``. In exact mode with ``exact_answer_credit`` set the
        answer's full blocks, ``(prompt + output_tokens - 1) // block_size`` minus the prompt's,
        count on the instance past the prompt's last full block until its KV events confirm them
        (``docs/routing-semantics.md`` §2.7, "The answer"): pass the real count, usage's
        ``completion_tokens``.

        Raises:
            InvalidArgumentError: ``now`` is negative or not finite.
        """
    def on_aborted(self, request_id: _RequestId) -> bool:
        """The request was aborted (client gone, engine error): as ``on_finished`` with no output."""
    def add_instance(self, name: str) -> None:
        """Adds an instance (empty index, zero load)."""
    def remove_instance(self, name: str) -> None:
        """Removes an instance with its index entries and load."""
    def update_load(
        self,
        instance: str,
        *,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        now: float | None = None,
    ) -> None:
        """Stores an engine load snapshot (e.g. from vLLM's ``/metrics``)."""
    def set_peer_load(
        self,
        instance: str,
        *,
        batch_size: int = 0,
        waiting: int = 0,
        queued: int = 0,
        queued_work: int = 0,
        active: int = 0,
    ) -> None:
        """Replaces the in-flight work peer router replicas have on ``instance`` (their own
        boards' counters summed); decisions add it to this router's own counts.

        Raises:
            UnknownInstanceError: ``instance`` is not in the fleet.
        """
    def peer_load(self, instance: str) -> dict[str, int]:
        """The peers' in-flight work on ``instance`` as last set (``batch_size``, ``waiting``,
        ``queued``, ``queued_work``, ``active``)."""
    def store_blocks(
        self,
        instance: str | None,
        hashes: _Hashes,
        tier: Tier = "local",
        *,
        parent: int | None = None,
        now: float | None = None,
    ) -> None:
        """Records that ``instance`` (or, with ``tier="global"``, the global tier; with
        ``tier="host"``, ``instance``'s host pool) holds ``hashes``."""
    def remove_blocks(self, instance: str | None, hashes: _Hashes, tier: Tier = "local") -> None:
        """Records that ``instance`` (or the global tier, or ``instance``'s host pool) dropped ``hashes``."""
    def clear(self, instance: str | None = None, tier: Tier = "local") -> None:
        """Drops everything ``instance`` (or the global tier, or ``instance``'s host pool) holds."""
    def set_host_pool(self, instance: str, pool: str | None = None) -> None:
        """Puts ``instance``'s non-GPU KV$ in a host pool: its own host memory (``pool=None``,
        the default: credited to it alone) or a store shared with every instance given the same
        ``pool`` name (a node-local store).

        Raises:
            UnknownInstanceError: ``instance`` is not in the fleet.
            InvalidInputError: ``pool`` is empty.
        """
    def host_pool(self, instance: str) -> str | None:
        """``instance``'s shared host pool's name; None for its own host memory (or when host
        tiers are off, ``host_capacity_blocks=0``)."""
    def load(self, instance: str) -> InstanceLoad:
        """The load counters of one instance (each key is documented in :class:`InstanceLoad`)."""
    def hash_tokens(self, tokens: _Tokens, namespace: str | None = None) -> list[int]:
        """The chained block hashes this router computes for ``tokens``."""
    def stats(self) -> RouterStats:
        """Counters of decisions, lifecycle events and the index."""
    @property
    def instances(self) -> list[str]:
        """Live instance names, in slot order."""
    @property
    def policy(self) -> PolicyName: ...
    @property
    def block_size(self) -> int: ...
    @property
    def config(self) -> RouterConfig: ...

def vllm_block_hashes(
    tokens: Iterable[int],
    block_size: int = ...,
    algo: VllmHashAlgo = "sha256",
    seed: str | None = None,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """vLLM 0.33 prefix-cache block digests of a prompt (see :func:`smetric.vllm.block_hashes`)."""

def vllm_cache_namespace(lora_name: str | None = None, cache_salt: str | None = None) -> str | None:
    """The router namespace of a request for LoRA adapter ``lora_name`` with vLLM's
    ``cache_salt`` (``smetric.vllm.cache_namespace``). Raises ``ValueError`` for an empty one."""

def vllm_event_hash(digest: bytes) -> int:
    """The 64-bit int vLLM publishes in KV events for a digest (its last 8 bytes, big-endian)."""

@final
class OpenAIBody:
    """The fields of an OpenAI request body a router reads (``smetric.serve.request`` wraps it)."""

    @property
    def model(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...
    @property
    def max_tokens(self) -> int | None:
        """``max_completion_tokens`` (chat, when given) or ``max_tokens``."""
    @property
    def user(self) -> str | None: ...
    @property
    def prompt_cache_key(self) -> str | None: ...
    @property
    def cache_salt(self) -> str | None: ...
    @property
    def messages_json(self) -> str | None:
        """Chat: the JSON text of ``messages`` (an array)."""
    @property
    def tools_json(self) -> str | None:
        """The JSON text of ``tools`` (an array)."""
    @property
    def chat_template_kwargs_json(self) -> str | None:
        """The JSON text of ``chat_template_kwargs`` (an object)."""
    @property
    def add_generation_prompt(self) -> bool: ...
    @property
    def continue_final_message(self) -> bool: ...
    @property
    def add_special_tokens(self) -> bool:
        """vLLM's ``add_special_tokens``; absent: false for chat, true for completions."""
    @property
    def prompt_text(self) -> str | None:
        """Completions: a text prompt."""
    @property
    def prompt_ids(self) -> bytes | None:
        """Completions: the prompt's token ids as native-endian u32 bytes."""
    @property
    def stream_options_json(self) -> str | None:
        """The JSON text of ``stream_options`` when the body has the field (``null`` included)."""
    @property
    def kv_transfer_params(self) -> bool:
        """Whether the body has a top-level ``kv_transfer_params``."""

def parse_openai_body(raw: bytes, endpoint: Literal["chat", "completions"]) -> OpenAIBody:
    """Parses an OpenAI request body in one pass (see :func:`smetric.serve.request.parse_request`).

    Raises:
        InvalidArgumentError: malformed JSON (``argument="body"``) or a bad field (``argument`` names it).
    """

def escapes_lone_surrogate(raw: bytes) -> bool:
    """Whether a JSON body escapes half of a UTF-16 surrogate pair alone (``"\ud800"``); an
    escaped pair or an escaped backslash is text (see :func:`smetric.serve.request.escapes_lone_surrogate`)."""

def nests_too_deep(raw: bytes) -> bool:
    """Whether a body nests arrays and objects deeper than :data:`MAX_JSON_NESTING` levels
    (brackets inside strings do not count; the GIL is released)."""

def json_syntax_error(raw: bytes) -> str | None:
    """The 400 message every API gives a body that is not JSON (``malformed JSON body: …``),
    when CPython's decoder rejects it too; None when the parser reads it, when it nests too deep,
    or when CPython might read it (a BOM or UTF-16/32, ``NaN`` / ``Infinity``)."""

@final
class IngestStep:
    """What the caller of :class:`KvEventIngestor` must do after handing in a message."""

    def __eq__(self, value: object, /) -> bool: ...
    @property
    def replay_from(self) -> int | None:
        """Send a replay request from this sequence number on the source's DEALER, if not None."""
    @property
    def replay_done(self) -> bool:
        """The replay ended (its end marker arrived or it was given up): stop waiting for it."""
    @property
    def error(self) -> str | None:
        """Why the message was dropped (it did not decode; already counted in ``stats()``), or None."""

@final
class KvEventIngestor:
    """Applies vLLM KV-cache events (raw ZMQ frames) to a router's index.

    Sources are publishers (one per engine / data-parallel rank), each feeding one instance.
    ``on_message`` and the replay calls return an :class:`IngestStep`: send a replay request
    from ``replay_from`` when it is not None, stop waiting for the replay when ``replay_done``,
    and ``error`` describes a dropped message (already counted in ``stats()``).
    The socket loop is :class:`smetric.events.KvEventSubscriber`; semantics: ``docs/kv-events.md``.

    Raises:
        InvalidArgumentError: a negative limit, or a source id that was never issued or was removed.
    """

    DEFAULT_MAX_MAPPED_BLOCKS: Final[int]
    """``max_mapped_blocks`` when not given (the core's ``IngestConfig::DEFAULT``)."""
    DEFAULT_MAX_PENDING_BATCHES: Final[int]
    """``max_pending_batches`` when not given."""
    def __new__(cls, router: Router, *, max_mapped_blocks: int = ..., max_pending_batches: int = ...) -> Self: ...
    @property
    def router(self) -> Router:
        """The router whose index this ingestor feeds."""
    def add_source(self, instance: str, *, replay: bool = False, offload: Offload = "shared") -> int:
        """Registers a publisher feeding ``instance`` (``replay``: it has a replay endpoint;
        ``offload``: its CPU/STORAGE blocks are in a store every instance reads, ``"shared"``, or
        in the instance's own host memory, ``"host"``)."""
    def remove_source(self, source: int) -> None:
        """Unregisters a source and removes what it put in the index."""
    def reset_source(self, source: int) -> None:
        """Removes what a source put in the index and forgets its sequence state."""
    def on_message(self, source: int, frames: Sequence[bytes]) -> IngestStep:
        """Hands in one PUB message ``[topic, seq, payload]``."""
    def on_messages(self, source: int, messages: Sequence[Sequence[bytes]]) -> list[tuple[int, IngestStep]]:
        """Hands in several PUB messages of one source, in order, in one call.

        The same steps and index as ``on_message`` for each, but the GIL is released once and the
        router's index lock taken once for all of them (their writes become visible together, when
        the call returns). Returns only the steps that ask something of the caller (``replay_from``
        set, ``replay_done``, or an ``error``), each with the position of its message; usually
        none. A subscriber that drains its socket hands them in together, so a routing thread
        beside it waits once per batch, not once per message.
        """
    def on_replay_reply(self, source: int, frames: Sequence[bytes]) -> IngestStep:
        """Hands in one reply received on the source's replay DEALER (either reply layout)."""
    def on_replay_failed(self, source: int) -> IngestStep:
        """The source's replay timed out: resume from the held-back batches."""
    @overload
    def stats(self, source: None = None) -> IngestStats:
        """Counters of all sources, with what their events hold in the index now."""
    @overload
    def stats(self, source: int) -> IngestSourceStats:
        """Counters of one source (names in ``docs/kv-events.md``)."""

# --- cluster simulator (rust/smetric-py/src/sim.rs; typed facade: smetric.sim) ---

_Path: TypeAlias = str | os.PathLike[str]

@final
class Workload:
    """A loaded trace: immutable, shared by every run without copying its block ids."""

    @property
    def name(self) -> str:
        """Short description, e.g. ``"weka(1 file)"``."""
    @property
    def block_tokens(self) -> int:
        """Tokens per block of the hash chains (after any coarsening)."""
    @property
    def arrival(self) -> ArrivalKind:
        """``"closed_loop"`` (sessions), ``"open_loop"`` or ``"gated_open_loop"``."""
    @property
    def sessions(self) -> int:
        """Number of (sub)sessions."""
    @property
    def root_sessions(self) -> int:
        """Number of root sessions (the unit of closed-loop arrivals)."""
    @property
    def total_hash_ids(self) -> int:
        """Block ids stored over all requests."""
    @property
    def input_tokens(self) -> int:
        """Prompt tokens over all requests."""
    @property
    def output_tokens(self) -> int:
        """Output tokens over all requests."""
    @property
    def span_s(self) -> float:
        """Latest trace time of any request, seconds (open loop: the last arrival at 1x)."""
    def __len__(self) -> int: ...
    def replicate(self, copies: int, *, seed: int = 0) -> Workload:
        """``copies`` copies of a closed-loop workload (private block ids per copy, shared
        system-prompt ids stay shared), root sessions in a seeded random order.

        Raises:
            InvalidConfigError: ``copies`` is 0 or the workload is open-loop.
        """

def load_workload(
    paths: _Path | Sequence[_Path],
    format: TraceFormat,
    *,
    coarsen: int = ...,
    shared_prefix: bool = True,
    gate_on_parent: bool = False,
    synthetic: dict[str, Any] | None = None,
    codex: dict[str, Any] | None = None,
) -> Workload:
    """Loads a trace file (or, for ``"weka"``, several files as one workload).

    Arguments:
        paths: the trace file(s): JSON Lines, gzipped or not.
        format: ``"weka"``, ``"bailian"``, ``"mooncake"``, ``"azure"``, ``"synthetic"`` (the
            generated agent sessions) or ``"codex"`` (sessions generated from the Codex SWE-bench
            Pro trace's published statistics); the last two read no file: ``paths`` must be empty.
        coarsen: Weka only: keep every ``coarsen``-th 64-token id (block = 64·coarsen tokens).
        shared_prefix: Weka only: share the tool + system-prompt blocks across sessions.
        gate_on_parent: Bailian only: a child request also waits for its parent to finish.
        synthetic: ``"synthetic"`` only: generator options (keys of :func:`synthetic_defaults`)
            overriding the defaults.
        codex: ``"codex"`` only: ``sessions`` (610), ``seed`` (0), ``block_tokens`` (256),
            ``max_context_tokens`` (``None``: the engine's window minus 16,384).

    Raises:
        TraceFormatError: a bad record (``path`` and 1-based ``line``).
        OSError: the file cannot be read (``FileNotFoundError``, …).
        InvalidArgumentError: an unknown format, or several files for a one-file format.
        EmptyWorkloadError: no request in the file(s).
    """

def simulate(
    workload: Workload,
    policy: PolicyName,
    *,
    config: Mapping[str, Any] | None = None,
    router: RouterConfig | None = None,
    slo_variants: Sequence[Mapping[str, Any]] = ...,
) -> SimReport:
    """Simulates ``workload`` on a vLLM cluster, routing every request with the real router.

    Arguments:
        workload: a :class:`Workload`.
        policy: one of ``smetric.POLICIES``.
        config: ``SimConfig`` fields to override (keys of :func:`sim_config_defaults`;
            ``global_tier`` and ``slo`` as nested dicts, ``profile`` a built-in name, or
            ``profile_file`` a profile file's path instead; ``profile_overrides`` a dict of
            ``Profile`` fields set on top, see :func:`sim_profile`).
        router: the router's tunables (its capacities are set from the simulated pools).
        slo_variants: further SLOs to score the same run under (``report["slo_variants"]``).

    Returns:
        The report (:class:`smetric._types.SimReport`): plain dicts and lists.

    Raises:
        UnknownPolicyError, InvalidConfigError, EmptyWorkloadError, SimulationStalledError,
        SimulationError; TypeError for a value of the wrong type.
    """

def sim_config_defaults() -> SimConfigDefaults:
    """``SimConfig::default()`` as a dict (the router's defaults are ``RouterConfig()``'s)."""

def synthetic_defaults() -> SyntheticOptions:
    """``SyntheticOptions::default()``: the options of the ``"synthetic"`` format (the centre of
    the regime map, set to the published Bailian agent-trace statistics)."""

def workload_reuse_stats(workload: Workload, kv_tokens: int) -> ReuseStats:
    """Reuse statistics measured from a workload's chains against an instance KV of
    ``kv_tokens`` tokens."""

def sim_profiles() -> list[str]:
    """Names of the built-in hardware/model profiles."""

def sim_profile(
    profile: str | None = None,
    *,
    file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, float] | None = None,
) -> ResolvedProfile:
    """A resolved profile: a built-in one (default: the engine's) or a profile file
    (``docs/perf-model.md`` §9) instead, with ``overrides`` (``Profile`` fields) set on top.

    Raises:
        InvalidConfigError: an unknown profile, a bad file or override (``field`` names it).
        OSError: the file cannot be read.
    """

def sim_tier_paths() -> list[TierPath]:
    """Names of the global-tier paths (``global_tier.path``), the default first."""

def sim_pd_defaults() -> PdSettings:
    """``PdSimConfig::default()``: the settings of a PD run (``config["pd"]``)."""

@final
class PerfModel:
    """The simulator's analytic step time of one vLLM instance (``docs/perf-model.md``).

    Arguments:
        profile: a built-in profile name (:func:`sim_profiles`).

    Raises:
        InvalidConfigError: an unknown profile.
    """

    def __new__(cls, profile: str = "h20-qwen3-coder-30b-a3b") -> Self: ...
    @property
    def profile(self) -> str:
        """The profile's name."""
    @property
    def kv_capacity_tokens(self) -> int:
        """The instance's GPU KV cache, tokens."""
    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token across the instance's GPUs."""
    def step_time(self, prefills: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        """Seconds of one engine step running these ``(new, cached)`` prefill chunks and decodes
        (one per KV context length); 0.0 for an empty step."""
    def frontend_time(self, prompt_tokens: int) -> float:
        """Seconds the API server spends on a request before the engine sees it."""
    def pd_pull_time(self, tokens: int) -> float:
        """Seconds a decode instance waits to pull ``tokens`` KV tokens from a prefill instance
        when nothing else crosses its node's link (the simulator's default PD settings and NIC
        for this profile: ``smetric_sim::uncontended_pull_s``)."""

_KvEvent: TypeAlias = (
    tuple[str, Sequence[int], int | None, Sequence[int], int, str | None, str | None]
    | tuple[str, Sequence[int], str | None]
    | tuple[str]
)

def encode_kv_batch(ts: float, events: Sequence[_KvEvent], dp_rank: int | None = 0) -> bytes:
    """The msgpack payload vLLM's ``ZmqEventPublisher`` sends for a ``KVEventBatch`` (map form).

    Arguments:
        ts: the batch timestamp (seconds since the epoch).
        events: ``("BlockStored", hashes, parent, token_ids, block_size, lora_name, medium)``,
            ``("BlockRemoved", hashes, medium)`` or ``("AllBlocksCleared",)``; hashes are the
            64-bit ints of :func:`vllm_event_hash`.
        dp_rank: the engine's data-parallel rank.

    Raises:
        TypeError: an event is not one of the three shapes.
    """

@final
class PdDecision:
    """The outcome of :meth:`PdRouter.route`: a prefill and a decode instance."""

    @property
    def prefill_instance(self) -> str:
        """Name of the prefill instance."""
    @property
    def decode_instance(self) -> str:
        """Name of the decode instance."""
    @property
    def first_turn(self) -> bool:
        """Whether the request was treated as the first turn of its session."""
    @property
    def turn_source(self) -> TurnSource:
        """``"hint"``, ``"messages"`` or ``"index"``."""
    @property
    def local_hit_tokens(self) -> int:
        """Prompt tokens already cached on the prefill instance's GPU."""
    @property
    def global_hit_tokens(self) -> int:
        """Prompt tokens available from the global KV$ tier."""
    @property
    def prefill_tokens(self) -> int:
        """Tokens the prefill instance is expected to compute."""
    @property
    def decode_hit_tokens(self) -> int:
        """Prompt tokens the decode instance's prefix cache holds (not transferred)."""
    @property
    def transfer_tokens(self) -> int:
        """Prompt tokens to transfer from the prefill to the decode instance."""
    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens."""
    @property
    def reason(self) -> Reason:
        """Why the prefill policy chose the prefill instance."""
    @property
    def decode_rule(self) -> DecodeRule:
        """The rule that chose the decode instance."""
    @property
    def request_id(self) -> _RequestId:
        """The caller's id, or the one the router issued."""
    @property
    def policy(self) -> PolicyName:
        """The prefill policy."""

@final
class PdRouter:
    """Routes requests to a disaggregated prefill/decode fleet: one decision names both instances.

    The prefill side is a :class:`Router` over ``prefill`` (the same policy, index, load board and
    migration); the decode instance is chosen by ``decode_rule`` among the instances where the
    request's context fits (``None``: the policy's peer form — ``kv_fit`` for smetric: least
    resident KV plus transferred tokens; ``round_robin`` for round_robin; ``power_of_two``
    otherwise, as vllm-router and SMG run their decode side).

    Arguments:
        prefill: unique prefill instance names; at least one.
        decode: unique decode instance names (distinct from the prefill ones); at least one.
        policy: the prefill policy, one of ``smetric.POLICIES``.
        block_size: tokens per KV block.
        seed: seed of the random tie-breaks.
        config: the prefill side's :class:`RouterConfig`; defaults when ``None``.
        decode_rule: one of ``DECODE_RULES``, or ``None`` for the policy's peer form.
        decode_capacity_blocks: KV blocks of one decode instance (the fit test).
        decode_max_batch: requests one decode instance batches at most (vLLM ``max_num_seqs``).

    Raises:
        NoInstancesError, DuplicateInstanceError, UnknownPolicyError, InvalidBlockSizeError,
        InvalidConfigError.
    """

    def __new__(
        cls,
        prefill: Sequence[str],
        decode: Sequence[str],
        *,
        policy: PolicyName = "smetric",
        block_size: int = ...,
        seed: int = 0,
        config: RouterConfig | None = None,
        decode_rule: DecodeRule | None = None,
        decode_capacity_blocks: int = ...,
        decode_max_batch: int = ...,
    ) -> Self: ...
    def route(
        self,
        tokens: _Tokens | None = None,
        *,
        hashes: _Hashes | None = None,
        num_tokens: int | None = None,
        messages: Sequence[_Message] | None = None,
        turn: int | None = None,
        request_id: _RequestId | None = None,
        namespace: str | None = None,
        now: float | None = None,
        exclude: Sequence[str] | None = None,
        previous_instance: str | None = None,
        session_key: int | str | None = None,
    ) -> PdDecision:
        """Chooses the prefill and the decode instance of one request (arguments as :meth:`Router.route`;
        ``exclude`` names instances of either pool not to choose, ``previous_instance`` a prefill
        instance).

        Raises:
            InvalidTokenError, UnsupportedDtypeError, MissingPromptError, InvalidArgumentError,
            NoInstancesError (``exclude`` leaves no prefill or no decode instance).
        """
    def on_prefilled(self, request_id: _RequestId, now: float | None = None) -> bool:
        """The prefill instance computed the prompt at ``now`` (the prefill router's clock when
        ``None``); the KV transfer starts. Lowers its prefill backlog and times its drain rate."""
    def on_transferred(self, request_id: _RequestId) -> bool:
        """The decode instance has read the KV: the prefill instance's share of the request ends."""
    def on_finished(self, request_id: _RequestId, output_tokens: int = 0) -> bool:
        """The request finished on its decode instance (earlier phases applied if their calls never came)."""
    def on_aborted(self, request_id: _RequestId) -> bool:
        """The request was aborted in either phase: every counter it raised is lowered."""
    def update_load(
        self,
        instance: str,
        *,
        running: int | None = None,
        waiting: int | None = None,
        kv_usage: float | None = None,
        now: float | None = None,
    ) -> None:
        """Stores a prefill engine's load snapshot (as :meth:`Router.update_load`)."""
    def update_decode_load(self, instance: str, kv_usage: float, *, now: float | None = None) -> None:
        """Stores a decode engine's KV-cache usage in [0, 1] (fused with the router's reservations)."""
    def load(self, instance: str) -> InstanceLoad:
        """A prefill instance's load counters."""
    def decode_load(self, instance: str) -> DecodeLoad:
        """A decode instance's counters."""
    def stats(self) -> PdRouterStats:
        """PD counters."""
    @property
    def prefill_instances(self) -> list[str]: ...
    @property
    def decode_instances(self) -> list[str]: ...
    @property
    def policy(self) -> PolicyName: ...
    @property
    def decode_rule(self) -> DecodeRule: ...
    @property
    def block_size(self) -> int: ...
    @property
    def config(self) -> RouterConfig: ...
