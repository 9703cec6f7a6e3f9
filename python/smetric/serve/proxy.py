"""``smetric serve``: an OpenAI-compatible routing proxy in front of a vLLM fleet.

Per request (``POST /v1/chat/completions`` or ``/v1/completions``):

1. read the body (bounded), parse only what routing needs (:mod:`smetric.serve.request`), get the
   token ids (:mod:`smetric.serve.tokens`) and the turn (messages, else a session hint);
2. ask the Rust core for an instance (``Router.route``, the GIL released), excluding ejected
   instances, those that do not serve the model, and those this request already failed on;
3. forward the body bytes unchanged and relay the answer: a stream chunk by chunk as it arrives,
   a whole answer at once; every response carries ``x-smetric-decision``;
4. report the lifecycle to the router exactly once per attempt: ``on_prefilled`` at the first
   body byte, then ``on_finished`` (output tokens) or ``on_aborted`` (upstream failure, client
   gone, timeout).

Failover: a connection error, a timeout or a 5xx before the first body byte is retried on
another instance (``max_attempts`` in all), the decision re-made without the failed ones. An
instance failing ``eject_after`` times in a row is ejected until its ``GET /health`` answers
200 again (probed every ``probe_interval_s``); its local index is cleared on re-admission, since
an engine that came back has usually restarted empty. A stream cut after its first chunk
continues on another instance (``resume_streams``): chat with vLLM's ``continue_final_message``
and the text so far as the final assistant message; text completions with that text appended to
the prompt. A request is therefore lost only when no instance can serve it.

Invariants: each attempt's router request id gets exactly one of ``on_finished`` /
``on_aborted`` (and at most one ``on_prefilled``) — ``_Attempt`` guards it; the proxy fetches only
configured instance URLs, never a URL taken from a request. All state lives on the proxy's one
event loop; the KV-event subscriber and the load scraper feed the router from their own threads
(the router is thread-safe).

Cost per request beyond the network: one body parse, one token lookup, one ``route`` (≈12 µs for
32K tokens), header copies; streams cost an SSE scan per chunk (O(chunk bytes)).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Self

import aiohttp
from aiohttp import web

from smetric._core import Decision, Router

if TYPE_CHECKING:
    from smetric._core import PdRouter
from smetric.errors import NoInstancesError, SmetricError
from smetric.metrics import CONTENT_TYPE, MetricsExporter
from smetric.serve.config import KV_EVENTS_DISCOVER, KV_EVENTS_OFF, InstanceConfig, ServeConfig
from smetric.serve.disagg import decode_body, kv_params_of, pd_decision_header, prefill_body, prefill_headers
from smetric.serve.request import OpenAIRequest, RequestError, parse_request
from smetric.serve.session import SessionTable, session_hint
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.tokens import RoutingTokens, TokenConfig, TokenSource

log = logging.getLogger("smetric.serve")

Endpoint = Literal["chat", "completions"]
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

REASON_LABELS = {
    "first-turn: least-loaded": "first-turn",
    "follow-up: sticky": "sticky",
    "follow-up: migrate (home overloaded)": "migrated-overload",
    "follow-up: migrate (local KV$ evicted)": "migrated-evicted",
}
"""Short labels of smetric's reasons; every other policy's decision is ``load-balanced``."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""RFC 9110 §7.6.1 hop-by-hop fields, never forwarded (nor any field ``Connection`` names)."""
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}

_STREAM_KEY = web.RequestKey("smetric.stream", web.StreamResponse)
"""Where a request keeps its client stream once the headers are sent."""

_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)


def reason_label(reason: str) -> str:
    """The short label of a core reason (see :data:`REASON_LABELS`)."""
    return REASON_LABELS.get(reason, "load-balanced")


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without hop-by-hop fields, those ``Connection`` names, ``Host`` and ``Content-Length``."""
    lowered = [(k.lower(), k, v) for k, v in headers.items()]
    named = {h.strip() for low, _, v in lowered if low == "connection" for h in v.lower().split(",") if h.strip()}
    return {k: v for low, k, v in lowered if low not in _NOT_FORWARDED and low not in named}


def decision_header(d: Decision, *, attempt: int, source: str) -> str:
    """The ``x-smetric-decision`` value: ``key=value`` pairs joined by ``"; "``."""
    return (
        f"instance={d.instance}; reason={reason_label(d.reason)}; first_turn={int(d.first_turn)}; "
        f"local_hit_tokens={d.local_hit_tokens}; global_hit_tokens={d.global_hit_tokens}; "
        f'policy={d.policy}; detail="{d.reason}"; attempt={attempt}; tokens={source}'
    )


def error_response(status: int, message: str, *, kind: str, param: str | None = None) -> web.Response:
    """An OpenAI-style error body (``{"error": {message, type, param, code}}``)."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


