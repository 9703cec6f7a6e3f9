"""``smetric serve``: an OpenAI-compatible routing proxy in front of a vLLM fleet — the app and
its lifecycle.

A request's path through :mod:`smetric.serve` (``docs/architecture.md`` draws it):

0. the compiled gateway (``rust/smetric-gateway``, :mod:`smetric.serve.compiled`) owns the public
   address: it admits, serves the data path natively, and hands the rest to this app on a
   loopback port, with its secret (a request without it is a 403: ``_gateway_only``);
1. **here**: the routes table (the routes each API adapter of :data:`smetric.serve.apis.APIS` names, and
   ``/v1/models``, ``/health``, ``/metrics``, ``/admin/instances``); the client key
   (:mod:`smetric.serve.auth`, a middleware), the door's admission verdict (:mod:`smetric.serve.admission`)
   and the request's outcome (:mod:`smetric.serve.decision_log`: its id, its log line); the body read (bounded),
   parsed by the API's adapter, checked against the fleet's models, and turned into routing
   tokens (BPE off the event loop) and a :class:`~smetric.serve.apis.base.Prepared` request;
2. :mod:`smetric.serve.failover`: the attempt loop — exclusions from :mod:`smetric.serve.fleet`,
   routing and opening by the backend (:mod:`smetric.serve.backends`: co-located or PD), the
   answer relayed by :mod:`smetric.serve.relay`, retries and stream continuation;
3. :mod:`smetric.serve.telemetry` counts what only the proxy sees; ``/metrics`` adds the router's.

Lifecycle: :meth:`Proxy.create` discovers the instances' KV-event publishers and KV capacity
(blocking calls, off the loop) and builds the backend; :meth:`Proxy.start` opens the upstream
client and starts the fleet's feeds, health probe and model refresh; :func:`run` serves until
SIGTERM/SIGINT (or ``stop``), then drains: ``/health`` answers 503, the listening socket closes,
and in-flight requests get ``drain_timeout_s`` to finish.

Hostile clients (:mod:`smetric.serve.http_guard` for the HTTP layer): a body must arrive within
``body_timeout_s`` (408) and be sent as is — a ``Content-Encoding`` other than ``identity`` is a
415, so nothing is ever inflated on the loop and no body travels under a header that no longer
describes it; any exception from parsing a body is a 400 (counted in
``proxy_client_errors_total``, not logged as a traceback); aiohttp's own answers (404, 405, 413,
431, parser errors) take the path's API error shape (:meth:`Proxy.error_response`, the hook an
adapter's shape comes through).

Invariants: the proxy fetches only configured instance URLs, never a URL taken from a request;
every answer — a bug's included — is in the API's error shape, and the proxy stays up; all state
lives on the proxy's one event loop (the KV-event subscriber and the load scraper feed the
thread-safe router from their own threads). Cost per request beyond the network: one body parse,
one token lookup, one ``route`` (≈12 µs for 32K tokens), header copies; streams cost an SSE scan
per chunk (O(chunk bytes)). May import: every module of :mod:`smetric.serve` but ``cli``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Self

from aiohttp import web

from smetric._core import SHARED_END_WITHOUT_SESSION, Gateway, PdRouter, Router, SessionTable
from smetric.deployment import smallest_kv_capacity
from smetric.errors import SmetricError
from smetric.metrics import CONTENT_TYPE
from smetric.serve.admission import Refusal, refusal_error
from smetric.serve.apis import APIS, ResponsesApi
from smetric.serve.apis.base import Api, Route
from smetric.serve.auth import ClientKeys, keys_middleware, read_keys_file
from smetric.serve.backends import Backend, ColocatedBackend, PdBackend
from smetric.serve.compiled import (
    CompiledPlane,
    DoorAdmission,
    native_settings,
    new_secret,
    plane_summary,
)
from smetric.serve.config import KV_OFFLOAD_HOST, InstanceConfig, ServeConfig
from smetric.serve.decision_log import OUTCOME_KEY, DecisionLog, Outcome, Outcomes
from smetric.serve.errors import ProxyError
from smetric.serve.failover import Failover
from smetric.serve.fleet import Fleet, fleet_caches, fleet_host_offload, fleet_kv_capacity, kv_event_sources
from smetric.serve.http_guard import SERVER_HEADER, ConnectionLimits, GuardedRunner, status_message
from smetric.serve.relay import STREAM_KEY, end_stream
from smetric.serve.replica_bus import ReplicaBus, fleet_lines
from smetric.serve.request import RequestError, escapes_lone_surrogate
from smetric.serve.session import (
    CountedTurn,
    SessionHint,
    affinity_cleared_cookie,
    affinity_instance,
    parent_key,
    session_end,
    session_hint,
    session_id_problem,
)
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.tokens import TokenSource
from smetric.serve.upstream import Upstream

__all__ = ["Proxy", "ProxyServer", "run", "run_forever"]

log = logging.getLogger("smetric.serve")

_IDENTITY = frozenset({"", "identity"})
"""The ``Content-Encoding`` values of a body sent as is."""
_TOKENIZING_ERRORS = (RecursionError, UnicodeError, OverflowError, ValueError, BufferError)
"""What turning a valid body's text into routing tokens raises on client input (deep nesting in
a template variable, text no encoder takes): a 400, not the proxy's bug."""


