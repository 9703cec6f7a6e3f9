"""The configuration of ``smetric serve``: one TOML or YAML file, flags on top.

Every setting has one default, here. A file looks like this (TOML; the YAML form has the same
keys)::

    port = 8080
    policy = "smetric"              # any of smetric.POLICIES
    block_size = 16                 # vLLM's --block-size (default: smetric.DEFAULT_BLOCK_SIZE)
    [router]                        # RouterConfig fields (docs/routing-semantics.md §9)
    overload_factor = 1.5
    [tokens]
    mode = "auto"                   # auto | ids | tokenizer | approximate (docs/routing-tokens.md)
    tokenizer = "/models/qwen3/tokenizer.json"
    [[instances]]
    url = "http://10.0.0.1:8000"
    kv_events = "discover"          # discover (GET /kv_event_sources) | off | tcp://host:port
    [[instances]]
    url = "http://10.0.0.2:8000"
    kv_events = "tcp://10.0.0.2:5557"
    kv_replay = "tcp://10.0.0.2:5558"
    kv_offload = "host"             # auto (default) | shared | host: its CPU KV$ is its own (docs §2.8)
    host_pool = "node-b"            # optional: instances naming one pool share a node-local store

``smetric serve --port 8080 --instance http://10.0.0.1:8000 --instance http://10.0.0.2:8000``
needs no file. Flags override the file; ``--instance`` flags replace its instance list.

May import (inside ``smetric.serve``): :mod:`.tokens` (its ``TokenConfig`` is the ``[tokens]`` table).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

from smetric._core import DEFAULT_BLOCK_SIZE, POLICIES, RouterConfig
from smetric._types import SessionAdmissionMode
from smetric.deployment import deployed_fields
from smetric.errors import InvalidConfigError, MissingExtraError
from smetric.serve.tokens import TOKEN_MODES, TokenConfig

SESSION_ADMISSION_MODES: tuple[str, ...] = get_args(SessionAdmissionMode)
"""The session-admission modes (:attr:`ServeConfig.session_admission`), the core's."""

REMOVED_SETTINGS = {
    "data_plane": "the compiled gateway is the only data plane since 2026-12-05 (docs/proxy-data-plane.md, stage 6)"
}
"""Settings a file may still carry from an older release, and why they are gone: named in the
error, not lumped with misspellings."""

REPLICA_BUS_ENV = "SMETRIC_REPLICA_BUS"
"""The environment variable :func:`load_config` reads ``replica_bus`` from (above the file, below
the flag)."""
RESPONSE_ID_KEY_ENV = "SMETRIC_RESPONSE_ID_KEY"
"""The environment variable :func:`load_config` reads ``response_id_key`` from (above the file,
below a flag)."""
MIN_RESPONSE_ID_KEY_BYTES = 16
"""The shortest ``response_id_key`` taken (UTF-8 bytes): 128 bits if it is random; a shorter
secret could be guessed, and then anyone could forge an id that pins a request to an instance."""

MIN_HEAD_BYTES = 8192
"""The smallest ``max_head_bytes``: the compiled gateway's HTTP parser (hyper) buffers at least this."""

KV_EVENTS_DISCOVER = "discover"
KV_EVENTS_OFF = "off"
KV_OFFLOAD_AUTO = "auto"
KV_OFFLOAD_SHARED = "shared"
KV_OFFLOAD_HOST = "host"
KV_OFFLOADS = (KV_OFFLOAD_AUTO, KV_OFFLOAD_SHARED, KV_OFFLOAD_HOST)
HOST_POOL_GPU_MULTIPLE = 4
"""A host pool's size in GPU caches when an instance offloads to host memory and the file does
not set ``host_capacity_blocks``: an H20 node's host DRAM per GPU is about four of its KV caches."""


