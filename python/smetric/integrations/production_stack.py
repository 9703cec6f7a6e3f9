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

KV$ state: ``index_mode="approximate"`` (default) inserts on route; ``"exact"`` subscribes to the
endpoints' vLLM KV events, found with ``GET {url}/kv_event_sources``
(:func:`smetric.events.discover_sources`), one :class:`smetric.events.KvEventSubscriber` over all
of them, restarted as endpoints come and go. Sizing: the router's per-endpoint KV capacity is the
smallest the endpoints report on ``/metrics`` when the router is built (one blocking read of each,
≤ 2 s; declare ``kv_capacity_tokens`` to skip it), and no global tier unless ``config`` declares
one. Engine stats are clamped into range before they reach the router. The instance sync, the
event feed, the expiry, the clamping and the sizing are :class:`smetric.deployment.DeployedRouter`'s,
shared with ``smetric serve`` and the Ray Serve router.

Cost per request: one ``Router.route`` plus one ``update_load`` per endpoint; pairing a start scans
the URL's unpaired decisions (about one: production-stack starts a request right after routing it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smetric._core import DEFAULT_BLOCK_SIZE, Router, RouterConfig
from smetric._types import IndexMode, PolicyName
from smetric.deployment import DEFAULT_STALE_AFTER_S, DeployedRouter, fleet_kv_capacity
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


class SMetricRouting:
    """smetric's decision for production-stack, free of production-stack's types (see the module docs).

    Arguments:
        policy, block_size, seed: as :class:`smetric.Router`.
        index_mode: ``"approximate"`` or ``"exact"`` (the endpoints' KV events).
        config: other :class:`smetric.RouterConfig` fields, by name.
        stale_after_s: a decision without a completion for this long is aborted.
        kv_capacity_tokens: the engines' GPU KV capacity in tokens; None: read from the
            endpoints' ``/metrics`` (vLLM's ``vllm:cache_config_info``) when the router is built.
        subscribe: the KV-event sources of one endpoint (exact mode); the default discovers the
            endpoint's publishers over HTTP (``GET {url}/kv_event_sources``).
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
        subscribe: Callable[[str], Sequence[Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deployed = DeployedRouter(
            policy=policy,
            block_size=block_size,
            seed=seed,
            index_mode=index_mode,
            config=config,
            stale_after_s=stale_after_s,
            kv_capacity_tokens=kv_capacity_tokens,
            size=lambda urls: fleet_kv_capacity(f"{u.rstrip('/')}/metrics" for u in urls),
            clock=clock,
        )
        self._sources_of = subscribe or _discover
        self._unpaired: dict[str, deque[int | str]] = {}
        self._paired: dict[tuple[str, str], int | str] = {}
        self._next_id = 0
        self.unrouted = 0
        """Requests without a prompt (sent to the least busy endpoint)."""

    @property
    def router(self) -> Router | None:
        """The smetric router (None until the first request)."""
        return self.deployed.router

    @property
    def config(self) -> RouterConfig:
        return self.deployed.config

    @property
    def expired(self) -> int:
        """Decisions aborted after ``stale_after_s`` without a completion."""
        return self.deployed.expired

    # -- endpoints ------------------------------------------------------------------------------

    def _sync(self, urls: Sequence[str]) -> Router:
        known = set(self.router.instances) if self.router is not None else set(urls)
        router = self.deployed.sync(urls)
        for url in known - set(urls):
            self._unpaired.pop(url, None)
        if self.deployed.exact and self.deployed.feeds is not None:
            for url in urls:
                if url not in self.deployed.feeds.sources:
                    try:
                        self.deployed.set_sources(url, self._sources_of(url))
                    except Exception:  # an engine not reachable yet is tried again on the next request
                        log.exception("KV events of %s not subscribed", url)
        return router

    def close(self) -> None:
        """Stops the KV-event subscriber."""
        self.deployed.close()

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
        if self.deployed.expire():
            self._forget_closed()
        for url in urls:
            stats = engine_stats.get(url)
            if stats is not None:
                self.deployed.update_load(
                    url,
                    _number(stats, "num_running_requests"),
                    _number(stats, "num_queuing_requests"),
                    _number(stats, "gpu_cache_usage_perc"),
                )
        prompt = prompt_from_body(body)
        if prompt is None:
            self.unrouted += 1
            return min(urls, key=lambda u: _busy(engine_stats.get(u)))
        decision_id: int | str = request_id if request_id is not None else self._issue()
        self.deployed.aborted(decision_id)  # the same client id again: the old decision ends here
        try:
            decision = route(router, prompt, decision_id)
        except SmetricError:
            log.exception("smetric could not route a request; sending it to the least busy endpoint")
            self.unrouted += 1
            return min(urls, key=lambda u: _busy(engine_stats.get(u)))
        self.deployed.routed(decision_id, decision.instance)
        self._unpaired.setdefault(decision.instance, deque()).append(decision_id)
        return decision.instance

    def _issue(self) -> int:
        self._next_id += 1
        return self._next_id

    def _forget_closed(self) -> None:
        """Drops pairing entries whose decision is no longer in flight (expired)."""
        open_ = self.deployed.in_flight
        for url, queue in self._unpaired.items():
            self._unpaired[url] = deque(d for d in queue if d in open_)
        self._paired = {k: d for k, d in self._paired.items() if d in open_}

    # -- lifecycle (RequestStatsMonitor's calls) ------------------------------------------------

    def on_new_request(self, url: str, request_id: str) -> None:
        """production-stack started sending ``request_id`` to ``url``: pair it with its decision."""
        queue = self._unpaired.get(url)
        if not queue:
            return
        if request_id in queue:
            queue.remove(request_id)
            decision_id: int | str = request_id
        else:
            decision_id = queue.popleft()
        self._paired[(url, request_id)] = decision_id

    def on_request_response(self, url: str, request_id: str) -> None:
        """The first bytes of ``request_id``'s response came back (its prefill is done)."""
        decision_id = self._paired.get((url, request_id))
        if decision_id is not None:
            self.deployed.prefilled(decision_id)

    def on_request_complete(self, url: str, request_id: str) -> None:
        """``request_id`` completed."""
        decision_id = self._paired.pop((url, request_id), None)
        if decision_id is not None:
            self.deployed.finished(decision_id)


def _busy(stats: object) -> float:
    return (_number(stats, "num_running_requests") or 0.0) + (_number(stats, "num_queuing_requests") or 0.0)


def _discover(url: str) -> list[Any]:
    from smetric.events import discover_sources

    return discover_sources(url)


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