NOT_FROM_GATEWAY = "this port answers smetric's gateway only: send requests to the proxy's address"
"""The 403 of a request that reached the app without the gateway's secret."""


def _json_error(error: ProxyError) -> web.Response:
    """An error of the proxy's own endpoints (admin, health): OpenAI's shape."""
    return web.json_response(error.body(), status=error.status)


async def _no_banner(_: web.Request, response: web.StreamResponse) -> None:
    """No Python or aiohttp version in the ``Server`` header."""
    response.headers["Server"] = SERVER_HEADER


def _closing(response: web.StreamResponse) -> web.StreamResponse:
    """``response``, closing the connection after it (a body was left unread)."""
    response.force_close()
    return response


class Proxy:
    """The proxy's parts and HTTP handlers; :func:`run` serves it. Build with :meth:`create`."""

    def __init__(
        self, config: ServeConfig, fleet: Fleet, backend: Backend, upstream: Upstream, telemetry: ProxyTelemetry
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.backend = backend
        self.telemetry = telemetry
        self.tokens = TokenSource(config.tokens)
        self.sessions = SessionTable()
        """Per-session state: turns and homes (:mod:`smetric.serve.session`; "Session life")."""
        telemetry.session_count = self.sessions.__len__
        self.failover = Failover(config, fleet, backend, telemetry, self.tokens, self._admitted)
        self.apis = tuple(api.bind(config) for api in APIS)
        """The adapters of :data:`APIS` as this proxy configured them."""
        self.in_flight = 0
        self.draining = False
        self.idle = asyncio.Event()
        """Set while no request is in flight (the drain waits for it)."""
        self.idle.set()
        self._upstream = upstream
        self.client_keys = [*config.api_keys, *(read_keys_file(config.api_keys_file) if config.api_keys_file else [])]
        """The configured client keys (none: the proxy is open)."""
        self.keys = ClientKeys(self.client_keys)
        self.outcomes = Outcomes(DecisionLog(config.decision_log) if config.decision_log else None, self._served)
        self.compiled: CompiledPlane | None = None
        """The compiled data plane in front of the app, when one serves the port (:func:`run`)."""
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smetric-tokenizer")
        self.replica_bus: ReplicaBus | None = None
        """The replica bus, when configured (:mod:`smetric.serve.replica_bus`)."""
        if config.replica_bus is not None and isinstance(backend, ColocatedBackend):
            self.replica_bus = ReplicaBus(
                config.replica_bus,
                backend.router,
                lambda: list(fleet.instances),
                subject=config.replica_bus_subject,
                period_s=config.replica_bus_period_s,
                expiry_s=config.replica_peer_expiry_s,
            )

    # -- construction and lifecycle ---------------------------------------------------------------

    @classmethod
    async def create(cls, config: ServeConfig) -> Proxy:
        """Discovers every instance's KV-event publishers and KV capacity, then builds the router
        and the backend of the configured mode."""
        loop = asyncio.get_running_loop()
        upstream = Upstream(
            connect_timeout_s=config.connect_timeout_s,
            first_byte_timeout_s=config.first_byte_timeout_s,
            api_key=config.upstream_api_key,
            drop_client_credentials=bool(config.api_keys or config.api_keys_file),
        )
        telemetry = ProxyTelemetry()
        if config.disaggregated:
            capacity = await loop.run_in_executor(None, fleet_kv_capacity, config.prefill, 2.0, upstream.auth)
            fleet = Fleet(config, {}, upstream, telemetry)
            pd = PdRouter(
                [i.url for i in config.prefill],
                [i.url for i in config.decode],
                policy=config.policy,  # type: ignore[arg-type]  # validated by ServeConfig
                block_size=config.block_size,
                seed=config.seed,
                # Its prefill index is its own (insert on route): no KV-event feed in PD mode.
                config=config.router_config(exact_index=False, kv_capacity_tokens=capacity),
                decode_rule=config.decode_rule,  # type: ignore[arg-type]  # checked by PdRouter
            )
            prefill = frozenset(i.url for i in config.prefill)
            decode = frozenset(i.url for i in config.decode)
            backend: Backend = PdBackend(pd, prefill, decode, fleet, upstream, telemetry)
            return cls(config, fleet, backend, upstream, telemetry)
        # One scrape of each engine's /metrics: its KV capacity, and where its CPU KV$ lives
        # from what it announces (kv_offload = "auto").
        caches = await loop.run_in_executor(None, fleet_caches, config.instances, 2.0, upstream.auth)
        offload = {url: c.host_offload_tokens for url, c in caches.items()}
        config = config.with_discovered_offload(offload)
        known_offload = [t for t in offload.values() if t]
        sources = {
            i.url: await loop.run_in_executor(None, kv_event_sources, i, upstream.auth) for i in config.instances
        }
        capacity = smallest_kv_capacity(caches.values())
        config = config.with_session_capacity(capacity)
        # The index can trust KV events only when the routed ids are the engine's own ids.
        exact_ids = config.tokens.mode in ("ids", "tokenizer") or (
            config.tokens.mode == "auto" and config.tokens.tokenizer is not None
        )
        exact = exact_ids and all(sources.values())
        router = Router(
            [i.url for i in config.instances],
            policy=config.policy,  # type: ignore[arg-type]  # validated by ServeConfig
            block_size=config.block_size,
            seed=config.seed,
            config=config.router_config(
                exact_index=exact,
                kv_capacity_tokens=capacity,
                host_offload_tokens=min(known_offload) if known_offload else None,
            ),
        )
        for inst in config.instances:
            if inst.host_pool is not None:  # a node-local store its pool shares (docs §2.8)
                router.set_host_pool(inst.url, inst.host_pool)
        fleet = Fleet(config, sources, upstream, telemetry)
        return cls(config, fleet, ColocatedBackend(router, upstream, telemetry), upstream, telemetry)

    async def start(self) -> None:
        """Opens the upstream client and starts the fleet's feeds, probe and model refresh."""
        self._upstream.open()
        await self.fleet.start(self.backend.feed_targets())
        if self.replica_bus is not None:
            await self.replica_bus.start()

    async def close(self) -> None:
        """Stops the background work and closes the upstream client."""
        if self.replica_bus is not None:
            await self.replica_bus.close()
        await self.fleet.close()
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        self.outcomes.close()
        await self._upstream.close()

    def _finish(self, outcome: Outcome, status: int, *, refused: str | None = None) -> None:
        """Finishes a request the app served, after the gateway's records so far (the decision
        log stays in the order requests ended, whichever plane served them)."""
        if self.compiled is not None:
            self.compiled.drain()
        self.outcomes.finish(outcome, status, refused=refused)

    @property
    def admitting(self) -> DoorAdmission | None:
        """The admission this proxy's requests take their slots from: its gateway's door (None
        before :func:`run` has started the gateway)."""
        return self.compiled.admission if self.compiled is not None else None

    def _admitted(self) -> int:
        admitting = self.admitting
        return admitting.admitted if admitting is not None else 0

    # -- the routes table -------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application."""
        # The error shape outermost: whatever a later layer raises is answered in it. The keys are
        # read once, at start: an open proxy has no key check on its path at all.
        middlewares = [self._error_shape, self._gateway_only]
        if self.keys.enabled:
            middlewares.append(keys_middleware(self.keys, self._api_for))
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=middlewares)
        app.on_response_prepare.append(_no_banner)
        app.on_response_prepare.append(self.outcomes.stamp)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/admin/instances", self._admin_add)
        app.router.add_delete("/admin/instances", self._admin_remove)
        # Any character in the id (a CR LF or NUL is answered with a 400, not left unmatched).
        app.router.add_post(r"/v1/sessions/{session_id:[\s\S]+}/end", self._session_end)
        app.router.add_post("/finish_session", self._finish_session)  # vllm-router's form
        for api in self.apis:  # after the fixed routes: a pass-through's catch-all comes last
            for route in api.routes():
                handler = self._handler(api, route)
                if route.method == "*":
                    handler = self._method_checked(app, handler)
                app.router.add_route(route.method, route.path, handler)
        return app

    @staticmethod
    def _method_checked(
        app: web.Application, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        """A catch-all route's ``handler``, which first answers a path some other route serves
        with another method: a 405 with ``Allow`` (the error-shape middleware renders it in the
        path's API shape), not the catch-all's 404. aiohttp would say so itself, but the
        catch-all matches every method before its resolver gets there."""

        async def checked(request: web.Request) -> web.StreamResponse:
            allowed: set[str] = set()
            for resource in app.router.resources():
                if resource is request.match_info.route.resource:
                    continue
                match, methods = await resource.resolve(request)
                if match is None:
                    allowed |= methods
            if allowed:
                raise web.HTTPMethodNotAllowed(request.method, sorted(allowed))
            return await handler(request)

        return checked

    def error_response(self, path: str | None, status: int, message: str) -> web.StreamResponse:
        """An error the HTTP layer answers (aiohttp's own, a refused body) in the error shape of
        the API that owns ``path`` — its adapter renders it — or OpenAI's for any other path."""
        api = self._api_for(path or "/")
        if status >= 500:
            return self._respond(api.fail(ProxyError(status, message, "InternalServerError")))
        return self._respond(api.reject(RequestError(message, status=status)))

    @web.middleware
    async def _gateway_only(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The app answers its gateway alone: a request without the gateway's secret (another
        process on this host that found the loopback port) is a 403 in the path's shape, so
        nothing skips the door's keys, admission and limits."""
        compiled = self.compiled
        if compiled is None or not compiled.vouches(request.headers):
            self.telemetry.client_errors["http_403"] += 1
            return self.error_response(request.path, 403, NOT_FROM_GATEWAY)
        return await handler(request)

    @web.middleware
    async def _error_shape(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """aiohttp's HTTP errors (no route: 404, wrong method: 405, …) in the path's error shape,
        with a fixed message (aiohttp's would name the client's path and method)."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            self.telemetry.client_errors[f"http_{e.status}"] += 1
            response = self.error_response(request.path, e.status, status_message(e.status))
            if "Allow" in e.headers:
                response.headers["Allow"] = e.headers["Allow"]
            return response

    def _handler(self, api: Api[Any], route: Route) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            # Only the gateway reaches this handler (``_gateway_only``), and it admitted the
            # request or refused it at its door, holding the slot until the answer's last byte.
            outcome = self.outcomes.begin(request, api.name)
            door_refusal = CompiledPlane.refused(request.headers)
            if door_refusal is not None:
                refusal = self._door_refusal(door_refusal)
                response = self._respond(api.fail(refusal.error))
                response.headers["Retry-After"] = str(refusal.retry_after_s)
                self._finish(outcome, response.status, refused=refusal.reason)
                return response
            answer = await self._handle(request, api, route, CompiledPlane.counted_turn(request.headers))
            self._finish(outcome, answer.status)
            return answer

        return handle

    @staticmethod
    def _api_for(path: str) -> Api[Any]:
        """The API whose error shape answers for ``path``: the longest adapter path it starts
        with, else OpenAI's (the first adapter)."""
        matches = [api for api in APIS if path == api.path or path.startswith(api.path + "/")]
        return max(matches, key=lambda api: len(api.path)) if matches else APIS[0]

    # -- the request path -------------------------------------------------------------------------

    def _door_refusal(self, reason: str) -> Refusal:
        """The gateway's refusal (it counted it) as the app answers one."""
        door = self.compiled.gateway.admission() if self.compiled is not None else {}
        error = refusal_error(
            reason,
            admitted=door.get("admitted", 0),
            queued=door.get("queued", 0),
            queue_timeout_s=self.config.queue_timeout_s,
        )
        return Refusal(error, reason, self.config.retry_after_s)

    async def _handle(
        self,
        request: web.Request,
        api: Api[Any],
        route: Route | None = None,
        counted: int | None = None,
    ) -> web.StreamResponse:
        """One API request, parsed, prepared and served (``counted``: the turn the gateway
        already counted in the session table)."""
        started = time.perf_counter()
        if self.draining:
            return self._respond(api.fail(ProxyError.unavailable("the proxy is shutting down")))
        try:
            ends = session_end(request.headers)
        except ValueError as e:
            self.telemetry.client_errors["session_end_header"] += 1
            return self._respond(api.reject(RequestError(str(e), code="invalid_session_end")))
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in _IDENTITY:
            # aiohttp would inflate it on this loop (a bomb stalls every request), and the body
            # would then be forwarded under a header that no longer describes it.
            self.telemetry.client_errors["content_encoding"] += 1
            error = RequestError(
                "request bodies must be sent without Content-Encoding (identity)",
                status=415,
                code="unsupported_content_encoding",
            )
            return _closing(self._respond(api.reject(error)))
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _closing(self._respond(api.reject(RequestError.too_large(self.config.max_body_bytes))))
        except TimeoutError:
            self.telemetry.client_errors["body_timeout"] += 1
            error = RequestError(
                f"the request body did not arrive within {self.config.body_timeout_s} s", status=408, code="timeout"
            )
            return _closing(self._respond(api.reject(error)))
        try:
            req = (
                api.parse(raw)
                if route is None
                else api.parse_route(raw, route, request.match_info, request.query_string)
            )
        except RequestError as e:
            return self._respond(api.reject(e))
        except Exception as e:  # any failure to parse client input is the client's: a 400
            self.telemetry.client_errors["unparseable_body"] += 1
            log.debug("unparseable %s body: %s", api.name, type(e).__name__)
            return self._respond(api.reject(RequestError("the request body could not be parsed")))
        # After the API's own checks (which name the field), for every API: engines decode such a
        # body, then fail on it (a 500).
        if escapes_lone_surrogate(raw):
            self.telemetry.client_errors["lone_surrogate"] += 1
            return self._respond(api.reject(RequestError("the body escapes a lone UTF-16 surrogate: not Unicode text")))
        try:
            model = api.model(req)
            if model is not None and self.fleet.models and model not in self.fleet.models:
                raise RequestError.unknown_model(model)
            if api.tokenizes(self.tokens, req):
                # BPE work (a first turn: tens of ms) runs off the event loop, so other requests
                # keep flowing; one worker thread, which also keeps the piece cache single-threaded.
                loop = asyncio.get_running_loop()
                tokens = await loop.run_in_executor(self._tokenizer_pool, api.routing_tokens, self.tokens, req)
            else:
                tokens = api.routing_tokens(self.tokens, req)
        except RequestError as e:
            return self._respond(api.reject(e))
        except _TOKENIZING_ERRORS as e:
            self.telemetry.client_errors["untokenizable_prompt"] += 1
            log.debug("untokenizable %s prompt: %s", api.name, type(e).__name__)
            message = f"the prompt could not be turned into tokens ({type(e).__name__})"
            return self._respond(api.reject(RequestError(message)))
        except Exception:  # a bug must still answer in the API's shape, and the proxy live on
            log.exception("request preparation failed")
            return self._respond(api.fail(ProxyError.internal()))
        self.in_flight += 1
        self.idle.clear()
        ended: tuple[SessionHint | str | None, ...] = ()
        """The keys of the session this request ends, released once it is answered (or failed)."""
        try:
            async with asyncio.timeout(self.config.client_timeout_s):
                turns = self.sessions if counted is None else CountedTurn(counted)
                prepared = api.prepare(req, raw, tokens, request.headers, turns)
                if ends:
                    own = session_hint(request.headers)
                    if own is None and prepared.turn_key is None:
                        error = RequestError(
                            SHARED_END_WITHOUT_SESSION,
                            code="session_end_without_session",
                        )
                        return self._respond(api.reject(error))
                    prepared = replace(prepared, ends_session=True)
                    ended = (own, prepared.turn_key)
                home = self._parent_home(request) if prepared.routed else None
                if home is not None:
                    prepared = replace(prepared, group_instance=home)
                if prepared.model in self.fleet.adapters:  # a LoRA adapter: its own cache namespace
                    prepared = replace(prepared, namespace=self.fleet.namespace(prepared.model, prepared.namespace))
                if self.backend.session_cookie:  # llm-d's cookie names the session's instance
                    prepared = replace(prepared, previous_instance=affinity_instance(request.headers))
                if self.backend.hashes_session:  # vllm-router's hash policies key on the session header
                    hint = session_hint(request.headers)
                    if hint is not None:
                        prepared = replace(prepared, session_key=hint.key)
                response = await self.failover.serve(request, api, prepared)
        except TimeoutError:
            response = await self._failed(request, api, ProxyError.timeout("the request timed out in the proxy"))
        except Exception:  # a bug: the attempt was aborted on the way out; answer in the API's shape
            log.exception("request failed in the proxy")
            response = await self._failed(request, api, ProxyError.internal())
        finally:
            if ended:
                self._end_session(ended, "header", request)
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()
            self.telemetry.request_s.observe(time.perf_counter() - started)
        return self._respond(response)

    # -- session life (docs/serve.md, "Session life") ---------------------------------------------

    def _served(self, outcome: Outcome) -> None:
        """A finished request of this plane: its session's home is where it was answered
        (co-located mode; a session's last request leaves no home behind). The gateway places
        its own requests' homes in the same table as it answers them."""
        if (
            outcome.session is not None
            and outcome.instance is not None
            and outcome.status == 200
            and not outcome.session_end
            and outcome.prefill_instance is None
        ):
            self.sessions.place(outcome.session, outcome.instance)

    def _parent_home(self, request: web.Request) -> str | None:
        """The parent's home when the request is a sub-agent's first (it names a parent, and
        its own session has no home yet), or None. Co-located mode, ``parent_affinity`` on."""
        if not self.config.parent_affinity or not isinstance(self.backend, ColocatedBackend):
            return None
        parent = parent_key(request.headers)
        if parent is None:
            return None
        own = session_hint(request.headers)
        if own is not None and self.sessions.home(own.key) is not None:
            return None  # a later request of the sub-agent: its own history leads
        home = self.sessions.home(parent)
        if home is None:
            self.telemetry.parent_placements["parent_unknown"] += 1
            outcome = request.get(OUTCOME_KEY)
            if outcome is not None:
                outcome.grouping = "parent_unknown"
        return home

    def _end_session(self, keys: Sequence[SessionHint | str | None], via: str, request: web.Request) -> bool:
        """Releases the sessions' state at once (the table's entries: turns and home); whether
        the table held any. Counted in ``proxy_session_ends_total``."""
        held = False
        for key in {k.key if isinstance(k, SessionHint) else k for k in keys if k is not None}:
            held = self.sessions.end(key) or held
            if self.compiled is not None:  # session admission's residency is the gateway's
                self.compiled.end_session(key)
        self.telemetry.session_ends[(via, held)] += 1
        outcome = request.get(OUTCOME_KEY)
        if outcome is not None:
            outcome.session_end = True
        return held

    async def _session_end(self, request: web.Request) -> web.Response:
        """``POST /v1/sessions/{id}/end``."""
        return self._session_ended(request, request.match_info["session_id"])

    async def _finish_session(self, request: web.Request) -> web.Response:
        """``POST /finish_session?session_id=…`` (vllm-router's form of the same)."""
        return self._session_ended(request, request.query.get("session_id", ""))

    def _session_ended(self, request: web.Request, session_id: str) -> web.Response:
        """Ends ``session_id`` (idempotent: 200 whether or not this proxy held state for it),
        or a 400 in OpenAI's error shape for an id no client session can have."""
        problem = session_id_problem(session_id)
        if problem is not None:
            self.telemetry.client_errors["session_id"] += 1
            error = RequestError(problem, param="session_id", code="invalid_session_id")
            return web.json_response(error.body(), status=400)
        held = self._end_session((session_id,), "endpoint", request)
        response = web.json_response({"object": "session.end", "id": session_id, "ended": True, "held": held})
        if self.backend.session_cookie:
            response.headers["Set-Cookie"] = affinity_cleared_cookie()
        return response

    @staticmethod
    async def _failed(request: web.Request, api: Api[Any], error: ProxyError) -> web.StreamResponse:
        """The answer to a request the proxy failed: an error event when its stream has started
        (a stream's error event is always a 503: the headers already said 200), else the error."""
        started_stream = request.get(STREAM_KEY)
        if started_stream is not None:
            return await end_stream(api, started_stream, ProxyError.unavailable(error.message))
        return api.fail(error)

    def _respond(self, response: web.StreamResponse) -> web.StreamResponse:
        self.telemetry.responses[response.status] += 1
        return response

    def count_client_error(self, kind: str) -> None:
        """Counts client garbage the HTTP layer refused (``proxy_client_errors_total``)."""
        self.telemetry.client_errors[kind] += 1

    # -- fleet endpoints --------------------------------------------------------------------------

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": list(self.fleet.model_cards.values())})

    async def _health(self, _: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.fleet.all_ejected:
            return web.json_response({"status": "no healthy instance"}, status=503)
        if self.replica_bus is not None:
            return web.json_response({"status": "ok", "replica_bus": self.replica_bus.health()})
        return web.json_response({"status": "ok"})

    async def _metrics(self, _: web.Request) -> web.Response:
        compiled = self.compiled
        if compiled is not None:  # what the gateway served so far, counted before rendering
            compiled.drain()
        in_flight = self.backend.in_flight(self.fleet.instances)
        lines = [
            *self.telemetry.render(in_flight, self.fleet.ejected),
            *self.backend.metric_lines(),
            *(compiled.render_admission() if compiled is not None else ()),
            *self.keys.render(),
            *self.outcomes.render(),
            *self._fleet_lines(),
            *(self.replica_bus.render() if self.replica_bus is not None else []),
        ]
        head = self.backend.metrics_text(self.fleet.subscriber, self.fleet.scraper)
        text = head + ("\n".join(lines) + "\n" if lines else "")
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    def _fleet_lines(self) -> list[str]:
        """The fleet view this replica routes on (co-located: its own work plus its peers')."""
        if not isinstance(self.backend, ColocatedBackend):
            return []
        return fleet_lines(self.backend.router, list(self.fleet.instances))

    def _host_pools_on(self) -> bool:
        """Whether the router keeps host pools (docs/routing-semantics.md §2.8)."""
        return isinstance(self.backend, ColocatedBackend) and self.backend.router.config.host_capacity_blocks > 0

    def _admin_denied(self, request: web.Request) -> web.Response | None:
        token = self.config.admin_token
        if token is None:
            return _json_error(ProxyError(404, "admin endpoints are disabled (no admin_token)", "NotFoundError"))
        if not self.backend.resizable:
            return _json_error(
                ProxyError(409, "adding or removing instances is not supported in PD mode", "ConflictError")
            )
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        # aiohttp keeps a header's non-UTF-8 bytes as surrogate escapes: compare the bytes.
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
            return _json_error(ProxyError(401, "a valid admin token is required", "AuthenticationError"))
        return None

    async def _admin_add(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
            inst = InstanceConfig(**body) if isinstance(body, dict) else InstanceConfig(url=str(body))
        except RecursionError:
            return _json_error(ProxyError(400, "bad instance: the body is nested too deeply", "BadRequestError"))
        except (ValueError, TypeError, SmetricError) as e:
            return _json_error(ProxyError(400, f"bad instance: {e}", "BadRequestError"))
        if inst.url in self.fleet.instances:
            return _json_error(ProxyError(409, f"instance {inst.url} is already in the fleet", "ConflictError"))
        loop = asyncio.get_running_loop()
        offload = await loop.run_in_executor(None, fleet_host_offload, [inst], 2.0, self._upstream.auth)
        (inst,) = replace(self.config, instances=(inst,)).with_discovered_offload(offload).instances
        if inst.kv_offload == KV_OFFLOAD_HOST and not self._host_pools_on():
            log.warning(
                "instance %s offloads to host memory but the router was built without host pools "
                "(no instance offloaded at start; set router.host_capacity_blocks): its CPU KV$ is not credited",
                inst.url,
            )
        sources = await loop.run_in_executor(None, kv_event_sources, inst, self._upstream.auth)
        self.backend.add_instance(inst.url, inst.host_pool)
        self.fleet.add(inst, sources)
        self.fleet.restart_feeds()
        await self.fleet.refresh_models()
        return web.json_response({"instances": list(self.fleet.instances)})

    async def _admin_remove(self, request: web.Request) -> web.Response:
        denied = self._admin_denied(request)
        if denied is not None:
            return denied
        url = request.query.get("url", "").rstrip("/")
        if url not in self.fleet.instances:
            return _json_error(ProxyError(404, f"unknown instance {url!r}", "NotFoundError"))
        if len(self.fleet.instances) == 1:
            return _json_error(ProxyError(409, "cannot remove the last instance", "ConflictError"))
        self.backend.remove_instance(url)
        self.fleet.remove(url)
        self.fleet.restart_feeds()
        await self.fleet.refresh_models()
        return web.json_response({"instances": list(self.fleet.instances)})


async def run(
    config: ServeConfig, *, on_ready: Callable[[Proxy, int], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    """Runs the proxy until ``stop`` is set or SIGTERM/SIGINT arrives, then drains.

    ``on_ready`` gets the proxy and its bound port once it listens (``config.port`` 0: any free port).
    Draining: ``/health`` answers 503, the listening socket closes, and in-flight requests get
    up to ``drain_timeout_s`` to finish before the function returns.
    """
    proxy = await Proxy.create(config)
    try:
        await proxy.start()
    except BaseException:
        await proxy.close()  # the upstream session and the feeds, whatever failed
        raise
    # The gateway serves the public address; the app listens on a loopback port only it knows,
    # for what the gateway hands on (the control plane's endpoints, the bodies it leaves to the app).
    secret = new_secret()
    backend = proxy.backend
    assert isinstance(backend, ColocatedBackend | PdBackend)
    router = backend.router if isinstance(backend, ColocatedBackend) else backend.pd
    responses = next(api for api in proxy.apis if isinstance(api, ResponsesApi))
    native = native_settings(
        proxy.config, router, proxy.tokens, secret, proxy.client_keys, responses.ids.key, proxy.sessions
    )
    runner = GuardedRunner(
        proxy.app(),
        render=proxy.error_response,
        on_client_error=proxy.count_client_error,
        limits=ConnectionLimits(
            head_timeout_s=config.head_timeout_s,
            keepalive_timeout_s=config.keepalive_timeout_s,
            # The app's connections are the gateway's pool (at most one per client connection it
            # admitted, and its idle ones): the gateway bounds the clients.
            max_connections=config.max_connections * 2,
            retry_after_s=config.retry_after_s,
        ),
        handler_cancellation=True,
        access_log=None,
        max_line_size=config.max_header_bytes,
        max_field_size=config.max_header_bytes,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        gateway = Gateway(
            config.host,
            config.port,
            runner.addresses[0][1],
            # The door bounds the whole head and each line or field as the engines do (431).
            max_head_bytes=config.max_head_bytes,
            max_field_bytes=config.max_header_bytes,
            head_timeout_s=config.head_timeout_s,
            drain_timeout_s=config.drain_timeout_s,
            max_connections=config.max_connections,
            retry_after_s=config.retry_after_s,
            native=native,
            instances=list(proxy.fleet.instances),
        )
    except BaseException:
        await runner.cleanup()
        await proxy.close()
        raise
    proxy.telemetry.door_client_errors = gateway.client_errors
    proxy.compiled = CompiledPlane(
        gateway,
        secret,
        app_port=runner.addresses[0][1],
        fleet=proxy.fleet,
        telemetry=proxy.telemetry,
        outcomes=proxy.outcomes,
    )
    proxy.compiled.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            break
    port = gateway.port
    log.info(
        "smetric serve on http://%s:%s: %d instances, policy %s, %s data plane",
        config.host,
        port,
        len(proxy.fleet.instances),
        config.policy,
        plane_summary(native),
    )
    if on_ready is not None:
        on_ready(proxy, port)
    try:
        await stop.wait()
        proxy.draining = True
        # The gateway stops accepting; its drain waits on requests this loop serves.
        await loop.run_in_executor(None, gateway.stop)
        await site.stop()
        try:
            await asyncio.wait_for(proxy.idle.wait(), config.drain_timeout_s)
        except TimeoutError:
            log.warning("drain timeout: %d requests still in flight", proxy.in_flight)
    finally:
        gateway.stop()  # idempotent: after a failure before the drain
        await proxy.compiled.close()
        await runner.cleanup()
        await proxy.close()


def run_forever(coro: Coroutine[Any, Any, None]) -> None:
    """Runs the proxy's coroutine on uvloop when it is installed (the ``serve`` extra has it on
    Linux and macOS: its event loop roughly halves the per-request cost of aiohttp), else on
    asyncio's default loop."""
    try:
        import uvloop
    except ModuleNotFoundError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


class ProxyServer:
    """The proxy on a background thread with its own event loop (tests, embedding in a process).

    >>> with ProxyServer(load_config(instances=["http://127.0.0.1:8001"], port=0)) as p:  # doctest: +SKIP
    ...     print(p.url)
    """

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.port: int | None = None
        self.proxy: Proxy | None = None
        """The running proxy (read its backend's router and its telemetry; mutate only from its loop)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the proxy is not running")
        return f"http://{self.config.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Self:
        """Starts the thread; returns once the proxy listens."""

        def ready(proxy: Proxy, port: int) -> None:
            self.proxy, self.port = proxy, port
            self._ready.set()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await run(self.config, on_ready=ready, stop=self._stop)

        def target() -> None:
            try:
                run_forever(main())
            except BaseException as e:
                self._error = e
                self._ready.set()

        self._thread = threading.Thread(target=target, name="smetric-serve", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the proxy did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Drains and stops the proxy (as SIGTERM does)."""
        if self._loop is not None and self._stop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