class _Attempt:
    """One routed attempt: where it went, its decision header, and the once-only lifecycle calls
    (co-located: the router's ``on_prefilled`` at the first byte; PD: ``on_transferred``)."""

    __slots__ = ("_abort", "_finish", "_first_byte", "done", "header", "instance", "prefilled")

    def __init__(
        self,
        instance: str,
        header: str,
        first_byte: Callable[[], object],
        finish: Callable[[int], object],
        abort: Callable[[], object],
    ) -> None:
        self.instance = instance
        self.header = header
        self._first_byte, self._finish, self._abort = first_byte, finish, abort
        self.prefilled = False
        self.done = False

    @classmethod
    def colocated(cls, router: Router, d: Decision, *, attempt: int, source: str) -> _Attempt:
        rid = d.request_id
        return cls(
            d.instance,
            decision_header(d, attempt=attempt, source=source),
            lambda: router.on_prefilled(rid),
            lambda n: router.on_finished(rid, n),
            lambda: router.on_aborted(rid),
        )

    def first_byte(self) -> None:
        if not self.prefilled and not self.done:
            self.prefilled = True
            self._first_byte()

    def finish(self, output_tokens: int) -> None:
        if not self.done:
            self.done = True
            self._finish(output_tokens)

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self._abort()


class _Sse:
    """Splits an event stream into events and keeps what accounting and resumption need.

    The relay path only scans bytes: ``[DONE]``, a non-null ``finish_reason``, and the usage chunk
    (the one event it decodes). The events are kept raw and decoded only when a cut stream must
    be continued (:meth:`text_and_tokens`), so relaying costs O(chunk bytes) and no JSON work.
    """

    __slots__ = ("_events", "chat", "chunks", "done", "finished", "keep", "output_tokens", "pending")

    def __init__(self, *, chat: bool, keep: bool) -> None:
        self.chat = chat
        self.keep = keep
        self.pending = b""
        self.chunks = 0
        """Events with a ``finish_reason`` key: the choice chunks (one token each, plus chat's
        opening role chunk)."""
        self.output_tokens: int | None = None
        """``usage.completion_tokens`` when the stream carried it."""
        self.finished = False
        """A chunk carried a non-null ``finish_reason``."""
        self.done = False
        """``data: [DONE]`` arrived."""
        self._events: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete events in ``pending + chunk`` (each without its blank line)."""
        data = self.pending + chunk
        *events, self.pending = data.split(b"\n\n")
        for event in events:
            self._scan(event)
        return events

    def _scan(self, event: bytes) -> None:
        if not event.startswith(b"data:"):
            return
        if event[5:].strip() == b"[DONE]":
            self.done = True
            return
        if b'"finish_reason"' in event:
            self.chunks += 1
            if b'"finish_reason":null' not in event and b'"finish_reason": null' not in event:
                self.finished = True
        if b'"completion_tokens"' in event:
            try:
                usage = json.loads(event[5:]).get("usage")
            except (ValueError, AttributeError):
                usage = None
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.output_tokens = usage["completion_tokens"]
        if self.keep:
            self._events.append(event)

    def forget(self, event: bytes) -> None:
        """Drops a fed event from the counts (a continuation's opening role chunk)."""
        if b'"finish_reason"' in event:
            self.chunks -= 1
        if self.keep and event in self._events:
            self._events.remove(event)

    @property
    def tokens(self) -> int:
        """Output tokens so far: the usage figure when sent, else the choice chunks (chat's
        role chunk excluded)."""
        if self.output_tokens is not None:
            return self.output_tokens
        return max(0, self.chunks - 1) if self.chat else self.chunks

    def text_and_tokens(self) -> tuple[str, int]:
        """The text streamed so far and the chunks that carried it (decodes the kept events)."""
        pieces = []
        for event in self._events:
            try:
                obj = json.loads(event[5:])
            except ValueError:
                continue
            choices = obj.get("choices") or [] if isinstance(obj, dict) else []
            if not choices:
                continue
            first = choices[0]
            piece = (first.get("delta") or {}).get("content") if self.chat else first.get("text")
            if isinstance(piece, str) and piece:
                pieces.append(piece)
        return "".join(pieces), len(pieces)


def _is_role_only(event: bytes) -> bool:
    """A continuation's opening chat chunk (``delta`` with a role and no content): dropped."""
    try:
        obj = json.loads(event[5:].strip())
    except ValueError:
        return False
    choices = obj.get("choices") or []
    if len(choices) != 1:
        return False
    delta = choices[0].get("delta") or {}
    return "role" in delta and not delta.get("content") and choices[0].get("finish_reason") is None


class _Health:
    """Consecutive failures and ejection of one instance."""

    __slots__ = ("ejected", "failures")

    def __init__(self) -> None:
        self.failures = 0
        self.ejected = False


class Proxy:
    """The proxy's state and handlers; :func:`serve` runs it. Build with :meth:`create`."""

    def __init__(
        self, config: ServeConfig, router: Router, sources: Mapping[str, list[Any]], pd: PdRouter | None = None
    ) -> None:
        self.config = config
        self.router = router
        """The co-located router; in PD mode the PD router's prefill side is ``pd``."""
        self.pd = pd
        self.instances: dict[str, InstanceConfig] = {i.url: i for i in config.all_instances}
        self.prefill_pool = {i.url for i in config.prefill}
        self.decode_pool = {i.url for i in config.decode}
        self.sources = dict(sources)
        self.tokens = TokenSource(
            TokenConfig(
                mode=config.tokens.mode,
                tokenizer=config.tokens.tokenizer,
                chat_template=config.tokens.chat_template,
                approx_chunk_bytes=config.tokens.approx_chunk_bytes,
            )
        )
        self.health = {url: _Health() for url in self.instances}
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smetric-tokenizer")
        self.telemetry = ProxyTelemetry()
        self.sessions = SessionTable()
        self.models: dict[str, set[str]] = {}
        """Model id → instances serving it (from their ``/v1/models``)."""
        self.model_cards: dict[str, dict[str, Any]] = {}
        self.in_flight = 0
        self.draining = False
        self.idle = asyncio.Event()
        """Set while no request is in flight (the drain waits for it)."""
        self.idle.set()
        self._client: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subscriber: Any = None
        self._scraper: Any = None
        self._exporter = MetricsExporter(router)

    # -- construction and background work ---------------------------------------------------------

    @classmethod
    async def create(cls, config: ServeConfig) -> Proxy:
        """Discovers every instance's KV-event publishers, then builds the router."""
        loop = asyncio.get_running_loop()
        if config.disaggregated:
            capacity = await loop.run_in_executor(None, _fleet_kv_capacity, config.prefill)
            return cls._create_pd(config, capacity)
        sources = {i.url: await loop.run_in_executor(None, _sources_of, i) for i in config.instances}
        capacity = await loop.run_in_executor(None, _fleet_kv_capacity, config.instances)
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
            config=config.router_config(exact_index=exact, kv_capacity_tokens=capacity),
        )
        return cls(config, router, sources)

    @classmethod
    def _create_pd(cls, config: ServeConfig, kv_capacity_tokens: int | None) -> Proxy:
        """PD mode: a :class:`smetric.PdRouter` over the two pools. Its prefill index is the
        router's own (insert on route): the KV-event ingestor feeds a co-located ``Router``."""
        from smetric._core import PdRouter

        pd = PdRouter(
            [i.url for i in config.prefill],
            [i.url for i in config.decode],
            policy=config.policy,  # type: ignore[arg-type]  # validated by ServeConfig
            block_size=config.block_size,
            seed=config.seed,
            config=config.router_config(exact_index=False, kv_capacity_tokens=kv_capacity_tokens),
            decode_rule=config.decode_rule,  # type: ignore[arg-type]  # checked by PdRouter
        )
        # The co-located router is not used for decisions in PD mode; it backs the metrics page
        # (router families at zero) so one exporter serves both modes.
        placeholder = Router([i.url for i in config.prefill], policy="round_robin", block_size=config.block_size)
        return cls(config, placeholder, {}, pd=pd)

    async def start(self) -> None:
        """Opens the upstream client and starts the feeds, the probe and the model refresh."""
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.first_byte_timeout_s
            ),
        )
        self._restart_feeds()
        await self._refresh_models()
        self._tasks = [
            asyncio.create_task(self._probe_loop(), name="smetric-probe"),
            asyncio.create_task(self._models_loop(), name="smetric-models"),
        ]

    async def close(self) -> None:
        """Stops the background work and closes the upstream client."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stop_feeds()
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            await self._client.close()

    def _stop_feeds(self) -> None:
        if self._subscriber is not None:
            self._subscriber.stop()
            self._subscriber = None
        if self._scraper is not None:
            self._scraper.stop()
            self._scraper = None

    def _restart_feeds(self) -> None:
        self._stop_feeds()
        flat = [s for url in self.instances for s in self.sources.get(url, [])]
        while flat:
            from smetric.errors import KvEventEndpointInUseError
            from smetric.events import KvEventSubscriber

            try:
                self._subscriber = KvEventSubscriber(self.router, flat).start()
                break
            except KvEventEndpointInUseError as e:  # an engine in connect mode: room for one router
                log.error("%s. Serving %s without its KV events.", e, e.instance)
                flat = [s for s in flat if s.endpoint != e.endpoint]
        if self.config.engine_load:
            from smetric.engine_load import EngineLoadScraper

            target: Any = self.router if self.pd is None else self.pd
            urls = {
                url: (i.metrics_url or url).removesuffix("/metrics")
                for url, i in self.instances.items()
                if self.pd is None or url in self.prefill_pool
            }
            self._scraper = EngineLoadScraper(target, urls, period_s=self.config.engine_load_period_s).start()
        self._exporter = MetricsExporter(self.router, events=self._subscriber, load=self._scraper)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            for url in [u for u, h in self.health.items() if h.ejected]:
                if await self._healthy(url):
                    self.health[url] = _Health()
                    if self.pd is None:
                        self.router.clear(url)
                    self.telemetry.readmissions[url] += 1
                    log.warning("instance %s re-admitted (its /health answers)", url)

    async def _healthy(self, url: str) -> bool:
        assert self._client is not None
        try:
            async with self._client.get(
                f"{url}/health", timeout=aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
            ) as r:
                return r.status == 200
        except _RETRYABLE:
            return False

    async def _models_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.models_refresh_s)
            await self._refresh_models()

    async def _refresh_models(self) -> None:
        assert self._client is not None

        async def one(url: str) -> tuple[str, list[dict[str, Any]] | None]:
            assert self._client is not None
            try:
                async with self._client.get(
                    f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
                ) as r:
                    if r.status != 200:
                        return url, None
                    data = (await r.json()).get("data")
                    return url, [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
            except (*_RETRYABLE, ValueError, AttributeError, TypeError):
                return url, None

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

    # -- health -----------------------------------------------------------------------------------

    def _failed(self, url: str, cause: str) -> None:
        self.telemetry.retries[cause] += 1
        h = self.health.get(url)
        if h is None:
            return
        h.failures += 1
        if h.failures >= self.config.eject_after and not h.ejected:
            h.ejected = True
            self.telemetry.ejections[url] += 1
            log.warning("instance %s ejected after %d consecutive failures", url, h.failures)

    def _succeeded(self, url: str) -> None:
        h = self.health.get(url)
        if h is not None:
            h.failures = 0

    def _exclusions(self, model: str | None, failed: list[str]) -> list[str] | None:
        """Instances the next attempt must skip, or None when no instance is left to try."""
        serving = self.models.get(model) if model is not None else None
        eligible = [u for u in self.instances if u not in failed and (serving is None or u in serving)]
        if not eligible:
            return None
        pools = (
            [eligible]
            if self.pd is None
            else [
                [u for u in eligible if u in self.prefill_pool],
                [u for u in eligible if u in self.decode_pool],
            ]
        )
        chosen: list[str] = []
        for pool in pools:
            if not pool:
                return None
            healthy = [u for u in pool if not self.health[u].ejected]
            # Ejected instances are a last resort: better a try than a refusal.
            chosen += healthy or pool
        return [u for u in self.instances if u not in chosen]

    # -- HTTP handlers ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/admin/instances", self._admin_add)
        app.router.add_delete("/admin/instances", self._admin_remove)
        return app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": list(self.model_cards.values())})

    async def _health(self, _: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if all(h.ejected for h in self.health.values()):
            return web.json_response({"status": "no healthy instance"}, status=503)
        return web.json_response({"status": "ok"})

    async def _metrics(self, _: web.Request) -> web.Response:
        in_flight = {}
        pd_stats = self.pd.stats() if self.pd is not None else None
        for url in self.instances:
            try:
                if self.pd is None:
                    in_flight[url] = self.router.load(url)["batch_size"]
                elif url in self.prefill_pool:
                    in_flight[url] = self.pd.load(url)["batch_size"]
                else:
                    assert pd_stats is not None
                    in_flight[url] = pd_stats["decode"][url]["batch_size"]
            except (SmetricError, KeyError):
                continue
        lines = [*self.telemetry.render(in_flight, lambda u: self.health[u].ejected)]
        if pd_stats is not None:
            lines += _pd_families(pd_stats)
        head = self._exporter.render() if self.pd is None else ""
        text = head + ("\n".join(lines) + "\n" if lines else "")
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    def _admin_allowed(self, request: web.Request) -> web.Response | None:
        token = self.config.admin_token
        if token is None:
            return error_response(404, "admin endpoints are disabled (no admin_token)", kind="NotFoundError")
        if self.pd is not None:
            return error_response(409, "adding or removing instances is not supported in PD mode", kind="ConflictError")
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return error_response(401, "a valid admin token is required", kind="AuthenticationError")
        return None

    async def _admin_body(self, request: web.Request) -> InstanceConfig | web.Response:
        try:
            body = await request.json()
            return InstanceConfig(**body) if isinstance(body, dict) else InstanceConfig(url=str(body))
        except (ValueError, TypeError, SmetricError) as e:
            return error_response(400, f"bad instance: {e}", kind="BadRequestError")

    async def _admin_add(self, request: web.Request) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        inst = await self._admin_body(request)
        if isinstance(inst, web.Response):
            return inst
        if inst.url in self.instances:
            return error_response(409, f"instance {inst.url} is already in the fleet", kind="ConflictError")
        sources = await asyncio.get_running_loop().run_in_executor(None, _sources_of, inst)
        self.router.add_instance(inst.url)
        self.instances[inst.url] = inst
        self.sources[inst.url] = sources
        self.health[inst.url] = _Health()
        self._restart_feeds()
        await self._refresh_models()
        return web.json_response({"instances": list(self.instances)})

    async def _admin_remove(self, request: web.Request) -> web.Response:
        denied = self._admin_allowed(request)
        if denied is not None:
            return denied
        url = request.query.get("url", "").rstrip("/")
        if url not in self.instances:
            return error_response(404, f"unknown instance {url!r}", kind="NotFoundError")
        if len(self.instances) == 1:
            return error_response(409, "cannot remove the last instance", kind="ConflictError")
        self.router.remove_instance(url)
        del self.instances[url], self.health[url]
        self.sources.pop(url, None)
        self._restart_feeds()
        await self._refresh_models()
        return web.json_response({"instances": list(self.instances)})

    # -- the request path -------------------------------------------------------------------------

    async def _handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        started = time.perf_counter()
        if self.draining:
            return self._respond(error_response(503, "the proxy is shutting down", kind="ServiceUnavailableError"))
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            err = RequestError.too_large(self.config.max_body_bytes)
            return self._respond(web.json_response(err.body(), status=err.status))
        try:
            req = parse_request(raw, endpoint)
            if req.model is not None and self.models and req.model not in self.models:
                raise RequestError.unknown_model(req.model)
            if req.prompt_ids is None and self.tokens.kind == "tokenizer":
                # BPE work (a first turn: tens of ms) runs off the event loop, so other requests
                # keep flowing; one worker thread, which also keeps the piece cache single-threaded.
                loop = asyncio.get_running_loop()
                tokens = await loop.run_in_executor(self._tokenizer_pool, self.tokens.routing_tokens, req)
            else:
                tokens = self.tokens.routing_tokens(req)
        except RequestError as e:
            return self._respond(web.json_response(e.body(), status=e.status))
        except Exception:  # a bug must still answer in the OpenAI form, and the proxy live on
            log.exception("request preparation failed")
            return self._respond(error_response(500, "internal error in the proxy", kind="InternalServerError"))
        self.in_flight += 1
        self.idle.clear()
        try:
            async with asyncio.timeout(self.config.client_timeout_s):
                response = await self._serve_request(request, raw, req, tokens)
        except TimeoutError:
            started_stream = request.get(_STREAM_KEY)
            if started_stream is not None:  # headers are out: end the stream with an error event
                response = await self._end_cut_stream(started_stream, "the request timed out in the proxy")
            else:
                response = error_response(504, "the request timed out in the proxy", kind="TimeoutError")
        except Exception:  # a bug: the attempt was aborted on the way out; answer in the OpenAI form
            log.exception("request failed in the proxy")
            started_stream = request.get(_STREAM_KEY)
            if started_stream is not None:
                response = await self._end_cut_stream(started_stream, "internal error in the proxy")
            else:
                response = error_response(500, "internal error in the proxy", kind="InternalServerError")
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()
            self.telemetry.request_s.observe(time.perf_counter() - started)
        return self._respond(response)

    def _respond(self, response: web.StreamResponse) -> web.StreamResponse:
        self.telemetry.responses[response.status] += 1
        return response

    def _turn(self, request: web.Request, req: OpenAIRequest) -> int | None:
        if req.messages is not None:
            return None  # the router reads the turn from the roles
        hint = session_hint(request.headers, prompt_cache_key=req.prompt_cache_key, user=req.user)
        return None if hint is None else self.sessions.next_turn(hint.key)

    def _route(self, req: OpenAIRequest, tokens: RoutingTokens, turn: int | None, exclude: list[str]) -> Decision:
        t0 = time.perf_counter()
        d = self.router.route(
            tokens.ids,
            messages=req.messages,
            turn=turn,
            namespace=req.namespace,
            exclude=exclude,
        )
        self.telemetry.record_decision(d, reason_label(d.reason), tokens.source, tokens.count, time.perf_counter() - t0)
        return d

    async def _serve_request(
        self, request: web.Request, raw: bytes, req: OpenAIRequest, tokens: RoutingTokens
    ) -> web.StreamResponse:
        assert self._client is not None
        headers = forwardable(request.headers)
        turn = self._turn(request, req)
        failed: list[str] = []
        response: web.StreamResponse | None = None
        attempt_no = 0
        stream: _Sse | None = None
        body = raw
        while attempt_no < self.config.max_attempts:
            attempt_no += 1
            opened = await self._open(req, body, tokens, turn, failed, headers, attempt_no)
            if opened is None:
                attempt_no -= 1
                break
            if opened == "retry":
                continue
            if isinstance(opened, web.StreamResponse):
                return opened
            attempt, upstream, t0 = opened
            try:
                is_stream = upstream.headers.get("content-type", "").startswith("text/event-stream")
                if not is_stream:
                    result = await self._whole(upstream, attempt, t0, response)
                else:
                    result = await self._relay(request, upstream, attempt, t0, req, stream, response)
                if isinstance(result, web.StreamResponse):
                    self._succeeded(attempt.instance)
                    return result
                # The attempt failed: before any byte reached the client (retry as it was), or
                # mid-stream (``result`` is the stream so far: continue it).
                failed.append(attempt.instance)
                self._failed(attempt.instance, result[0])
                stream, response = result[1], result[2]
                if response is not None:
                    assert stream is not None
                    resumed = self._resume(req, body, stream)
                    if resumed is None:
                        return await self._end_cut_stream(response)
                    req, body, tokens = resumed
                    turn = None
                    self.telemetry.resumed_streams += 1
            except BaseException:
                attempt.abort()
                upstream.close()  # the engine aborts a request whose connection closes
                raise
            finally:
                upstream.release()
        if response is not None:
            return await self._end_cut_stream(response)
        return error_response(
            503,
            f"no instance could serve the request ({attempt_no} attempts; failed: {', '.join(failed) or 'none'})",
            kind="ServiceUnavailableError",
        )

    async def _open(
        self,
        req: OpenAIRequest,
        body: bytes,
        tokens: RoutingTokens,
        turn: int | None,
        failed: list[str],
        headers: Mapping[str, str],
        attempt_no: int,
    ) -> tuple[_Attempt, aiohttp.ClientResponse, float] | web.Response | Literal["retry"] | None:
        """Routes one attempt and opens its upstream response (headers received, status < 500).

        Returns ``"retry"`` after a failure before the first byte (the instance is in
        ``failed``), None when no instance is left to try, or a finished response (PD: the
        prefill instance refused the request).
        """
        assert self._client is not None
        exclude = self._exclusions(req.model, failed)
        if exclude is None:
            return None
        if self.pd is not None:
            return await self._open_pd(req, body, tokens, turn, failed, headers, attempt_no, exclude)
        try:
            decision = self._route(req, tokens, turn, exclude)
        except NoInstancesError:
            return None
        attempt = _Attempt.colocated(self.router, decision, attempt=attempt_no, source=tokens.source)
        return await self._post(attempt, PATHS[req.endpoint], body, headers, failed)

    async def _open_pd(
        self,
        req: OpenAIRequest,
        body: bytes,
        tokens: RoutingTokens,
        turn: int | None,
        failed: list[str],
        headers: Mapping[str, str],
        attempt_no: int,
        exclude: list[str],
    ) -> tuple[_Attempt, aiohttp.ClientResponse, float] | web.Response | Literal["retry"] | None:
        """One PD attempt (:mod:`smetric.serve.disagg`): prefill, then open the decode answer."""
        pd = self.pd
        assert pd is not None and self._client is not None
        t0 = time.perf_counter()
        try:
            d = pd.route(tokens.ids, messages=req.messages, turn=turn, namespace=req.namespace, exclude=exclude)
        except NoInstancesError:
            return None
        self.telemetry.record_decision(d, reason_label(d.reason), tokens.source, tokens.count, time.perf_counter() - t0)
        rid = d.request_id
        attempt = _Attempt(
            d.decode_instance,
            pd_decision_header(d, attempt=attempt_no, source=tokens.source),
            lambda: pd.on_transferred(rid),
            lambda n: pd.on_finished(rid, n),
            lambda: pd.on_aborted(rid),
        )
        original = json.loads(body)
        prefill = _Attempt(d.prefill_instance, attempt.header, lambda: None, lambda n: None, attempt.abort)
        opened = await self._post(
            prefill, PATHS[req.endpoint], prefill_body(original), prefill_headers(headers), failed
        )
        if opened == "retry":
            return "retry"
        _, answer_of_p, _ = opened
        try:
            answer = await answer_of_p.read()
        except _RETRYABLE as e:
            attempt.abort()
            failed.append(d.prefill_instance)
            self._failed(d.prefill_instance, type(e).__name__)
            return "retry"
        finally:
            answer_of_p.release()
        if 400 <= answer_of_p.status < 500:  # the client's error: its answer
            attempt.finish(0)
            hdrs = forwardable(answer_of_p.headers)
            hdrs["x-smetric-decision"] = attempt.header
            return web.Response(body=answer, status=answer_of_p.status, headers=hdrs)
        params = kv_params_of(answer)
        if params is None:
            attempt.abort()
            failed.append(d.prefill_instance)
            self._failed(d.prefill_instance, "no_kv_transfer_params")
            return "retry"
        self._succeeded(d.prefill_instance)
        pd.on_prefilled(rid)
        return await self._post(attempt, PATHS[req.endpoint], decode_body(original, params), headers, failed)

    async def _post(
        self, attempt: _Attempt, path: str, body: bytes, headers: Mapping[str, str], failed: list[str]
    ) -> tuple[_Attempt, aiohttp.ClientResponse, float] | Literal["retry"]:
        """POSTs an attempt's body; a connection error or a 5xx aborts it and asks for a retry."""
        assert self._client is not None
        t0 = time.perf_counter()
        url = attempt.instance
        try:
            upstream = await self._client.post(url + path, data=body, headers=headers)
        except _RETRYABLE as e:
            attempt.abort()
            failed.append(url)
            self._failed(url, type(e).__name__)
            return "retry"
        except BaseException:
            attempt.abort()
            raise
        if upstream.status >= 500:
            attempt.abort()
            failed.append(url)
            self._failed(url, f"http_{upstream.status}")
            upstream.release()
            return "retry"
        return attempt, upstream, t0

    async def _whole(
        self,
        upstream: aiohttp.ClientResponse,
        attempt: _Attempt,
        t0: float,
        partial: web.StreamResponse | None,
    ) -> web.StreamResponse | tuple[str, _Sse | None, web.StreamResponse | None]:
        try:
            data = await upstream.read()
        except _RETRYABLE as e:
            attempt.abort()
            return (type(e).__name__, None, partial)
        self.telemetry.first_byte_s.observe(time.perf_counter() - t0)
        attempt.first_byte()
        attempt.finish(_completion_tokens(data) if upstream.status == 200 else 0)
        headers = forwardable(upstream.headers)
        headers["x-smetric-decision"] = attempt.header
        return web.Response(body=data, status=upstream.status, headers=headers)

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        attempt: _Attempt,
        t0: float,
        req: OpenAIRequest,
        stream: _Sse | None,
        response: web.StreamResponse | None,
    ) -> web.StreamResponse | tuple[str, _Sse | None, web.StreamResponse | None]:
        """Relays an event stream. A continuation (``response`` given) drops its opening role chunk
        and is forwarded event by event; a first attempt chunk by chunk, as the bytes arrive."""
        continuation = response is not None
        sse = stream or _Sse(chat=req.endpoint == "chat", keep=self.config.resume_streams)
        before = sse.tokens
        skip_role = continuation and req.endpoint == "chat"
        try:
            while True:
                try:
                    async with asyncio.timeout(self.config.idle_timeout_s):
                        chunk = await upstream.content.readany()
                except _RETRYABLE as e:
                    attempt.abort()
                    if sse.finished:  # the answer was complete; only the end marker was lost
                        break
                    return (type(e).__name__, sse, response)
                if not chunk:
                    if not sse.done and not sse.finished:
                        attempt.abort()
                        return ("stream_cut", sse, response)
                    break
                if response is None:
                    self.telemetry.first_byte_s.observe(time.perf_counter() - t0)
                    headers = forwardable(upstream.headers)
                    headers["x-smetric-decision"] = attempt.header
                    response = web.StreamResponse(status=upstream.status, headers=headers)
                    await response.prepare(request)
                    request[_STREAM_KEY] = response  # for _handle, should the request time out
                attempt.first_byte()
                events = sse.feed(chunk)
                if not continuation:
                    await response.write(chunk)
                    continue
                out = []
                for event in events:
                    if skip_role and event.startswith(b"data:") and _is_role_only(event):
                        skip_role = False
                        sse.forget(event)
                        continue
                    skip_role = False
                    out.append(event + b"\n\n")
                if out:
                    await response.write(b"".join(out))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            attempt.abort()  # the client went away: close the upstream request with it
            upstream.close()
            assert response is not None
            return response
        if response is None:  # an empty 200 stream
            response = web.StreamResponse(status=upstream.status)
            await response.prepare(request)
        if not sse.done:
            await response.write(b"data: [DONE]\n\n")
        attempt.finish(max(0, sse.tokens - before))
        await response.write_eof()
        return response

    def _resume(self, req: OpenAIRequest, raw: bytes, sse: _Sse) -> tuple[OpenAIRequest, bytes, RoutingTokens] | None:
        """The continuation of a cut stream (the request, its body, its tokens), or None when it
        cannot be continued."""
        if not self.config.resume_streams:
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if body.get("n", 1) != 1:
            return None
        text, used = sse.text_and_tokens()
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                body[key] = max(1, body[key] - used)
        if req.endpoint == "chat":
            assert req.messages is not None
            messages = [*req.messages, {"role": "assistant", "content": text}]
            body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
            new = dataclasses.replace(req, messages=messages, continue_final_message=True, add_generation_prompt=False)
        elif req.prompt_text is not None:
            body["prompt"] = req.prompt_text + text
            new = dataclasses.replace(req, prompt_text=body["prompt"])
        else:
            return None  # token-id prompts: the generated ids are not in the stream
        return new, json.dumps(body).encode(), self.tokens.routing_tokens(new)

    async def _end_cut_stream(
        self, response: web.StreamResponse, message: str = "the stream was cut and could not be continued"
    ) -> web.StreamResponse:
        err = {
            "error": {
                "message": message,
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            }
        }
        await response.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response


