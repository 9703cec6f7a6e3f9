"""A router deployed in front of real engines: the parts the proxy (``smetric serve``), the Ray
Serve request router and the production-stack router share, written once.

* **sizing** (:func:`deployed_fields`, :func:`fleet_kv_capacity`): the core's defaults
  (``RouterConfig()``) describe the simulator's reference cluster, including the seed's 1.5 TiB
  global KV$ store. A deployed router takes its sizes from the fleet instead:
  ``global_capacity_blocks`` is **0** unless the deployment declares a global tier (LMCache, a
  Mooncake store: set it to the store's size in blocks and feed it with
  :mod:`smetric.integrations`) — a router that assumed a store the fleet does not have would move
  sessions to fetch prefixes that are nowhere (measured in ``tests/serve/test_e2e_fleet.py``:
  follow-ups kept at home fell from 93% to 71%); ``local_capacity_blocks`` is the engines' own
  GPU KV capacity when it is known (vLLM's ``vllm:cache_config_info`` on ``/metrics``, the
  smallest instance's). Fields the caller sets always win.
* **value clamping** (:func:`clamp_load`): engine-reported load (a framework's stats, a scrape)
  is clamped into the core's domain — counts ≥ 0, ``kv_usage`` in [0, 1], NaN dropped — before
  :meth:`smetric.Router.update_load` sees it, so a bad engine value never fails a decision.
* **feeds** (:class:`FleetFeeds`): the KV-event subscriber over every instance's sources and the
  engine-load scraper, restarted when the instances or their sources change; an engine in
  connect mode whose one subscriber slot is taken (:class:`~smetric.errors.KvEventEndpointInUseError`)
  is logged once and served without its events.
* **stale-decision expiry** (:class:`InFlight`): decisions whose lifecycle never completes (a
  request cancelled between routing and sending, a failure the framework reports no completion
  for) are aborted on the router after ``stale_after_s``.
* **instance sync** (:class:`DeployedRouter`): the router built on the first membership it sees,
  then instances added and removed as the membership changes, on the router and on its feeds.

Invariants: every method is called from one thread (the caller's loop); the feeds run their own
threads and only call the thread-safe router. The in-flight table holds each decision id at most
once, in routing order, so expiry is O(expired). May import: :mod:`smetric._core`,
:mod:`smetric.errors`, :mod:`smetric._types`; :mod:`smetric.events` (extra ``events``) and
:mod:`smetric.engine_load` lazily, when a feed starts or the fleet is sized. Users: the proxy
(:mod:`smetric.serve.fleet`, :mod:`smetric.serve.proxy`), :mod:`smetric.integrations.ray_serve`,
:mod:`smetric.integrations.production_stack`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from smetric._core import DEFAULT_BLOCK_SIZE, PdRouter, Router, RouterConfig
from smetric._types import IndexMode, PolicyName

__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "DeployedRouter",
    "EngineCache",
    "FleetFeeds",
    "InFlight",
    "clamp_load",
    "deployed_fields",
    "fleet_caches",
    "fleet_host_offload",
    "fleet_kv_capacity",
    "smallest_kv_capacity",
]

log = logging.getLogger("smetric.deployment")

DEFAULT_STALE_AFTER_S = 600.0
"""A decision without a completion for this long is aborted (longer than any sane generation)."""


def deployed_fields(
    fields: Mapping[str, Any], *, block_size: int, kv_capacity_tokens: int | None = None
) -> dict[str, Any]:
    """``RouterConfig`` keyword fields: ``fields`` with a deployment's sizes where it sets none."""
    out = dict(fields)
    if kv_capacity_tokens is not None and kv_capacity_tokens >= block_size:
        out.setdefault("local_capacity_blocks", kv_capacity_tokens // block_size)
    out.setdefault("global_capacity_blocks", 0)
    return out


def _metrics_page(url: str, timeout: float, headers: Mapping[str, str] | None) -> str | None:
    """The text of an engine's ``/metrics`` page at ``url``, or None when it does not answer."""
    import http.client
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout) as r:
            return str(r.read().decode("utf-8", errors="replace"))
    except (OSError, ValueError, http.client.HTTPException):
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class EngineCache:
    """What one engine's ``/metrics`` page says of its KV caches (None: not said, or no answer)."""

    kv_capacity_tokens: int | None
    """Its GPU KV capacity (:func:`smetric.engine_load.kv_capacity_tokens`)."""
    host_offload_tokens: int | None
    """The host-memory KV cache it announces (:func:`smetric.engine_load.host_offload_tokens`:
    vLLM's ``--kv-offloading-size``)."""


