"""The fleet behind the proxy: its instances, their health, their models, and the feeds that
tell the router what they cache and how loaded they are.

* **discovery and sizing** (blocking, before the router exists): :func:`kv_event_sources` (an
  instance's KV-event publishers: ``GET /kv_event_sources``, explicit, or none) and
  :func:`fleet_kv_capacity` (the smallest GPU KV capacity the instances report on ``/metrics``);
* **health**: consecutive failures per instance (only its own: :mod:`smetric.serve.failover`
  decides which); ``eject_after`` in a row eject it until its ``GET /health`` answers 200
  (probed every ``probe_interval_s``). The backend is told
  (:attr:`FeedTargets.on_readmitted`: the co-located router clears its index) only when the
  instance was out of reach meanwhile — a connection error or a failed probe — since an engine
  that came back from that has usually restarted empty; one that kept answering (502–504, a
  timeout) kept its cache, and so the router keeps its index;
* **models**: every instance's ``/v1/models``, refreshed every ``models_refresh_s`` (an
  unreachable instance keeps what it served before); the LoRA adapters among them (cards with a
  ``parent``) give a request naming one its cache namespace (:meth:`Fleet.namespace`);
* **eligibility**: :meth:`Fleet.exclusions`, the instances an attempt must skip — failed ones,
  those without the model, ejected ones unless a pool has nothing else (better a try than a
  refusal);
* **feeds**: the KV-event subscriber and the engine-load scraper, aimed at the router(s) the
  backend names (:class:`FeedTargets`), restarted when the instance list changes — the shared
  :class:`smetric.deployment.FleetFeeds` (an engine in connect mode whose one subscriber slot is
  taken is served without its events), as the Ray Serve and production-stack routers use it.

Invariants: state is mutated only on the proxy's event loop; the feeds run on their own threads
and only call the (thread-safe) router. Costs: :meth:`Fleet.exclusions` is O(instances) per
attempt. May import: :mod:`smetric.serve.config`, ``.telemetry``, ``.upstream``,
``smetric._core``, ``smetric.deployment``, ``smetric.vllm`` and ``smetric.events`` (lazily: its extra).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from smetric._core import PdRouter, Router
from smetric.deployment import EngineCache, FleetFeeds
from smetric.deployment import fleet_caches as deployed_caches
from smetric.deployment import fleet_host_offload as deployed_host_offload
from smetric.deployment import fleet_kv_capacity as deployed_kv_capacity
from smetric.serve.config import (
    KV_EVENTS_DISCOVER,
    KV_EVENTS_OFF,
    KV_OFFLOAD_AUTO,
    KV_OFFLOAD_SHARED,
    InstanceConfig,
    ServeConfig,
)
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.upstream import Upstream
from smetric.vllm import cache_namespace

if TYPE_CHECKING:
    from smetric._types import Offload

__all__ = [
    "FeedTargets",
    "Fleet",
    "Health",
    "fleet_caches",
    "fleet_host_offload",
    "fleet_kv_capacity",
    "kv_event_sources",
]

log = logging.getLogger("smetric.serve")


@dataclass(frozen=True, slots=True)
class FeedTargets:
    """Where the backend wants the fleet's feeds to go."""

    events: Router | None
    """The router KV events feed (an exact or approximate index), or None: no event feed."""
    load: Router | PdRouter
    """Where scraped engine load goes."""
    scraped: frozenset[str] | None
    """The instances whose load is scraped; None: every instance."""
    on_readmitted: Callable[[str], None]
    """Called when an ejected instance answers its health probe again."""


class Health:
    """Consecutive failures and ejection of one instance."""

    __slots__ = ("ejected", "failures", "lost_contact")

    def __init__(self) -> None:
        self.failures = 0
        self.ejected = False
        self.lost_contact = False
        """It could not be reached since its ejection began (it may have restarted empty)."""


def _lost_contact(cause: str) -> bool:
    """Whether a failure's cause says the instance could not be reached (not an answer, not a
    timeout of a live connection)."""
    return not cause.startswith("http_") and "Timeout" not in cause