def _pd_families(stats: Mapping[str, Any]) -> list[str]:
    """The PD router's counters (``PdRouter.stats()``) in the text format."""
    from smetric.metrics import _family

    lines: list[str] = []
    for key, kind, help_text in (
        ("routed", "counter", "PD decisions."),
        ("transfer_tokens", "counter", "Prompt tokens the decisions send from prefill to decode instances."),
        ("in_flight", "gauge", "PD requests routed and not finished."),
        ("unknown_request_events", "counter", "PD lifecycle calls for unknown request ids."),
    ):
        name = f"smetric_pd_{key}" + ("_total" if kind == "counter" and not key.endswith("_total") else "")
        lines += _family(name, kind, help_text, [({}, float(stats[key]))])
    for field in ("batch_size", "reserved_blocks", "pulling", "kv_usage"):
        lines += _family(
            f"smetric_pd_decode_{field}",
            "gauge",
            f"Decode instance {field.replace('_', ' ')} (the PD router's view).",
            [({"instance": url}, float(d[field])) for url, d in stats["decode"].items()],
        )
    return lines


def _completion_tokens(data: bytes) -> int:
    try:
        usage = json.loads(data).get("usage") or {}
    except (ValueError, AttributeError):
        return 0
    n = usage.get("completion_tokens")
    return n if isinstance(n, int) and n >= 0 else 0


