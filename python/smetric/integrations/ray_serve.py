"""Ray Serve: :class:`SMetricRequestRouter`, a ``ray.serve.request_router.RequestRouter`` that asks smetric.

Every ``DeploymentHandle`` (each proxy, each calling replica, each driver) builds one request
router per deployment. This one keeps a :class:`smetric.Router` whose instances are the
deployment's replicas (``ReplicaID.unique_id``) and, for each pending request:

1. reads the prompt from the call's first argument (or its ``request`` / ``body`` keyword), an
   OpenAI-style body: token ids, a trace's ``hash_ids``, or ``messages`` (approximate tokens,
   :mod:`smetric.integrations._prompt`); a call without any routes the way Ray Serve does
   (every candidate in one rank, the shortest queue wins);
2. feeds the router each candidate's load: the replica's ``routing_stats`` (the deployment's
   ``record_routing_stats``) when they carry vLLM's ``num_requests_running`` /
   ``num_requests_waiting`` / ``kv_cache_usage_perc``, else the handle's cached queue length
   of the replica as its running count (clamped into the core's domain first,
   :func:`smetric.deployment.clamp_load`: a ``kv_cache_usage_perc`` of 1.7 or -1 is not an error);
3. routes (``request_id`` = Ray's ``internal_request_id``) and answers two ranks,
   ``[[chosen], [every other candidate]]``: Ray Serve sends to the chosen replica unless its
   queue is full (``max_ongoing_requests``), then to the shortest queue among the rest.

Lifecycle: ``on_request_routed`` learns the replica Ray actually used; when it is not the chosen
one the decision is aborted (its load leaves the wrong replica) and counted in
:attr:`SMetricRequestRouter.mismatched`. ``on_request_completed`` is the router's
``on_finished`` (a request re-chosen after a rejection is aborted first, so it counts once); a
decision never completed (cancelled between routing and sending) is aborted after ``stale_after_s``.
Replica changes (``update_replicas``, ``on_replica_actor_died``) add and remove instances. The
instance sync, the event feed, the expiry, the clamping and the sizing are
:class:`smetric.deployment.DeployedRouter`'s, shared with ``smetric serve`` and production-stack.

KV$ state. With ``index_mode="approximate"`` (default) the router inserts each prompt where it
sent it. With ``index_mode="exact"`` it follows the replicas' vLLM KV events instead: a replica
whose ``routing_stats`` hold ``kv_event_sources`` (a list of ``{"endpoint", "replay_endpoint",
"topic"}``, :func:`kv_event_sources_stats` builds it from vLLM's ``/kv_event_sources``) joins the
router's one :class:`smetric.events.KvEventSubscriber`, restarted when a replica's sources first
appear or change and when a replica goes (its blocks leave with its instance).

Across nodes: every handle's router subscribes to the same publishers and applies the same event
stream through the same deterministic ingestor, so with the same block size and hash seed their
indexes converge to the same state; each one lags the engines by the event path (a scheduler
step plus ZMQ delivery plus one drained batch: milliseconds on one network). Load is per handle:
its own in-flight requests fused (max) with replica stats that are up to
``request_routing_stats_period_s`` old, or queue lengths up to Ray's queue-length cache timeout
old. ``docs/integrations/ray-serve.md`` has the details.

Cost per request: one ``Router.route`` (hashing is linear in the prompt; scoring linear in the
replicas) plus one ``update_load`` per candidate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from smetric._core import DEFAULT_BLOCK_SIZE, Router
from smetric._types import IndexMode, PolicyName
from smetric.deployment import DEFAULT_STALE_AFTER_S, DeployedRouter
from smetric.errors import MissingExtraError, SmetricError
from smetric.integrations._prompt import Prompt, prompt_from_body, route

try:
    from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
except ModuleNotFoundError as e:
    # Ray itself (or a Ray without ray.serve.request_router), or a package of its `serve` extra.
    top = (e.name or "").partition(".")[0]
    raise MissingExtraError(__name__, "ray" if top == "ray" else "ray[serve]", "ray", name=top or e.name) from e

__all__ = [
    "KV_EVENT_SOURCES",
    "LOAD_STATS",
    "SMetricRequestRouter",
    "kv_event_sources_stats",
]

log = logging.getLogger("smetric.integrations.ray_serve")

LOAD_STATS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
"""``routing_stats`` keys read as a replica's engine load (vLLM's gauge names, without ``vllm:``)."""
KV_EVENT_SOURCES = "kv_event_sources"
"""``routing_stats`` key listing a replica's KV-event publishers (``index_mode="exact"``)."""


def kv_event_sources_stats(base_url: str, *, timeout: float = 2.0) -> dict[str, list[dict[str, str | None]]]:
    """``{"kv_event_sources": [...]}`` for a replica's ``record_routing_stats``, from its vLLM server.

    Asks ``GET {base_url}/kv_event_sources`` (:func:`smetric.events.discover_sources`); a wildcard
    host in the publisher's endpoints becomes ``base_url``'s host.
    """
    from smetric.events import discover_sources

    sources = discover_sources(base_url, base_url, timeout=timeout)
    return {
        KV_EVENT_SOURCES: [
            {"endpoint": s.endpoint, "replay_endpoint": s.replay_endpoint, "topic": s.topic} for s in sources
        ]
    }