def fleet_caches(
    metrics_urls: Mapping[str, str], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> dict[str, EngineCache]:
    """Per instance (``instance -> its …/metrics URL``), both readings of :class:`EngineCache`
    from one scrape of its page (an engine that does not answer reads as two Nones). Blocking."""
    from smetric.engine_load import host_offload_tokens, kv_capacity_tokens

    out: dict[str, EngineCache] = {}
    for instance, url in metrics_urls.items():
        page = _metrics_page(url, timeout, headers)
        if page is None:
            out[instance] = EngineCache(None, None)
        else:
            out[instance] = EngineCache(kv_capacity_tokens(page), host_offload_tokens(page))
    return out


def smallest_kv_capacity(caches: Iterable[EngineCache]) -> int | None:
    """The smallest GPU KV capacity among ``caches``, or None when none reports one."""
    found = [c.kv_capacity_tokens for c in caches if c.kv_capacity_tokens is not None]
    return min(found) if found else None


def fleet_kv_capacity(
    metrics_urls: Iterable[str], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> int | None:
    """The smallest GPU KV capacity (tokens) the engines report at ``metrics_urls`` (each a full
    ``…/metrics`` URL; vLLM's ``vllm:cache_config_info``), or None when none answers with it.
    An engine that is down or has no such gauge is skipped. Blocking."""
    return smallest_kv_capacity(fleet_caches({url: url for url in metrics_urls}, timeout, headers).values())


def fleet_host_offload(
    metrics_urls: Mapping[str, str], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> dict[str, int | None]:
    """Per instance (``instance -> its …/metrics URL``), the host-memory KV cache its engine
    announces in tokens (:func:`smetric.engine_load.host_offload_tokens`: vLLM's
    ``--kv-offloading-size``), None when it announces none or does not answer. Blocking."""
    return {instance: c.host_offload_tokens for instance, c in fleet_caches(metrics_urls, timeout, headers).items()}


def _count(value: float | None) -> int | None:
    if value is None or math.isnan(value):
        return None
    return 0 if value <= 0 else int(min(value, 2**31 - 1))


def clamp_load(
    running: float | None, waiting: float | None, kv_usage: float | None
) -> tuple[int | None, int | None, float | None]:
    """Engine-reported load in the core's domain: counts rounded down into [0, 2³¹), ``kv_usage``
    into [0, 1]; NaN becomes None (unknown), as does an infinite usage."""
    usage = None if kv_usage is None or not math.isfinite(kv_usage) else min(max(kv_usage, 0.0), 1.0)
    return _count(running), _count(waiting), usage


class InFlight:
    """Decisions whose lifecycle is still open, in routing order; those older than
    ``stale_after_s`` are aborted on the router by :meth:`expire`.

    ``clock`` is injectable so that tests move time instead of sleeping.
    """

    def __init__(self, stale_after_s: float = DEFAULT_STALE_AFTER_S, clock: Callable[[], float] = time.monotonic):
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._routed: dict[int | str, tuple[str, float]] = {}
        self.expired = 0
        """Decisions aborted by :meth:`expire`."""

    def __len__(self) -> int:
        return len(self._routed)

    def __contains__(self, decision_id: object) -> bool:
        return decision_id in self._routed

    def add(self, decision_id: int | str, instance: str) -> None:
        """Records a decision just routed (a repeated id moves to the end)."""
        self._routed.pop(decision_id, None)
        self._routed[decision_id] = (instance, self.clock())

    def instance(self, decision_id: int | str) -> str | None:
        entry = self._routed.get(decision_id)
        return None if entry is None else entry[0]

    def pop(self, decision_id: int | str) -> bool:
        """Forgets a decision (its lifecycle closed); whether it was open."""
        return self._routed.pop(decision_id, None) is not None

    def expire(self, router: Router) -> list[int | str]:
        """Aborts every decision older than ``stale_after_s``; returns their ids."""
        now, out = self.clock(), []
        while self._routed:
            decision_id, (_, routed_at) = next(iter(self._routed.items()))
            if now - routed_at <= self.stale_after_s:
                break
            del self._routed[decision_id]
            router.on_aborted(decision_id)
            out.append(decision_id)
        self.expired += len(out)
        return out


class FleetFeeds:
    """The KV-event subscriber and the engine-load scraper of a fleet (see the module docs).

    Arguments:
        events: the router KV events feed, or None (no event feed).
        load: where scraped engine load goes, or None (the caller feeds load itself).
        load_period_s: the scrape period.
        headers: HTTP headers of every scrape (an engine's key).
    """

    def __init__(
        self,
        events: Router | None,
        load: Router | PdRouter | None = None,
        *,
        load_period_s: float = 0.1,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.events = events
        self.load = load
        self.load_period_s = load_period_s
        self.headers = dict(headers or {})
        self.sources: dict[str, list[Any]] = {}
        """Instance → its KV-event sources (``smetric.events.KvEventSource``)."""
        self.load_urls: dict[str, str] = {}
        """Instance → the base URL its ``/metrics`` is scraped at."""
        self.unsubscribable: set[str] = set()
        """Instances whose events could not be subscribed (kept out until their sources change)."""
        self.subscriber: Any = None
        self.scraper: Any = None

    @property
    def subscribed(self) -> frozenset[str]:
        """Instances whose KV events the running subscriber follows."""
        if self.subscriber is None:
            return frozenset()
        return frozenset(s.instance for s in self.subscriber.sources)

    def set_sources(self, instance: str, sources: Sequence[Any]) -> bool:
        """Records ``instance``'s KV-event sources; whether they changed (then :meth:`restart`)."""
        if self.sources.get(instance) == list(sources):
            return False
        self.sources[instance] = list(sources)
        self.unsubscribable.discard(instance)
        return True

    def remove(self, instance: str) -> None:
        """Forgets an instance (call :meth:`restart` after)."""
        self.sources.pop(instance, None)
        self.load_urls.pop(instance, None)
        self.unsubscribable.discard(instance)

    def restart(self) -> None:
        """(Re)starts both feeds over the current instances."""
        self.stop()
        flat = [s for name, ss in self.sources.items() if name not in self.unsubscribable for s in ss]
        while flat and self.events is not None:
            from smetric.errors import KvEventEndpointInUseError
            from smetric.events import KvEventSubscriber

            try:
                self.subscriber = KvEventSubscriber(self.events, flat).start()
                break
            except KvEventEndpointInUseError as e:  # an engine in connect mode: room for one router
                log.error("%s. Serving %s without its KV events.", e, e.instance)
                self.unsubscribable.add(e.instance)
                flat = [s for s in flat if s.instance != e.instance]
            except Exception:  # a bad endpoint: serve the rest without it until its sources change
                bad = {s.instance for s in flat}
                log.exception("KV events of %s not subscribed", sorted(bad))
                self.unsubscribable |= bad
                break
        if self.load is not None and self.load_urls:
            from smetric.engine_load import EngineLoadScraper

            # Typed for a Router; a PdRouter has the same update_load and config it calls.
            load: Any = self.load
            self.scraper = EngineLoadScraper(
                load, dict(self.load_urls), period_s=self.load_period_s, headers=self.headers
            ).start()

    def stop(self) -> None:
        """Stops both feeds (idempotent)."""
        if self.subscriber is not None:
            self.subscriber.stop()
            self.subscriber = None
        if self.scraper is not None:
            self.scraper.stop()
            self.scraper = None


class DeployedRouter:
    """A :class:`smetric.Router` over a membership a framework tells it (Ray Serve's replicas,
    production-stack's endpoints): built on the first :meth:`sync`, sized from the fleet, its
    instances and KV-event feed following the membership, engine load clamped, and decisions that
    never complete expired.

    Arguments:
        policy, block_size, seed: as :class:`smetric.Router`.
        index_mode: ``"approximate"`` (insert on route) or ``"exact"`` (the engines' KV events).
        config: other :class:`smetric.RouterConfig` fields, by name (``index_mode`` wins).
        stale_after_s: a decision without a completion for this long is aborted.
        kv_capacity_tokens: the engines' GPU KV capacity when declared; else ``size`` asks.
        size: given the first membership, the engines' KV capacity in tokens or None
            (e.g. :func:`fleet_kv_capacity` over their ``/metrics``); None: no sizing.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        *,
        policy: PolicyName = "smetric",
        block_size: int = DEFAULT_BLOCK_SIZE,
        seed: int = 0,
        index_mode: IndexMode = "approximate",
        config: Mapping[str, Any] | None = None,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        kv_capacity_tokens: int | None = None,
        size: Callable[[Sequence[str]], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy: PolicyName = policy
        self.block_size = block_size
        self.seed = seed
        self.fields: dict[str, Any] = {**(config or {}), "index_mode": index_mode}
        self.kv_capacity_tokens = kv_capacity_tokens
        self.config = RouterConfig(
            **deployed_fields(self.fields, block_size=block_size, kv_capacity_tokens=kv_capacity_tokens)
        )
        """The router's settings (bad fields fail here); sized again from the fleet on the first :meth:`sync`."""
        self._size = size
        self.in_flight = InFlight(stale_after_s, clock)
        self.router: Router | None = None
        self.feeds: FleetFeeds | None = None

    @property
    def exact(self) -> bool:
        return bool(self.fields["index_mode"] == "exact")

    def sync(self, instances: Sequence[str]) -> Router:
        """Makes the router's instances ``instances`` (built on the first call, sized then);
        a removed instance leaves the KV-event feed too."""
        if self.router is None:
            if not instances:
                raise ValueError("no instance to route to")
            if self.kv_capacity_tokens is None and self._size is not None:
                capacity = self._size(instances)
                self.config = RouterConfig(
                    **deployed_fields(self.fields, block_size=self.block_size, kv_capacity_tokens=capacity)
                )
            self.router = Router(
                list(instances), policy=self.policy, block_size=self.block_size, seed=self.seed, config=self.config
            )
            self.feeds = FleetFeeds(self.router if self.exact else None)
            return self.router
        live = set(self.router.instances)
        for name in instances:
            if name not in live:
                self.router.add_instance(name)
        gone = live - set(instances)
        for name in gone:
            self.remove(name)
        return self.router

    def remove(self, instance: str) -> None:
        """Removes one instance from the router and its feeds (unknown: nothing)."""
        if self.router is None or instance not in self.router.instances:
            return
        assert self.feeds is not None
        had_sources = instance in self.feeds.sources
        self.feeds.remove(instance)
        if had_sources:
            self.feeds.restart()
        self.router.remove_instance(instance)

    def set_sources(self, instance: str, sources: Sequence[Any]) -> None:
        """``instance``'s KV-event sources (exact mode); the feed restarts when they changed."""
        if self.feeds is not None and self.exact and self.feeds.set_sources(instance, sources):
            self.feeds.restart()

    @property
    def subscribed(self) -> frozenset[str]:
        """Instances whose KV events feed the index."""
        return frozenset() if self.feeds is None else self.feeds.subscribed

    def update_load(self, instance: str, running: float | None, waiting: float | None, kv_usage: float | None) -> None:
        """A framework's engine-load reading, clamped (:func:`clamp_load`); all None: nothing."""
        if self.router is None or (running is None and waiting is None and kv_usage is None):
            return
        r, w, u = clamp_load(running, waiting, kv_usage)
        self.router.update_load(instance, running=r, waiting=w, kv_usage=u)

    def routed(self, decision_id: int | str, instance: str) -> None:
        self.in_flight.add(decision_id, instance)

    def prefilled(self, decision_id: int | str) -> None:
        if self.router is not None and decision_id in self.in_flight:
            self.router.on_prefilled(decision_id)

    def finished(self, decision_id: int | str) -> bool:
        """Closes a decision's lifecycle as finished; whether it was open."""
        if self.router is not None and self.in_flight.pop(decision_id):
            self.router.on_finished(decision_id)
            return True
        return False

    def aborted(self, decision_id: int | str) -> bool:
        """Closes a decision's lifecycle as aborted; whether it was open."""
        if self.router is not None and self.in_flight.pop(decision_id):
            self.router.on_aborted(decision_id)
            return True
        return False

    def expire(self) -> list[int | str]:
        """Aborts the decisions older than ``stale_after_s``."""
        return [] if self.router is None else self.in_flight.expire(self.router)

    @property
    def expired(self) -> int:
        return self.in_flight.expired

    def close(self) -> None:
        """Stops the feeds."""
        if self.feeds is not None:
            self.feeds.stop()
