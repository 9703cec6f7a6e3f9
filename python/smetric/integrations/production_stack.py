"""vLLM production-stack: smetric as a ``RoutingInterface`` of its router (``vllm_router``).

production-stack has no plugin loader: its routers are the members of ``RoutingLogic``, built
by ``initialize_routing_logic`` and found again by ``get_routing_logic``, and ``--routing-logic``
only accepts their names. :func:`register` adds ``smetric`` without a fork: it defines
:class:`SMetricRouter` on top of production-stack's own ``SessionRouter`` (so that
``route_general_request`` awaits it with the parsed request body, as it does for its session,
kvaware and prefix-aware routers) and wraps ``initialize_routing_logic`` / ``get_routing_logic``
so that the name ``"smetric"`` builds and finds it. :func:`main` is production-stack's
``vllm-router`` command with ``--routing-logic smetric`` accepted::

    python -m smetric.integrations.production_stack --routing-logic smetric \\
        --service-discovery static --static-backends http://gpu-0:8000,http://gpu-1:8000 \\
        --static-models Qwen/Qwen3-Coder-30B-A3B-Instruct

The decision itself is framework-neutral (:class:`SMetricRouting`), per request:

1. the instances are the endpoints' URLs (added and removed as service discovery changes them);
2. each endpoint's ``EngineStats`` (``num_running_requests``, ``num_queuing_requests``,
   ``gpu_cache_usage_perc``, scraped every ``--engine-stats-interval`` s) is the engine snapshot
   of ``Router.update_load``, stamped now; the router fuses it with its own in-flight counts
   by ``max``, so a stale high reading can only over-count;
3. the body's token ids, ``messages`` (approximate tokens) or ``prompt`` text
   (:mod:`smetric.integrations._prompt`) are routed; a body without any goes to the endpoint
   with the fewest running + queuing requests.

Lifecycle: production-stack's ``RequestStatsMonitor`` sees every request start, produce its first
token and complete, under production-stack's request id (``X-Request-Id`` or a UUID it draws
after routing). :class:`SMetricRouter` taps the monitor on its first request, and
:class:`SMetricRouting` pairs each ``on_new_request`` with its decision: by id when the client sent
``X-Request-Id``, else with the oldest unpaired decision for the same URL (two requests racing to
one URL may swap their prefill counts, never their instance). A decision never paired, or a
request that failed (production-stack then reports no completion), is aborted after
``stale_after_s``.

KV$ state: ``index_mode="approximate"`` (default) inserts on route; ``"exact"`` subscribes to each
endpoint's vLLM KV events, found with ``GET {url}/kv_event_sources``
(:func:`smetric.events.discover_sources`), one :class:`smetric.events.KvEventSubscriber` per
endpoint, removed with it.

Cost per request: one ``Router.route`` plus one ``update_load`` per endpoint; pairing a start scans
the URL's unpaired decisions (about one: production-stack starts a request right after routing it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smetric._core import Router, RouterConfig
from smetric._types import IndexMode, PolicyName
from smetric.deployment import deployed_fields
from smetric.errors import SmetricError
from smetric.integrations._prompt import prompt_from_body, route

__all__ = ["ROUTING_LOGIC", "SMetricRouting", "main", "register"]

log = logging.getLogger("smetric.integrations.production_stack")

ROUTING_LOGIC = "smetric"
"""The ``--routing-logic`` name :func:`register` adds."""
REQUEST_ID_HEADER = "X-Request-Id"
"""The header production-stack (like vLLM) takes its request id from."""


def _number(stats: object, name: str) -> float | None:
    value = getattr(stats, name, None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@dataclass(slots=True)
class _InFlight:
    decision_id: int | str
    routed_at: float


class SMetricRouting:
    """smetric's decision for production-stack, free of production-stack's types (see the module docs).

    Arguments:
        policy, block_size, seed: as :class:`smetric.Router`.
        index_mode: ``"approximate"`` or ``"exact"`` (the endpoints' KV events).
        config: other :class:`smetric.RouterConfig` fields, by name.
        stale_after_s: a decision without a completion for this long is aborted.
        subscribe: builds the KV-event subscriber of one endpoint (exact mode); the default
            discovers the endpoint's publishers over HTTP.
    """

    def __init__(
        self,
        *,
        policy: PolicyName = "smetric",
        block_size: int = 16,
        seed: int = 0,
        index_mode: IndexMode = "approximate",
        config: Mapping[str, Any] | None = None,
        stale_after_s: float = 600.0,
        subscribe: Callable[[Router, str], Any] | None = None,
    ) -> None:
        fields = {**deployed_fields(config or {}, block_size=block_size), "index_mode": index_mode}
        self.config = RouterConfig(**fields)
        self.policy: PolicyName = policy
        self.block_size = block_size
        self.seed = seed
        self.stale_after_s = stale_after_s
        self.router: Router | None = None
        self._subscribe = subscribe or _discover_and_subscribe
        self._subscribers: dict[str, Any] = {}
        self._unpaired: dict[str, deque[_InFlight]] = {}
        self._paired: dict[tuple[str, str], _InFlight] = {}
        self._next_id = 0
        self.unrouted = 0
        """Requests without a prompt (sent to the least busy endpoint)."""
        self.expired = 0
        """Decisions aborted after ``stale_after_s`` without a completion."""

    # -- endpoints ------------------------------------------------------------------------------

    def _sync(self, urls: Sequence[str]) -> Router:
        if self.router is None:
            self.router = Router(
                list(urls), policy=self.policy, block_size=self.block_size, seed=self.seed, config=self.config
            )
            added: Sequence[str] = urls
        else:
            live = set(self.router.instances)
            added = [u for u in urls if u not in live]
            for url in added:
                self.router.add_instance(url)
            for url in live - set(urls):
                subscriber = self._subscribers.pop(url, None)
                if subscriber is not None:
                    subscriber.stop(clear=True)
                self.router.remove_instance(url)
                self._unpaired.pop(url, None)
        if self.config.index_mode == "exact":
            for url in urls:
                if url not in self._subscribers:
                    try:
                        self._subscribers[url] = self._subscribe(self.router, url)
                    except Exception:  # an engine not reachable yet is tried again on the next request
                        log.exception("KV events of %s not subscribed", url)
        return self.router

    def close(self) -> None:
        """Stops every KV-event subscriber."""
        for subscriber in self._subscribers.values():
            subscriber.stop()
        self._subscribers.clear()

    # -- routing --------------------------------------------------------------------------------

    def route(
        self,
        urls: Sequence[str],
        engine_stats: Mapping[str, object],
        body: object,
        request_id: str | None = None,
    ) -> str:
        """The URL for one request.

        Arguments:
            urls: the candidate endpoints (production-stack's ``EndpointInfo.url``), at least one.
            engine_stats: URL → an ``EngineStats`` (read by attribute name), for some of ``urls``.
            body: the request body (``request_json``).
            request_id: the client's ``X-Request-Id``, if any.
        """
        if not urls:
            raise ValueError("no endpoint to route to")
        router = self._sync(urls)
        now = time.monotonic()
        self._expire(router, now)
        for url in urls:
            stats = engine_stats.get(url)
            if stats is None:
                continue
            running = _number(stats, "num_running_requests")
            waiting = _number(stats, "num_queuing_requests")
            kv_usage = _number(stats, "gpu_cache_usage_perc")
            router.update_load(
                url,
                running=None if running is None else int(running),
                waiting=None if waiting is None else int(waiting),
                kv_usage=None if kv_usage is None else min(max(kv_usage, 0.0), 1.0),
            )
        prompt = prompt_from_body(body)
        if prompt is None:
            self.unrouted += 1
            return min(urls, key=lambda u: _busy(engine_stats.get(u)))
        decision_id: int | str = request_id if request_id is not None else self._issue()
        try:
            decision = route(router, prompt, decision_id)
        except SmetricError:
            log.exception("smetric could not route a request; sending it to the least busy endpoint")
            self.unrouted += 1
            return min(urls, key=lambda u: _busy(engine_stats.get(u)))
        self._unpaired.setdefault(decision.instance, deque()).append(_InFlight(decision_id, now))
        return decision.instance

    def _issue(self) -> int:
        self._next_id += 1
        return self._next_id

    def _expire(self, router: Router, now: float) -> None:
        for queue in self._unpaired.values():
            while queue and now - queue[0].routed_at > self.stale_after_s:
                router.on_aborted(queue.popleft().decision_id)
                self.expired += 1
        # Paired entries are in pairing order, which is routing order up to races: the oldest first.
        while self._paired:
            key, entry = next(iter(self._paired.items()))
            if now - entry.routed_at <= self.stale_after_s:
                break
            router.on_aborted(self._paired.pop(key).decision_id)
            self.expired += 1

    # -- lifecycle (RequestStatsMonitor's calls) ------------------------------------------------

    def on_new_request(self, url: str, request_id: str) -> None:
        """production-stack started sending ``request_id`` to ``url``: pair it with its decision."""
        queue = self._unpaired.get(url)
        if not queue:
            return
        for i, entry in enumerate(queue):
            if entry.decision_id == request_id:
                del queue[i]
                break
        else:
            entry = queue.popleft()
        self._paired[(url, request_id)] = entry

    def on_request_response(self, url: str, request_id: str) -> None:
        """The first bytes of ``request_id``'s response came back (its prefill is done)."""
        entry = self._paired.get((url, request_id))
        if entry is not None and self.router is not None:
            self.router.on_prefilled(entry.decision_id)

    def on_request_complete(self, url: str, request_id: str) -> None:
        """``request_id`` completed."""
        entry = self._paired.pop((url, request_id), None)
        if entry is not None and self.router is not None:
            self.router.on_finished(entry.decision_id)


def _busy(stats: object) -> float:
    return (_number(stats, "num_running_requests") or 0.0) + (_number(stats, "num_queuing_requests") or 0.0)


def _discover_and_subscribe(router: Router, url: str) -> Any:
    from smetric.events import KvEventSubscriber, discover_sources

    return KvEventSubscriber(router, discover_sources(url)).start()


def _tap(monitor: Any, routing: SMetricRouting) -> None:
    """Makes ``monitor`` (production-stack's RequestStatsMonitor) also tell ``routing``; idempotent."""
    if getattr(monitor, "_smetric_tapped", False):
        return
    calls = {
        "on_new_request": routing.on_new_request,
        "on_request_response": routing.on_request_response,
        "on_request_complete": routing.on_request_complete,
    }
    for name, hook in calls.items():
        original = getattr(monitor, name)

        def tapped(
            engine_url: str,
            request_id: str,
            timestamp: float,
            _original: Callable[[str, str, float], None] = original,
            _hook: Callable[[str, str], None] = hook,
        ) -> None:
            _original(engine_url, request_id, timestamp)
            _hook(engine_url, request_id)

        setattr(monitor, name, tapped)
    monitor._smetric_tapped = True


NOT_INSTALLED = (
    "smetric.integrations.production_stack needs production-stack's vllm_router (with vllm_router.routers), "
    "which is not installed. It is not on PyPI (PyPI's vllm-router is another project, a Rust router): "
    "pip install -e a clone of vllm-project/production-stack"
)


def _routing_logic_module() -> Any:
    try:
        from vllm_router.routers import routing_logic  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError as e:
        # Not a MissingExtraError: no extra of smetric-router can install it.
        raise ImportError(NOT_INSTALLED, name=e.name) from e
    return routing_logic


_registered: dict[str, Any] = {}


def register(**routing_kwargs: Any) -> type:
    """Adds ``"smetric"`` to production-stack's routing logics; returns :class:`SMetricRouter`.

    Call it before production-stack builds its router (before ``vllm_router.app.initialize_all``);
    a second call returns the same class. ``routing_kwargs`` go to :class:`SMetricRouting`.

    Raises:
        ImportError: production-stack's ``vllm_router`` (with ``vllm_router.routers``) is not
            installed. PyPI's ``vllm-router`` is another project (a Rust router) and has no
            ``vllm_router.routers``; install production-stack from its repository.
    """
    if "class" in _registered:
        cls: type = _registered["class"]
        return cls
    rl = _routing_logic_module()

    class SMetricRouter(rl.SessionRouter):  # type: ignore[misc,name-defined]
        """smetric inside production-stack: a ``SessionRouter`` so that it is awaited with the body."""

        def __init__(self, session_key: str | None = None, **_: Any) -> None:
            if hasattr(self, "_initialized"):
                return
            self.session_key = session_key
            self.routing = SMetricRouting(**routing_kwargs)
            self._initialized = True

        async def route_request(
            self,
            endpoints: list[Any],
            engine_stats: dict[str, Any],
            request_stats: dict[str, Any],
            request: Any,
            request_json: dict[str, Any] | None = None,
        ) -> str:
            scope = getattr(request, "scope", None)
            app = scope.get("app") if isinstance(scope, Mapping) else None
            monitor = getattr(getattr(app, "state", None), "request_stats_monitor", None)
            if monitor is not None:
                _tap(monitor, self.routing)
            return self.routing.route(
                [e.url for e in endpoints],
                engine_stats,
                request_json or {},
                request.headers.get(REQUEST_ID_HEADER),
            )

        def close(self) -> None:
            self.routing.close()

    initialize = rl.initialize_routing_logic
    get = rl.get_routing_logic
    singletons = rl.SingletonABCMeta._instances

    def initialize_routing_logic(routing_logic: Any, *args: Any, **kwargs: Any) -> Any:
        if str(getattr(routing_logic, "value", routing_logic)) == ROUTING_LOGIC or _registered.get("selected"):
            return SMetricRouter(session_key=kwargs.get("session_key"))
        return initialize(routing_logic, *args, **kwargs)

    def get_routing_logic() -> Any:
        if SMetricRouter in singletons:
            return SMetricRouter()
        return get()

    _registered["class"] = SMetricRouter
    modules: list[Any] = [rl, sys.modules.get("vllm_router.app")]
    for module in modules:
        if module is not None:
            module.initialize_routing_logic = initialize_routing_logic
            module.get_routing_logic = get_routing_logic
    return SMetricRouter


def main(argv: Sequence[str] | None = None) -> None:
    """production-stack's ``vllm-router`` command, with ``--routing-logic smetric``.

    ``--routing-logic smetric`` is replaced by one of the names production-stack's parser accepts
    (its choices are fixed) and :func:`register` makes ``initialize_routing_logic`` build smetric.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    selected = False
    for i, arg in enumerate(args):
        if arg == "--routing-logic" and i + 1 < len(args) and args[i + 1] == ROUTING_LOGIC:
            args[i + 1], selected = "roundrobin", True
        elif arg == f"--routing-logic={ROUTING_LOGIC}":
            args[i], selected = "--routing-logic=roundrobin", True
    register()
    _registered["selected"] = selected
    from vllm_router import app  # type: ignore[import-not-found,unused-ignore]

    sys.argv = [sys.argv[0], *args]
    app.main()


if __name__ == "__main__":
    main()
