"""The ``python-protocol`` candidate of ``benches/proxy_data_plane.py --apis``: the leanest Python
data plane we could write, to measure what Python costs without an HTTP framework.

No aiohttp on either side: uvloop's transports and protocols, and httptools (the C HTTP/1.1
parser uvicorn uses) for the client's requests and the engines' answers. Per request it reads
the body, parses it with :func:`json.loads`, routes a body with token ids (``prompt``) with the
Rust core (``smetric.Router.route``) and sends any other to the engines in turn (it has no
renderer), writes the request on a kept-alive connection to the engine, and relays the answer as
it arrives (re-framed as chunked: the client may not get the engine's ``Content-Length``), with
``on_prefilled`` at the first body bytes and ``on_finished`` at the end.

What it does not have — and a product needs — is the measure of what it leaves out: no limits on
heads or bodies, no timeouts, no failover, no admission, no keys, no headers but
``Content-Type``, no metrics. It answers ``GET`` with an empty 200 (the bench's readiness probe).
A measuring instrument, never the product.

With ``--adapters`` the JSON parse and the route are ``smetric serve``'s own per-request Python
instead (:class:`Adapters`): the ``python-protocol+adapters`` candidate, which prices the
proxy's own work apart from its HTTP stack.

    python benches/protocol_proxy.py [--adapters] PORT ENGINE_URL...
    python benches/protocol_proxy.py --costs    # the mean cost of each of Adapters' stages, per API
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop

from smetric import Router
from smetric.serve.apis.base import StreamState


@dataclass(slots=True)
class Plan:
    """Where one request goes and what its relay reports: the planner's whole decision."""

    instance: str
    body: bytes
    first_byte: Callable[[], object]
    finish: Callable[[], object]
    header: bytes = b""
    """Extra header lines for the client's answer (each ending in CRLF)."""
    stream: StreamState | None = None
    """The API's stream scanner, fed every chunk (``--adapters``, streamed requests)."""


class Minimal:
    """The minimal proxy's planner: ``json.loads``, a body with token ids routed, any other
    body to the engines in turn."""

    def __init__(self, engines: Sequence[str]) -> None:
        self.router = Router(list(engines), policy="smetric")
        self.turn = itertools.cycle(engines)

    def plan(self, path: bytes, raw: bytes) -> Plan:
        prompt = json.loads(raw).get("prompt")
        if not isinstance(prompt, list):
            return Plan(next(self.turn), raw, _nothing, _nothing)
        d = self.router.route(prompt)
        rid = d.request_id
        return Plan(d.instance, raw, lambda: self.router.on_prefilled(rid), lambda: self.router.on_finished(rid))


class Adapters:
    """``smetric serve``'s own per-request Python on this HTTP layer (``--adapters``): the API's
    adapter parses the body, renders it into approximate routing tokens and prepares it; the
    backend's ``decide`` routes it (counting the decision); the attempt's decision header and
    lifecycle; a stream's chunks scanned by the API's stream state. What the proxy does beyond
    that (admission, failover, the request id, usage, the decision log) is left out."""

    def __init__(self, engines: Sequence[str]) -> None:
        from smetric._core import SessionTable
        from smetric.serve.apis import APIS
        from smetric.serve.config import InstanceConfig, ServeConfig
        from smetric.serve.telemetry import ProxyTelemetry
        from smetric.serve.tokens import TokenConfig, TokenSource

        config = ServeConfig(
            instances=tuple(InstanceConfig(url=u) for u in engines), tokens=TokenConfig(mode="approximate")
        )
        self.router = Router(list(engines), policy="smetric")
        self.tokens = TokenSource(config.tokens)
        self.sessions = SessionTable()
        self.telemetry = ProxyTelemetry()
        self.apis = {api.path: api.bind(config) for api in APIS}

    def plan(self, path: bytes, raw: bytes, lap: Callable[[str], object] = lambda _: None) -> Plan:
        """The request's plan; ``lap(stage)`` is called as each stage ends (:func:`stage_costs`)."""
        from smetric.serve.backends.base import decide
        from smetric.serve.backends.colocated import decision_header

        api = self.apis[path.decode()]
        request = api.parse(raw)
        lap("parse")
        tokens = api.routing_tokens(self.tokens, request)
        lap("routing tokens")
        prepared = api.prepare(request, raw, tokens, {}, self.sessions)
        lap("prepare")
        d = decide(self.router.route, prepared, [], self.telemetry)
        lap("route")
        assert d is not None
        rid, router = d.request_id, self.router
        header = b"x-smetric-decision: %s\r\n" % decision_header(d, attempt=1, source=tokens.source).encode()
        stream = api.stream(keep=True) if getattr(request, "stream", False) else None
        if stream is not None:
            stream.begin(d.instance)
        return Plan(
            d.instance, prepared.body, lambda: router.on_prefilled(rid), lambda: router.on_finished(rid), header, stream
        )