def _bad(field: str, reason: str) -> InvalidConfigError:
    return InvalidConfigError(f"invalid serve setting {field}: {reason}", field=field, reason=reason)


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """One vLLM instance behind the proxy.

    Attributes:
        url: its base URL (``http://host:port``); also the instance's name in the router.
        kv_events: ``"discover"`` (ask ``GET {url}/kv_event_sources``, vLLM's endpoint; no events
            when it is missing), ``"off"``, or the publisher's PUB endpoint (``tcp://host:5557``).
        kv_replay: the publisher's replay endpoint, with an explicit ``kv_events``.
        metrics_url: where its load is scraped (vLLM's ``/metrics``); ``None``: ``{url}/metrics``.
        kv_offload: where the engine's CPU/STORAGE KV$ lives: ``"shared"`` (a store every
            instance reads — Mooncake, a shared LMCache server — the global tier), ``"host"``
            (its own host memory — vLLM's ``OffloadingConnector``, LMCache's local CPU backend —
            credited to this instance only; docs/routing-semantics.md §2.8), or ``"auto"``:
            ``"host"`` when the engine announces ``--kv-offloading-size`` on ``/metrics``
            (``vllm:cache_config_info``), else ``"shared"``. A connector set with
            ``--kv-transfer-config`` (Mooncake, a remote LMCache) is not announced there: declare it.
        host_pool: with ``kv_offload = "host"``, a pool name shared by the instances of one node
            whose engines read one node-local store; ``None``: the instance's own host memory.
    """

    url: str
    kv_events: str = KV_EVENTS_DISCOVER
    kv_replay: str | None = None
    metrics_url: str | None = None
    kv_offload: str = KV_OFFLOAD_AUTO
    host_pool: str | None = None

    def __post_init__(self) -> None:
        for name in ("url", "kv_events", "kv_replay", "metrics_url", "kv_offload", "host_pool"):
            value = getattr(self, name)
            if not (isinstance(value, str) or (value is None and name in ("kv_replay", "metrics_url", "host_pool"))):
                raise _bad(name, f"{name} must be a string, not {type(value).__name__}")
        if not self.url.startswith(("http://", "https://")):
            raise _bad("url", f"instance url must be http(s)://host:port, got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.kv_events not in (KV_EVENTS_DISCOVER, KV_EVENTS_OFF) and "://" not in self.kv_events:
            raise _bad("kv_events", f"kv_events must be 'discover', 'off' or a ZMQ endpoint, got {self.kv_events!r}")
        if self.kv_offload not in KV_OFFLOADS:
            raise _bad("kv_offload", f"kv_offload must be one of {KV_OFFLOADS}, got {self.kv_offload!r}")
        if self.host_pool is not None and (not self.host_pool or self.kv_offload != KV_OFFLOAD_HOST):
            raise _bad("host_pool", "host_pool is a non-empty name, and only goes with kv_offload = 'host'")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Every setting of ``smetric serve``."""

    instances: tuple[InstanceConfig, ...] = ()
    """Co-located instances (each prefills and decodes its own requests)."""
    prefill: tuple[InstanceConfig, ...] = ()
    """Disaggregated mode: the prefill instances (with ``decode``, instead of ``instances``)."""
    decode: tuple[InstanceConfig, ...] = ()
    """Disaggregated mode: the decode instances."""
    decode_rule: str | None = None
    """PD: the decode-side rule (``smetric.DECODE_RULES``); None: the policy's peer form."""
    host: str = "127.0.0.1"
    port: int = 8080
    policy: str = "smetric"
    block_size: int = DEFAULT_BLOCK_SIZE
    """vLLM's ``--block-size`` of every instance (the router hashes blocks of this many tokens)."""
    seed: int = 0
    router: dict[str, Any] = field(default_factory=dict)
    """:class:`smetric.RouterConfig` fields; ``index_mode`` defaults to ``exact`` when every instance
    publishes KV events and the tokens are exact, else ``approximate``."""
    tokens: TokenConfig = field(default_factory=TokenConfig)
    """How the routed token ids are made (:class:`smetric.serve.tokens.TokenConfig`, the ``[tokens]`` table)."""
    engine_load: bool = True
    """Scrape each instance's ``/metrics`` (running / waiting / KV usage) into the load board."""
    engine_load_period_s: float = 0.25
    max_attempts: int = 3
    """Instances tried per request before a connection error or 5xx is returned (≥ 1)."""
    eject_after: int = 3
    """Consecutive failures that eject an instance until a ``/health`` probe succeeds."""
    probe_interval_s: float = 1.0
    connect_timeout_s: float = 3.0
    first_byte_timeout_s: float = 600.0
    """Upstream wait for response headers (non-streamed: the whole answer) and for the first chunk."""
    idle_timeout_s: float = 120.0
    """Upstream wait between two chunks of a stream."""
    client_timeout_s: float = 1800.0
    """A request's whole life in the proxy, retries included."""
    max_body_bytes: int = 64 << 20
    max_header_bytes: int = 8190
    """Longest request line or header field (name or value): aiohttp's default, the app's and the
    fake engine's parser, so a header the proxy accepts is one they accept too (431 past it)."""
    max_head_bytes: int = 16384
    """Longest whole request head (request line and every field): h11's default
    (``max_incomplete_event_size``), the bound of vLLM's server (uvicorn), so a head the proxy
    forwards is one the engine reads, not one it answers with its own 400 (431 past it). At
    least 8192 (the compiled gateway's HTTP parser needs that much buffer)."""
    head_timeout_s: float = 15.0
    """A request head must arrive whole within this long of its first byte (slow clients)."""
    body_timeout_s: float = 60.0
    """A request body must arrive whole within this long of its head (408 after)."""
    keepalive_timeout_s: float = 75.0
    """An idle client connection is closed after this long."""
    max_connections: int = 8192
    """Open client connections; one more is answered 503 and closed before it is read. Above
    the admission queue's reach on purpose (a 5,000-connection burst is admission's to shed,
    ``tests/serve/test_burst.py``); each open connection costs a file descriptor and its buffers."""
    resume_streams: bool = True
    """A chat stream cut after its first chunk continues on another instance with vLLM's
    ``continue_final_message`` (text completions: the prompt plus the text so far)."""
    drain_timeout_s: float = 30.0
    """On SIGTERM, how long in-flight requests may take to finish."""
    admin_token: str | None = None
    """Enables ``POST/DELETE /admin/instances`` for requests bearing this token."""
    models_refresh_s: float = 10.0
    """How often ``/v1/models`` of every instance is asked again."""
    response_id_key: str | None = field(default=None, repr=False)
    """The key of the ids the proxy issues for stored responses (:mod:`smetric.serve.pinning`):
    proxy replicas in front of one fleet must share it; None: a random key per process. At least
    :data:`MIN_RESPONSE_ID_KEY_BYTES` bytes; never shown (not in the config's ``repr`` nor in an
    error). :func:`load_config` also reads it from :data:`RESPONSE_ID_KEY_ENV`."""
    replica_bus: str | None = None
    """A NATS server (``nats://HOST:PORT``) the proxy replicas in front of one fleet share their
    in-flight work over (:mod:`smetric.serve.replica_bus`): each routes on every replica's
    requests, not only its own. None: off. :func:`load_config` also reads it from
    :data:`REPLICA_BUS_ENV`. Co-located mode only."""
    replica_bus_subject: str = "smetric.replicas.load"
    """The NATS subject of the load snapshots: one per fleet (replicas of two fleets on one server
    must not see each other's instances' work)."""
    replica_bus_period_s: float = 0.05
    """How often a replica publishes its board: the staleness bound of its peers' view, plus a hop."""
    replica_peer_expiry_s: float = 2.0
    """A peer silent this long is dropped with its in-flight work."""
    # -- sessions (smetric.serve.session; docs/serve.md, "Session life") --
    parent_affinity: bool = True
    """A sub-agent's first request (it names a parent the proxy has seen; its own session is new)
    starts on the instance that answered the parent last, when that instance is at most
    ``parent_affinity_margin`` requests busier than the least busy candidate. Co-located mode."""
    parent_affinity_margin: int = 4
    """The parent rule's margin, in requests in flight (the router's load board): a few requests
    of imbalance cost less than prefilling the parent's shared prefix again elsewhere; past it the
    parent's instance is the fleet's hot spot, and a burst of sub-agents must not pile onto it."""
    # -- session admission (rust/smetric-gateway/src/session_gate.rs; docs/serve.md) --
    session_admission: SessionAdmissionMode = "off"
    """``"pause"``: when a request's instance cannot hold the KV of its resident sessions, its idle
    sessions are paused, else the request waits (ThunderAgent's per-pod form). ``"smetric"``: the
    same, but a request that would wait is placed on another instance with room whose source for
    its prefix is no dearer. ``"off"``: every request goes where the policy sends it. Only
    requests that name a session are gated; served by the compiled gateway's native path."""
    session_capacity_tokens: int | None = None
    """One instance's KV capacity in tokens for session admission; None: what the engines publish
    on ``/metrics`` (``vllm:cache_config_info``, the smallest over the fleet)."""
    session_max_held: int = 256
    """Requests that may wait for KV room at once; one more is refused with 429."""
    session_hold_timeout_s: float = 30.0
    """How long a request may wait for KV room before a 503 (a session's think time, p90 23 s in
    the Codex statistics, is what a held turn usually waits for)."""
    session_max_hold_s: float | None = None
    """The longest a request is held before it is admitted where its policy sent it, room or not;
    None: the mode's own (``"pause"`` holds until there is room or the timeout; ``"smetric"``: the
    core's ``DEFAULT_SMETRIC_MAX_HOLD_S``)."""
    # -- admission (smetric.serve.admission) and keys (smetric.serve.auth) --
    max_in_flight: int = 4096
    """Requests admitted at once across the fleet (the admission cap; docs/serve.md)."""
    max_in_flight_per_instance: int = 256
    """Admitted requests per live instance (vLLM's default ``--max-num-seqs``): the fleet admits
    ``min(max_in_flight, this × live instances)``."""
    queue_size: int = 1024
    """Requests that may wait for an admission slot; beyond it, 429 at once."""
    queue_timeout_s: float = 30.0
    """How long a request may wait for a slot before a 503."""
    retry_after_s: int = 1
    """The ``Retry-After`` of a 429 or 503 from admission."""
    api_keys: tuple[str, ...] = ()
    """Client keys the proxy accepts (``Authorization: Bearer`` or ``x-api-key``); none: open."""
    api_keys_file: str | None = None
    """A file of client keys, one a line (``#`` comments), added to ``api_keys``."""
    upstream_api_key: str | None = None
    """The key the proxy sends to every engine (vLLM's ``--api-key``), on requests, ``/v1/models``,
    ``/health``, ``/metrics`` and ``/kv_event_sources``."""
    decision_log: str | None = None
    """A file the proxy appends one JSON line per request to (``smetric.serve.decision_log``); None: off."""

    def __post_init__(self) -> None:
        if bool(self.prefill) != bool(self.decode):
            raise _bad("prefill", "disaggregated mode needs both --prefill and --decode instances")
        if self.prefill and self.instances:
            raise _bad("instances", "give --instance (co-located) or --prefill/--decode (disaggregated), not both")
        if not self.instances and not self.prefill:
            raise _bad("instances", "at least one instance is needed (--instance URL)")
        urls = [i.url for i in self.all_instances]
        if len(set(urls)) != len(urls):
            raise _bad("instances", "instance urls must be unique")
        key = self.response_id_key
        if key is not None and not isinstance(key, str):
            raise _bad("response_id_key", f"response_id_key must be a string, not {type(key).__name__}")
        if key is not None and len(key.encode()) < MIN_RESPONSE_ID_KEY_BYTES:
            # The key's length only, never the key.
            raise _bad(
                "response_id_key",
                f"response_id_key must be at least {MIN_RESPONSE_ID_KEY_BYTES} bytes, got {len(key.encode())}"
                f" (from --response-id-key, {RESPONSE_ID_KEY_ENV} or the file)",
            )
        if self.replica_bus is not None:
            bus = self.replica_bus
            if not isinstance(bus, str) or not bus.startswith(("nats://", "tls://")) or len(bus) <= len("nats://"):
                raise _bad("replica_bus", f"replica_bus must be a nats:// or tls:// URL, got {bus!r}")
            if self.prefill:
                raise _bad("replica_bus", "replica_bus is for co-located mode (the PD router keeps its own board)")
        if not (self.replica_bus_period_s > 0 and self.replica_peer_expiry_s > self.replica_bus_period_s):
            raise _bad("replica_peer_expiry_s", "need replica_bus_period_s > 0 and replica_peer_expiry_s above it")
        if self.policy not in POLICIES:
            raise _bad("policy", f"unknown policy {self.policy!r} (known: {', '.join(POLICIES)})")
        for name in ("max_in_flight", "max_in_flight_per_instance", "queue_size", "retry_after_s"):
            if getattr(self, name) < 1:
                raise _bad(name, f"{name} must be >= 1")
        if isinstance(self.parent_affinity_margin, bool) or not isinstance(self.parent_affinity_margin, int):
            raise _bad("parent_affinity_margin", "parent_affinity_margin must be an integer")
        if self.parent_affinity_margin < 0:
            raise _bad("parent_affinity_margin", "parent_affinity_margin must be >= 0")
        if not isinstance(self.parent_affinity, bool):
            raise _bad("parent_affinity", "parent_affinity must be true or false")
        if self.session_admission not in SESSION_ADMISSION_MODES:
            raise _bad(
                "session_admission",
                f"must be one of {', '.join(SESSION_ADMISSION_MODES)}, got {self.session_admission!r}",
            )
        if self.session_capacity_tokens is not None and self.session_capacity_tokens < 1:
            raise _bad("session_capacity_tokens", "session_capacity_tokens must be >= 1")
        if self.session_max_held < 1:
            raise _bad("session_max_held", "session_max_held must be >= 1")
        if not self.session_hold_timeout_s > 0:
            raise _bad("session_hold_timeout_s", "session_hold_timeout_s must be > 0")
        if self.session_max_hold_s is not None and not 0 <= self.session_max_hold_s < math.inf:
            raise _bad("session_max_hold_s", "session_max_hold_s must be a finite number >= 0")
        if self.session_admission != "off" and self.prefill:
            raise _bad(
                "session_admission",
                "session admission is a co-located stage (not with --prefill/--decode)",
            )
        if not self.queue_timeout_s > 0:
            raise _bad("queue_timeout_s", "queue_timeout_s must be > 0")
        if self.max_head_bytes < MIN_HEAD_BYTES:
            raise _bad("max_head_bytes", f"max_head_bytes must be >= {MIN_HEAD_BYTES}")
        for name in (
            "max_attempts",
            "eject_after",
            "block_size",
            "max_body_bytes",
            "max_header_bytes",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise _bad(name, f"{name} must be >= 1")
        for name in (
            "probe_interval_s",
            "connect_timeout_s",
            "first_byte_timeout_s",
            "idle_timeout_s",
            "head_timeout_s",
            "body_timeout_s",
            "keepalive_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise _bad(name, f"{name} must be > 0")
        if self.tokens.mode not in TOKEN_MODES:
            raise _bad("tokens.mode", f"unknown tokens mode {self.tokens.mode!r}")
        if self.tokens.mode == "tokenizer" and not self.tokens.tokenizer:
            raise _bad("tokens.tokenizer", "tokens mode 'tokenizer' needs tokens.tokenizer")
        try:
            RouterConfig(**self.router)  # the core validates its own values (a typed error)
        except TypeError as e:
            raise _bad("router", f"not a RouterConfig field set: {e}") from e

    @property
    def disaggregated(self) -> bool:
        """Prefill/decode disaggregated mode (``prefill`` and ``decode`` given)."""
        return bool(self.prefill)

    @property
    def all_instances(self) -> tuple[InstanceConfig, ...]:
        """Every instance: the co-located ones, or the prefill then the decode ones."""
        return self.instances or (*self.prefill, *self.decode)

    def with_discovered_offload(self, offload_tokens: Mapping[str, int | None]) -> ServeConfig:
        """This config with every ``kv_offload = "auto"`` instance resolved: ``"host"`` when its
        engine announced a host-memory cache (``offload_tokens[url]`` not None:
        :func:`smetric.deployment.fleet_host_offload`), else ``"shared"``."""

        def resolve(inst: InstanceConfig) -> InstanceConfig:
            if inst.kv_offload != KV_OFFLOAD_AUTO:
                return inst
            found = offload_tokens.get(inst.url) is not None
            return dataclasses.replace(inst, kv_offload=KV_OFFLOAD_HOST if found else KV_OFFLOAD_SHARED)

        return dataclasses.replace(
            self,
            instances=tuple(map(resolve, self.instances)),
            prefill=tuple(map(resolve, self.prefill)),
            decode=tuple(map(resolve, self.decode)),
        )

    def with_session_capacity(self, kv_capacity_tokens: int | None) -> ServeConfig:
        """This config with ``session_capacity_tokens`` taken from the engines' published KV
        capacity when session admission is on and the setting is unset; the admission cannot
        run blind, so neither giving one is an error naming the setting."""
        if self.session_admission == "off" or self.session_capacity_tokens is not None:
            return self
        if kv_capacity_tokens is None or kv_capacity_tokens < 1:
            raise _bad(
                "session_capacity_tokens",
                "session admission needs one instance's KV capacity: the engines publish none"
                " (vllm:cache_config_info on /metrics); set session_capacity_tokens",
            )
        return dataclasses.replace(self, session_capacity_tokens=kv_capacity_tokens)

    def router_config(
        self, *, exact_index: bool, kv_capacity_tokens: int | None = None, host_offload_tokens: int | None = None
    ) -> RouterConfig:
        """The router's config: the file's fields, and unless the file sets them,

        * ``index_mode`` by the event feed (``exact`` when every instance's events can be trusted);
        * the deployment's sizes (:func:`smetric.deployment.deployed_fields`): the engines' own KV
          capacity (the smallest instance's ``vllm:cache_config_info``), no global tier;
        * host pools (docs/routing-semantics.md §2.8) when an instance offloads to host memory
          (``kv_offload = "host"``): each pool holds ``host_offload_tokens`` (the smallest engine's
          announced host cache) when known and positive, else ``HOST_POOL_GPU_MULTIPLE`` GPU caches.
        """
        fields = deployed_fields(self.router, block_size=self.block_size, kv_capacity_tokens=kv_capacity_tokens)
        fields.setdefault("index_mode", "exact" if exact_index else "approximate")
        if any(i.kv_offload == KV_OFFLOAD_HOST for i in self.all_instances):
            if host_offload_tokens is not None and host_offload_tokens >= self.block_size:
                fields.setdefault("host_capacity_blocks", host_offload_tokens // self.block_size)
            local = int(fields.get("local_capacity_blocks", RouterConfig().local_capacity_blocks))
            fields.setdefault("host_capacity_blocks", HOST_POOL_GPU_MULTIPLE * local)
        return RouterConfig(**fields)


def _read_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ModuleNotFoundError as e:
            raise MissingExtraError(__name__, "pyyaml", "serve", name=e.name) from e
        data = yaml.safe_load(text) or {}
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise _bad("file", f"{path}: {e}") from e
    if not isinstance(data, dict):
        raise _bad("file", f"{path}: the top level must be a table")
    return cast(dict[str, Any], data)


def _instance(item: object) -> InstanceConfig:
    if isinstance(item, InstanceConfig):
        return item
    if isinstance(item, str):
        return InstanceConfig(url=item)
    if not isinstance(item, dict):
        raise _bad("instances", f"an instance is a URL or a table, got {item!r}")
    known = {f.name for f in dataclasses.fields(InstanceConfig)}
    unknown = set(item) - known
    if unknown:
        raise _bad("instances", f"unknown instance keys {sorted(unknown)}")
    return InstanceConfig(**item)


def load_config(path: str | Path | None = None, **overrides: Any) -> ServeConfig:
    """The configuration from ``path`` (TOML, or YAML by suffix) with ``overrides`` on top.

    ``overrides`` are :class:`ServeConfig` fields (``None`` values are ignored); ``instances`` may
    be URLs. ``tokens`` may be a table. ``response_id_key``: an override, else the environment's
    :data:`RESPONSE_ID_KEY_ENV` (when set, even empty), else the file's, else None.

    Raises:
        InvalidConfigError: an unknown key, a bad value, or no instance.
    """
    data: dict[str, Any] = _read_file(Path(path)) if path is not None else {}
    if (key := os.environ.get(RESPONSE_ID_KEY_ENV)) is not None:
        data["response_id_key"] = key
    if bus := os.environ.get(REPLICA_BUS_ENV):
        data["replica_bus"] = bus
    data.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(ServeConfig)}
    for name in sorted(set(data) & set(REMOVED_SETTINGS)):
        raise _bad(name, f"{name} is no longer a setting: {REMOVED_SETTINGS[name]}")
    unknown = set(data) - known
    if unknown:
        raise _bad("file", f"unknown settings {sorted(unknown)}")
    for pool in ("instances", "prefill", "decode"):
        data[pool] = tuple(_instance(i) for i in data.get(pool, ()))
    tokens = data.get("tokens", {})
    if isinstance(tokens, dict):
        tokens_known = {f.name for f in dataclasses.fields(TokenConfig)}
        if set(tokens) - tokens_known:
            raise _bad("tokens", f"unknown tokens keys {sorted(set(tokens) - tokens_known)}")
        data["tokens"] = TokenConfig(**tokens)
    if isinstance(data.get("api_keys"), list | tuple):
        data["api_keys"] = tuple(str(k) for k in data["api_keys"])
    elif "api_keys" in data:
        raise _bad("api_keys", "api_keys must be a list of strings")
    router = data.get("router", {})
    if not isinstance(router, dict):
        raise _bad("router", "router must be a table of RouterConfig fields")
    return ServeConfig(**data)