class Fleet:
    """The instances, their health and models, and the feeds (see the module docs)."""

    def __init__(
        self,
        config: ServeConfig,
        sources: dict[str, list[Any]],
        upstream: Upstream,
        telemetry: ProxyTelemetry,
    ) -> None:
        self.config = config
        self.instances: dict[str, InstanceConfig] = {i.url: i for i in config.all_instances}
        self.sources = sources
        """Instance URL → its KV-event sources (``smetric.events.KvEventSource``)."""
        self.health = {url: Health() for url in self.instances}
        self.models: dict[str, set[str]] = {}
        """Model id → instances serving it (from their ``/v1/models``)."""
        self.model_cards: dict[str, dict[str, Any]] = {}
        self.adapters: frozenset[str] = frozenset()
        """The LoRA adapters the fleet serves (model cards with a ``parent``)."""
        self._feeds: FleetFeeds | None = None
        self._upstream = upstream
        self._telemetry = telemetry
        self._targets: FeedTargets | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.on_change: Callable[[], None] | None = None
        """Called after the instances, an ejection or the models changed (the compiled data
        plane's view of the fleet follows it)."""

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, targets: FeedTargets) -> None:
        """Starts the feeds, asks every instance for its models, starts the probe and the refresh."""
        self._targets = targets
        self.restart_feeds()
        await self.refresh_models()
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name="smetric-probe"),
            asyncio.create_task(self._models_loop(), name="smetric-models"),
        ]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stop_feeds()

    @property
    def subscriber(self) -> Any:
        """The running KV-event subscriber (``smetric.events.KvEventSubscriber``), or None."""
        return None if self._feeds is None else self._feeds.subscriber

    @property
    def scraper(self) -> Any:
        """The running engine-load scraper (``smetric.engine_load.EngineLoadScraper``), or None."""
        return None if self._feeds is None else self._feeds.scraper

    def _stop_feeds(self) -> None:
        if self._feeds is not None:
            self._feeds.stop()

    def restart_feeds(self) -> None:
        """(Re)starts the KV-event subscriber and the load scraper over the current instances
        (:class:`smetric.deployment.FleetFeeds`)."""
        targets = self._targets
        assert targets is not None, "start() names the feeds' targets"
        if self._feeds is None:
            self._feeds = FleetFeeds(
                targets.events,
                targets.load if self.config.engine_load else None,
                load_period_s=self.config.engine_load_period_s,
                headers=self._upstream.auth,
            )
        feeds = self._feeds
        for url in [u for u in feeds.sources if u not in self.instances]:
            feeds.remove(url)
        for url in self.instances:
            feeds.set_sources(url, self.sources.get(url, []))
        feeds.load_urls = {
            url: (i.metrics_url or url).removesuffix("/metrics")
            for url, i in self.instances.items()
            if targets.scraped is None or url in targets.scraped
        }
        feeds.restart()

    # -- membership -------------------------------------------------------------------------------

    def add(self, inst: InstanceConfig, sources: list[Any]) -> None:
        self.instances[inst.url] = inst
        self.sources[inst.url] = sources
        self.health[inst.url] = Health()
        self._changed()

    def remove(self, url: str) -> None:
        del self.instances[url], self.health[url]
        self.sources.pop(url, None)
        self._changed()

    # -- health -----------------------------------------------------------------------------------

    def failed(self, url: str, cause: str) -> None:
        """Counts a failed attempt at ``url`` (a retry, by cause) and charges it to the instance."""
        self.retried(cause)
        self.charge(url, cause)

    def retried(self, cause: str) -> None:
        """Counts a failed attempt (a retry, by cause) without charging its instance."""
        self._telemetry.retries[cause] += 1

    def charge(self, url: str, cause: str) -> None:
        """Charges a failure to ``url``'s health; ejects it after ``eject_after`` in a row."""
        h = self.health.get(url)
        if h is None:
            return
        h.lost_contact |= _lost_contact(cause)
        h.failures += 1
        if h.failures >= self.config.eject_after:
            self.eject(url)

    def eject(self, url: str) -> None:
        """Ejects ``url`` (a last resort for routing until its ``GET /health`` answers 200);
        nothing if it is ejected already or gone. The compiled data plane's own ejections reach
        the app through here."""
        h = self.health.get(url)
        if h is None or h.ejected:
            return
        h.ejected = True
        self._telemetry.ejections[url] += 1
        log.warning("instance %s ejected after %d consecutive failures", url, h.failures)
        self._changed()

    def succeeded(self, url: str) -> None:
        h = self.health.get(url)
        if h is not None:
            h.failures = 0

    def ejected(self, url: str) -> bool:
        return self.health[url].ejected

    @property
    def all_ejected(self) -> bool:
        return all(h.ejected for h in self.health.values())

    def exclusions(
        self, model: str | None, failed: Sequence[str], pools: Sequence[frozenset[str]] | None
    ) -> list[str] | None:
        """Instances the next attempt must skip, or None when no instance is left to try.

        ``pools``: the backend's pools, each of which must keep an instance (PD: prefill and
        decode); None: the whole fleet is one pool.
        """
        serving = self.models.get(model) if model is not None else None
        eligible = [u for u in self.instances if u not in failed and (serving is None or u in serving)]
        if not eligible:
            return None
        groups = [eligible] if pools is None else [[u for u in eligible if u in pool] for pool in pools]
        chosen: set[str] = set()
        for group in groups:
            if not group:
                return None
            healthy = [u for u in group if not self.health[u].ejected]
            # Ejected instances are a last resort: better a try than a refusal.
            chosen.update(healthy or group)
        return [u for u in self.instances if u not in chosen]

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            for url in [u for u, h in self.health.items() if h.ejected]:
                if not await self._upstream.healthy(url):
                    if url in self.health:
                        self.health[url].lost_contact = True
                    continue
                if url not in self.health:  # removed while it was probed
                    continue
                lost = self.health[url].lost_contact
                self.health[url] = Health()
                if lost and self._targets is not None:
                    self._targets.on_readmitted(url)
                self._telemetry.readmissions[url] += 1
                self._changed()
                log.warning(
                    "instance %s re-admitted (its /health answers; index %s)", url, "cleared" if lost else "kept"
                )

    # -- models -----------------------------------------------------------------------------------

    async def _models_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.models_refresh_s)
            await self.refresh_models()

    async def refresh_models(self) -> None:
        """Asks every instance for its models (concurrently)."""

        async def one(url: str) -> tuple[str, list[dict[str, Any]] | None]:
            return url, await self._upstream.model_cards(url)

        answers = await asyncio.gather(*(one(url) for url in self.instances))
        models: dict[str, set[str]] = {}
        cards: dict[str, dict[str, Any]] = {}
        for url, cards_of in answers:
            if cards_of is None:  # unreachable now: keep what it served before
                for mid, urls in self.models.items():
                    if url in urls:
                        models.setdefault(mid, set()).add(url)
                        cards.setdefault(mid, self.model_cards[mid])
                continue
            for card in cards_of:
                models.setdefault(card["id"], set()).add(url)
                cards.setdefault(card["id"], card)
        self.models, self.model_cards = models, cards
        self.adapters = frozenset(mid for mid, card in cards.items() if card.get("parent"))
        self._changed()

    def namespace(self, model: str | None, cache_salt: str | None) -> str | None:
        """The router namespace of a request for ``model`` with vLLM's ``cache_salt``: an
        adapter's requests are cached apart from the base model's (vLLM keys its blocks by the
        adapter), as :func:`smetric.vllm.cache_namespace` names them."""
        if model is None or model not in self.adapters:
            return cache_salt
        return cache_namespace(model, cache_salt or None)