def _payload(pending_request: PendingRequest) -> object:
    if pending_request.args:
        return pending_request.args[0]
    kwargs = pending_request.kwargs
    return kwargs.get("request", kwargs.get("body"))


def _sources(name: str, raw: Sequence[Mapping[str, Any]]) -> list[Any]:
    """A replica's ``kv_event_sources`` stats as :class:`smetric.events.KvEventSource` values."""
    from smetric.events import KvEventSource

    return [
        KvEventSource(
            instance=name,
            endpoint=str(s["endpoint"]),
            replay_endpoint=None if s.get("replay_endpoint") is None else str(s["replay_endpoint"]),
            topic=str(s.get("topic") or ""),
        )
        for s in raw
    ]


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


class SMetricRequestRouter(RequestRouter):
    """Routes a deployment's requests with :class:`smetric.Router` (see the module docs).

    Configure it with ``RequestRouterConfig(request_router_class=SMetricRequestRouter,
    request_router_kwargs={...})``; the keywords are those of :meth:`initialize_state`.
    """

    def initialize_state(
        self,
        policy: PolicyName = "smetric",
        block_size: int = DEFAULT_BLOCK_SIZE,
        seed: int = 0,
        index_mode: IndexMode = "approximate",
        config: Mapping[str, Any] | None = None,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        kv_capacity_tokens: int | None = None,
        **_: Any,
    ) -> None:
        """Keywords of ``request_router_kwargs``.

        Arguments:
            policy: one of ``smetric.POLICIES``.
            block_size: the engines' KV block size (a trace's block size for ``hash_ids``).
            seed: seed of the router's random tie-breaks (the same on every handle: same choices).
            index_mode: ``"approximate"`` (insert on route) or ``"exact"`` (the replicas' KV events).
            config: other :class:`smetric.RouterConfig` fields, by name (``index_mode`` wins).
            stale_after_s: a decision Ray never reports complete (a request cancelled between
                routing and sending) is aborted after this long.
            kv_capacity_tokens: the replicas' GPU KV capacity in tokens (vLLM's
                ``num_gpu_blocks × block_size``), the router's per-replica capacity; a handle
                cannot reach its replicas' engines before it routes, so it is declared here.
        """
        self._deployed = DeployedRouter(
            policy=policy,
            block_size=block_size,
            seed=seed,
            index_mode=index_mode,
            config=config,
            stale_after_s=stale_after_s,
            kv_capacity_tokens=kv_capacity_tokens,
        )
        self.mismatched = 0
        """Requests Ray sent to another replica than the chosen one (its queue was full)."""
        self.unrouted = 0
        """Requests without a prompt, routed Ray's way."""

    @property
    def router(self) -> Router | None:
        """The smetric router (``None`` until the first replicas arrive)."""
        return self._deployed.router

    @property
    def expired(self) -> int:
        """Decisions aborted after ``stale_after_s`` without a completion."""
        return self._deployed.expired

    @property
    def subscribed_replicas(self) -> frozenset[str]:
        """Replicas whose KV events this router subscribes to (``index_mode="exact"``): a replica
        joins once a request is routed after its ``routing_stats`` listed its publishers."""
        return self._deployed.subscribed

    # -- replicas -------------------------------------------------------------------------------

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        names = [r.replica_id.unique_id for r in replicas]
        if names or self._deployed.router is not None:
            self._deployed.sync(names)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._deployed.remove(replica_id.unique_id)

    # -- load and KV events ---------------------------------------------------------------------

    def _observe(self, replica: RunningReplica) -> None:
        name = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        running, waiting, kv_usage = (_number(stats.get(k)) for k in LOAD_STATS)
        if running is None and waiting is None and kv_usage is None:
            queue_len = self._replica_queue_len_cache.get(replica.replica_id)
            running = None if queue_len is None else float(queue_len)
        self._deployed.update_load(name, running, waiting, kv_usage)
        if self._deployed.exact and stats.get(KV_EVENT_SOURCES):
            self._deployed.set_sources(name, _sources(name, stats[KV_EVENT_SOURCES]))

    # -- routing --------------------------------------------------------------------------------

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        router = self._deployed.router
        prompt: Prompt | None = None if pending_request is None else prompt_from_body(_payload(pending_request))
        if router is None or prompt is None or pending_request is None or not candidate_replicas:
            self.unrouted += pending_request is not None
            return [candidate_replicas]
        for replica in candidate_replicas:
            self._observe(replica)
        request_id = pending_request.metadata.internal_request_id
        self._deployed.expire()
        self._deployed.aborted(request_id)  # re-chosen after a rejection: count it once
        try:
            decision = route(router, prompt, request_id)
        except SmetricError:
            log.exception("smetric could not route request %s; routing it Ray's way", request_id)
            self.unrouted += 1
            return [candidate_replicas]
        self._deployed.routed(request_id, decision.instance)
        chosen = [r for r in candidate_replicas if r.replica_id.unique_id == decision.instance]
        rest = [r for r in candidate_replicas if r.replica_id.unique_id != decision.instance]
        return [chosen, rest] if chosen else [rest]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        chosen = self._deployed.in_flight.instance(request_id)
        if chosen is not None and chosen != replica_id.unique_id:
            self.mismatched += 1
            self._deployed.aborted(request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._deployed.finished(internal_request_id)