def _fleet_kv_capacity(instances: Sequence[InstanceConfig], timeout: float = 2.0) -> int | None:
    """The smallest GPU KV capacity (tokens) the instances report on ``/metrics``
    (``vllm:cache_config_info``), or None when none answers with it. Blocking."""
    import http.client
    import urllib.request

    from smetric.engine_load import kv_capacity_tokens

    found = []
    for inst in instances:
        url = inst.metrics_url or f"{inst.url}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                capacity = kv_capacity_tokens(r.read().decode("utf-8", errors="replace"))
        except (OSError, ValueError, http.client.HTTPException):  # an engine without it, or down
            continue
        if capacity is not None:
            found.append(capacity)
    return min(found) if found else None


def _sources_of(inst: InstanceConfig) -> list[Any]:
    """The KV-event sources of an instance (discovered, explicit, or none). Blocking."""
    if inst.kv_events == KV_EVENTS_OFF:
        return []
    try:
        from smetric.events import KvEventSource, discover_sources
    except ImportError:
        log.warning("pyzmq is not installed: no KV events (pip install 'smetric-router[events]')")
        return []
    if inst.kv_events == KV_EVENTS_DISCOVER:
        try:
            return list(discover_sources(inst.url))
        except Exception as e:  # an engine without the endpoint, or not up yet
            log.warning("no KV-event sources from %s/kv_event_sources: %s", inst.url, e)
            return []
    return [KvEventSource(inst.url, inst.kv_events, replay_endpoint=inst.kv_replay)]


