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
   of the replica as its running count;
3. routes (``request_id`` = Ray's ``internal_request_id``) and answers two ranks,
   ``[[chosen], [every other candidate]]``: Ray Serve sends to the chosen replica unless its
   queue is full (``max_ongoing_requests``), then to the shortest queue among the rest.

Lifecycle: ``on_request_routed`` learns the replica Ray actually used; when it is not the chosen
one the decision is aborted (its load leaves the wrong replica) and counted in
:attr:`SMetricRequestRouter.mismatched`. ``on_request_completed`` is the router's
``on_finished`` (a request re-chosen after a rejection is aborted first, so it counts once); a
decision never completed (cancelled between routing and sending) is aborted after ``stale_after_s``.
Replica changes (``update_replicas``, ``on_replica_actor_died``) add and remove instances.

KV$ state. With ``index_mode="approximate"`` (default) the router inserts each prompt where it
sent it. With ``index_mode="exact"`` it follows the replicas' vLLM KV events instead: a replica
whose ``routing_stats`` hold ``kv_event_sources`` (a list of ``{"endpoint", "replay_endpoint",
"topic"}``, :func:`kv_event_sources_stats` builds it from vLLM's ``/kv_event_sources``) gets one
:class:`smetric.events.KvEventSubscriber`, started when the sources first appear and stopped
(its blocks removed) when the replica goes.

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
import time
from collections.abc import Mapping, Sequence
from typing import Any

from smetric._core import Decision, Router, RouterConfig
from smetric._types import IndexMode, PolicyName
from smetric.deployment import deployed_fields
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
        block_size: int = 16,
        seed: int = 0,
        index_mode: IndexMode = "approximate",
        config: Mapping[str, Any] | None = None,
        stale_after_s: float = 600.0,
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
        """
        fields = deployed_fields(config or {}, block_size=block_size)
        fields["index_mode"] = index_mode
        self._policy: PolicyName = policy
        self._block_size = block_size
        self._seed = seed
        self._config = RouterConfig(**fields)
        self._router: Router | None = None
        self._decisions: dict[str, tuple[Decision, float]] = {}  # in routing order
        self._stale_after_s = stale_after_s
        self._subscribers: dict[str, Any] = {}  # instance -> smetric.events.KvEventSubscriber
        self.mismatched = 0
        """Requests Ray sent to another replica than the chosen one (its queue was full)."""
        self.unrouted = 0
        """Requests without a prompt, routed Ray's way."""
        self.expired = 0
        """Decisions aborted after ``stale_after_s`` without a completion."""

    @property
    def router(self) -> Router | None:
        """The smetric router (``None`` until the first replicas arrive)."""
        return self._router

    @property
    def subscribed_replicas(self) -> frozenset[str]:
        """Replicas whose KV events this router subscribes to (``index_mode="exact"``): a replica
        joins once a request is routed after its ``routing_stats`` listed its publishers."""
        return frozenset(self._subscribers)

    # -- replicas -------------------------------------------------------------------------------

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        names = [r.replica_id.unique_id for r in replicas]
        if self._router is None:
            if not names:
                return
            self._router = Router(
                names, policy=self._policy, block_size=self._block_size, seed=self._seed, config=self._config
            )
        live = set(self._router.instances)
        for name in names:
            if name not in live:
                self._router.add_instance(name)
        for name in live - set(names):
            self._drop(name)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        if self._router is not None and replica_id.unique_id in self._router.instances:
            self._drop(replica_id.unique_id)

    def _drop(self, name: str) -> None:
        subscriber = self._subscribers.pop(name, None)
        if subscriber is not None:
            subscriber.stop(clear=True)
        if self._router is not None:
            self._router.remove_instance(name)

    # -- load and KV events ---------------------------------------------------------------------

    def _observe(self, router: Router, replica: RunningReplica) -> None:
        name = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        running, waiting, kv_usage = (_number(stats.get(k)) for k in LOAD_STATS)
        if running is None and waiting is None and kv_usage is None:
            queue_len = self._replica_queue_len_cache.get(replica.replica_id)
            running = None if queue_len is None else float(queue_len)
        if running is not None or waiting is not None or kv_usage is not None:
            router.update_load(
                name,
                running=None if running is None else int(running),
                waiting=None if waiting is None else int(waiting),
                kv_usage=kv_usage,
            )
        if self._config.index_mode == "exact" and name not in self._subscribers and stats.get(KV_EVENT_SOURCES):
            self._subscribe(router, name, stats[KV_EVENT_SOURCES])

    def _subscribe(self, router: Router, name: str, raw: Sequence[Mapping[str, Any]]) -> None:
        from smetric.events import KvEventSource, KvEventSubscriber

        sources = [
            KvEventSource(
                instance=name,
                endpoint=str(s["endpoint"]),
                replay_endpoint=None if s.get("replay_endpoint") is None else str(s["replay_endpoint"]),
                topic=str(s.get("topic") or ""),
            )
            for s in raw
        ]
        try:
            self._subscribers[name] = KvEventSubscriber(router, sources).start()
        except Exception:
            # A publisher that cannot be reached now is retried on the next request.
            log.exception("KV events of replica %s (%s) not subscribed", name, [s.endpoint for s in sources])

    # -- routing --------------------------------------------------------------------------------

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        router = self._router
        prompt: Prompt | None = None if pending_request is None else prompt_from_body(_payload(pending_request))
        if router is None or prompt is None or pending_request is None or not candidate_replicas:
            self.unrouted += pending_request is not None
            return [candidate_replicas]
        for replica in candidate_replicas:
            self._observe(router, replica)
        request_id = pending_request.metadata.internal_request_id
        now = time.monotonic()
        self._expire(router, now)
        if self._decisions.pop(request_id, None) is not None:  # re-chosen after a rejection: count it once
            router.on_aborted(request_id)
        try:
            decision = route(router, prompt, request_id)
        except SmetricError:
            log.exception("smetric could not route request %s; routing it Ray's way", request_id)
            self.unrouted += 1
            return [candidate_replicas]
        self._decisions[request_id] = (decision, now)
        chosen = [r for r in candidate_replicas if r.replica_id.unique_id == decision.instance]
        rest = [r for r in candidate_replicas if r.replica_id.unique_id != decision.instance]
        return [chosen, rest] if chosen else [rest]

    def _expire(self, router: Router, now: float) -> None:
        while self._decisions:
            request_id, (_, routed_at) = next(iter(self._decisions.items()))
            if now - routed_at <= self._stale_after_s:
                break
            del self._decisions[request_id]
            router.on_aborted(request_id)
            self.expired += 1

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        entry = self._decisions.get(request_id)
        if entry is not None and self._router is not None and entry[0].instance != replica_id.unique_id:
            self.mismatched += 1
            self._router.on_aborted(request_id)
            del self._decisions[request_id]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._decisions.pop(internal_request_id, None) is not None and self._router is not None:
            self._router.on_finished(internal_request_id)