def fleet_kv_capacity(
    instances: Sequence[InstanceConfig], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> int | None:
    """The smallest GPU KV capacity (tokens) the instances report on ``/metrics``, or None
    (:func:`smetric.deployment.fleet_kv_capacity`). Blocking."""
    return deployed_kv_capacity([i.metrics_url or f"{i.url}/metrics" for i in instances], timeout, headers)


def fleet_caches(
    instances: Sequence[InstanceConfig], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> dict[str, EngineCache]:
    """Per instance URL, its GPU KV capacity and announced host-memory cache, from one scrape of
    its ``/metrics`` (:func:`smetric.deployment.fleet_caches`). Blocking."""
    return deployed_caches({i.url: i.metrics_url or f"{i.url}/metrics" for i in instances}, timeout, headers)


def fleet_host_offload(
    instances: Sequence[InstanceConfig], timeout: float = 2.0, headers: Mapping[str, str] | None = None
) -> dict[str, int | None]:
    """Per instance URL, the host-memory KV cache (tokens) its engine announces on ``/metrics``, or
    None (:func:`smetric.deployment.fleet_host_offload`). Blocking."""
    return deployed_host_offload({i.url: i.metrics_url or f"{i.url}/metrics" for i in instances}, timeout, headers)


def kv_event_sources(inst: InstanceConfig, headers: Mapping[str, str] | None = None) -> list[Any]:
    """The KV-event sources of an instance (discovered, explicit, or none); ``headers`` go with the
    discovery call (the upstream key). Blocking."""
    if inst.kv_events == KV_EVENTS_OFF:
        return []
    try:
        from smetric.events import KvEventSource, discover_sources
    except ImportError:
        log.warning("pyzmq is not installed: no KV events (pip install 'smetric-router[events]')")
        return []
    # Checked by InstanceConfig; an "auto" the proxy did not resolve (it reads the engine's
    # announcement first) counts as the shared store, the behaviour before host pools.
    offload = cast("Offload", KV_OFFLOAD_SHARED if inst.kv_offload == KV_OFFLOAD_AUTO else inst.kv_offload)
    if inst.kv_events == KV_EVENTS_DISCOVER:
        try:
            return [dataclasses.replace(s, offload=offload) for s in discover_sources(inst.url, headers=headers)]
        except Exception as e:  # an engine without the endpoint, or not up yet
            log.warning("no KV-event sources from %s/kv_event_sources: %s", inst.url, e)
            return []
    return [KvEventSource(inst.url, inst.kv_events, replay_endpoint=inst.kv_replay, offload=offload)]