async def run(
    config: ServeConfig, *, on_ready: Callable[[Proxy, int], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    """Runs the proxy until ``stop`` is set or SIGTERM/SIGINT arrives, then drains.

    ``on_ready`` gets the proxy and its bound port once it listens (``config.port`` 0: any free port).
    Draining: ``/health`` answers 503, the listening socket closes, and in-flight requests get
    up to ``drain_timeout_s`` to finish before the function returns.
    """
    proxy = await Proxy.create(config)
    await proxy.start()
    runner = web.AppRunner(
        proxy.app(),
        handler_cancellation=True,
        access_log=None,
        max_line_size=config.max_header_bytes,
        max_field_size=config.max_header_bytes,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            break
    port = runner.addresses[0][1]
    log.info(
        "smetric serve on http://%s:%s: %d instances, policy %s", config.host, port, len(proxy.instances), config.policy
    )
    if on_ready is not None:
        on_ready(proxy, port)
    try:
        await stop.wait()
        proxy.draining = True
        await site.stop()
        try:
            await asyncio.wait_for(proxy.idle.wait(), config.drain_timeout_s)
        except TimeoutError:
            log.warning("drain timeout: %d requests still in flight", proxy.in_flight)
    finally:
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
        """The running proxy (read its router and telemetry; mutate only from its loop)."""
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