class Stopwatch:
    """Seconds per stage, summed: each call charges the time since the last to its stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


def stage_costs(requests: int = 300) -> None:
    """Prints what :meth:`Adapters.plan`'s stages cost per API, as the mean over the bench's
    ``requests`` distinct 32K-token conversations (``benches/proxy_data_plane.py``'s bodies)."""
    import proxy_data_plane as bench

    adapters = Adapters(["http://a", "http://b", "http://c", "http://d"])
    chats = bench.chat_bodies(requests, 32_768, False)
    apis = {
        "/v1/chat/completions": chats,
        "/v1/messages": bench.messages_bodies(chats),
        "/v1/responses": bench.responses_bodies(chats),
    }
    for path, bodies in apis.items():
        watch = Stopwatch()
        for raw in bodies:
            watch.last = time.perf_counter()
            adapters.plan(path.encode(), raw, watch).finish()
        costs = ", ".join(f"{stage} {total / len(bodies) * 1e6:.0f} µs" for stage, total in watch.seconds.items())
        print(f"{path}: {costs}")


def _nothing() -> None:
    pass


class Relay:
    """One answer on its way from an engine to a client's connection (chunked framing)."""

    def __init__(self, client: asyncio.Transport, plan: Plan) -> None:
        self.client = client
        self.plan = plan
        self.started = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def head(self, status: int, content_type: bytes) -> None:
        head = b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\n%sTransfer-Encoding: chunked\r\n\r\n"
        self.client.write(head % (status, content_type, self.plan.header))

    def body(self, data: bytes) -> None:
        if not self.started:
            self.plan.first_byte()
        self.started = True
        stream = self.plan.stream
        if stream is not None:
            data = stream.outgoing(data, stream.feed(data))
        self.client.writelines((b"%x\r\n" % len(data), data, b"\r\n"))

    def end(self) -> None:
        self.client.write(b"0\r\n\r\n")
        self.plan.finish()
        self.finished.set_result(None)

    def fail(self) -> None:
        self.client.close()
        self.plan.finish()
        if not self.finished.done():
            self.finished.set_result(None)


class EngineConnection(asyncio.Protocol):
    """A kept-alive connection to one engine, carrying one answer at a time."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.relay: Relay | None = None
        self.content_type = b"application/json"
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass, same API

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.fail()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        assert self.relay is not None
        self.relay.head(self.parser.get_status_code(), self.content_type)

    def on_body(self, body: bytes) -> None:
        assert self.relay is not None
        self.relay.body(body)

    def on_message_complete(self) -> None:
        relay, self.relay = self.relay, None
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.idle.append(self)
        elif self.transport is not None:
            self.transport.close()
        assert relay is not None
        relay.end()


class EnginePool:
    """Idle kept-alive connections to one engine; a new one when none is idle."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.host_header = f"{self.host}:{self.port}".encode()
        self.idle: deque[EngineConnection] = deque()

    async def send(self, path: bytes, body: bytes, relay: Relay) -> None:
        connection = None
        while self.idle and connection is None:
            candidate = self.idle.pop()
            connection = None if candidate.closed else candidate
        if connection is None:
            loop = asyncio.get_running_loop()
            _, connection = await loop.create_connection(lambda: EngineConnection(self), self.host, self.port)
        assert connection.transport is not None
        connection.relay = relay
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        connection.transport.writelines((head % (path, self.host_header, len(body)), body))


class ClientConnection(asyncio.Protocol):
    """A client's connection: requests parsed as they arrive, answered in order."""

    def __init__(self, planner: Minimal | Adapters, pools: dict[str, EnginePool]) -> None:
        self.planner, self.pools = planner, pools
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.parts: list[bytes] = []
        self.requests: asyncio.Queue[tuple[bytes, bytes]] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.worker: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass, same API
        self.worker = asyncio.get_running_loop().create_task(self.serve(self.transport))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.worker is not None:
            self.worker.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.requests.put_nowait((self.url, b"".join(self.parts)))
        self.url, self.parts = b"", []

    async def serve(self, transport: asyncio.Transport) -> None:
        while True:
            path, raw = await self.requests.get()
            if not raw:  # the bench's readiness probe (a GET)
                transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                continue
            plan = self.planner.plan(path, raw)
            relay = Relay(transport, plan)
            await self.pools[plan.instance].send(path, plan.body, relay)
            await relay.finished


def main(port: int, engines: Sequence[str], *, adapters: bool = False) -> None:
    """Serves on ``127.0.0.1:port`` in front of ``engines`` until killed."""

    async def run() -> None:
        planner = Adapters(engines) if adapters else Minimal(engines)
        pools = {url: EnginePool(url) for url in engines}
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: ClientConnection(planner, pools), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(run())


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--costs"]:
        stage_costs()
        sys.exit()
    with_adapters = args[:1] == ["--adapters"]
    main(int(args[with_adapters]), args[with_adapters + 1 :], adapters=with_adapters)
