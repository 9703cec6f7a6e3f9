"""The proxy's HTTP server under hostile clients: what aiohttp answers by itself, and the
connection limits aiohttp does not have.

aiohttp answers some requests before any handler runs: a malformed HTTP message (400), a header
over the size limit (431 or 400), and it logs each with an ERROR traceback and answers in
``text/plain`` with the parser's message — which quotes the client's bytes. It also has no read
timeout on a request head and no bound on open connections. :class:`GuardedRunner` (an
``AppRunner`` whose protocol is :class:`_GuardedHandler`) closes those gaps:

* **errors**: every answer aiohttp would make itself goes through ``render`` — the app's hook,
  which picks the API adapter's error shape by path (OpenAI's for a path no adapter owns; for a
  head that did not parse, the path of its request line when one was read, used only to pick
  the shape) — with a fixed message per status (never the client's bytes); a request line or
  field over the parser's limit is a 431, as at the gateway (aiohttp says 400); client garbage is counted
  (``on_client_error(kind)``) and logged at DEBUG, while a 500 (the proxy's own bug) keeps its
  traceback;
* **head timeout**: once the first byte of a request head arrives, the whole head must arrive
  within ``head_timeout_s`` or the connection is closed (an idle keep-alive connection is closed
  after ``keepalive_timeout_s``; a body's own read timeout is the app's);
* **connection bound**: beyond ``max_connections`` open connections, a new one gets a 503 in
  OpenAI's shape (with ``Retry-After``, as the admission queue's refusals) and is closed before
  anything of it is read;
* **early answers**: a body left unread (a 408, 413, 415) is drained for at most
  :data:`LINGERING_S` before the connection closes;
* **no version banner**: ``Server: smetric``.

aiohttp's handler class is reached through its ``Server`` (``__call__`` builds the per-connection
protocol); the subclass touches only ``_request_count`` (messages parsed on the connection) and
``_handle_request`` of aiohttp's ``RequestHandler`` (both in aiohttp 3.9–3.14). The proxy's tests
(``tests/serve/test_hostile_http.py``) fail if a new aiohttp changes them.

Invariants: no client byte is ever echoed in an error; nothing is logged above DEBUG for client
input. O(1) per connection and per data chunk. May import: ``aiohttp``, and ``smetric._core``
for the wording the gateway and the app share.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from smetric._core import SHARED_WRONG_METHOD

__all__ = ["SERVER_HEADER", "ConnectionLimits", "ErrorRenderer", "GuardedRunner", "status_message"]

log = logging.getLogger("smetric.serve")

SERVER_HEADER = "smetric"
"""The ``Server`` header of every answer (no Python or aiohttp version)."""

LINGERING_S = 1.0
"""How long the rest of an unread body is drained after an early answer (a 408, 413, 415) before
the connection closes — so the client can read that answer — instead of aiohttp's 10 s."""

ErrorRenderer = Callable[[str | None, int, str], web.StreamResponse]
"""``(path or None, status, message)`` → the answer in the error shape of the path's API."""

_MESSAGES = {
    400: "malformed HTTP request",
    404: "no such endpoint",
    405: SHARED_WRONG_METHOD,
    408: "the request was not received in time",
    413: "the request is too large",
    414: "the request line is too long",
    415: "unsupported media type",
    431: "request header fields too large",
}


def status_message(status: int) -> str:
    """A fixed message for an error status the HTTP layer answers (never the client's bytes)."""
    if status in _MESSAGES:
        return _MESSAGES[status]
    try:
        return HTTPStatus(status).phrase.lower()
    except ValueError:
        return "request refused"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits of one server (``ServeConfig`` holds their defaults)."""

    head_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int
    retry_after_s: int
    """The ``Retry-After`` of the 503 past ``max_connections`` (the admission queue's own)."""


class _GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol, with the guards of the module docs."""

    def __init__(
        self,
        manager: web.Server,
        *,
        render: ErrorRenderer,
        on_client_error: Callable[[str], None],
        limits: ConnectionLimits,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._render = render
        self._on_client_error = on_client_error
        self._limits = limits
        self._manager_ref = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._handled = 0
        """Messages of this connection whose handling ended (``_request_count`` counts those parsed)."""
        self._head_path: str | None = None
        """The path of the request line of the head being read, when its first bytes had one:
        it picks the error shape of a head that does not parse, and is never echoed."""

    @property
    def _busy(self) -> bool:
        """A parsed request of this connection is queued or being handled (its body is the app's
        to time), so the bytes arriving now are not a head the client is slow to send."""
        return self._request_count != self._handled

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self._manager_ref.connections) > self._limits.max_connections:
            self._on_client_error("connection_limit")
            body = json.dumps(
                {
                    "error": {
                        "message": "too many open connections to the proxy",
                        "type": "ServiceUnavailableError",
                        "param": None,
                        "code": 503,
                    }
                }
            ).encode()
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {self._limits.retry_after_s}\r\n"
                f"Connection: close\r\nServer: {SERVER_HEADER}\r\n\r\n"
            )
            writable = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass
            writable.write(head.encode() + body)
            self.force_close()
            writable.close()

    def data_received(self, data: bytes) -> None:
        if data and not self._busy and self._head_timer is None:
            self._head_timer = self._loop.call_later(self._limits.head_timeout_s, self._head_late)
            self._head_path = _target_path(data)
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:  # a head (or a parser error) is complete
            self._cancel_head_timer()

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._busy:
            self._on_client_error("head_timeout")
            log.debug("closed a connection whose request head took over %s s", self._limits.head_timeout_s)
            self.force_close()
            if self.transport is not None:
                self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._handled += 1  # once all are handled, the next byte starts a new head

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # the proxy's own failure: keep aiohttp's log (and traceback)
            self.log_exception("error handling a request", exc_info=exc)
            if request.writer.output_size > 0:
                raise ConnectionError("the answer had started; the connection is closed")
            path = None
        else:
            if isinstance(exc, LineTooLong):
                status = 431  # a line or a field over the limit, as the gateway answers it
            self._on_client_error(f"http_{status}")
            log.debug("refused a malformed request (%d): %s", status, type(exc).__name__ if exc else "")
            path = self._head_path  # the head did not parse: its path only picks the shape
        response = self._render(path, status, status_message(status))
        response.headers["Server"] = SERVER_HEADER
        response.force_close()
        return response


def _target_path(data: bytes) -> str | None:
    """The path of the request line ``data`` begins with (``METHOD /path…``), else None."""
    parts = data[:512].split(b" ", 2)
    if len(parts) < 3 or not parts[1].startswith(b"/"):
        return None
    return parts[1].split(b"?", 1)[0].decode("latin-1")


class _GuardedServer(web.Server):
    """aiohttp's ``Server`` building :class:`_GuardedHandler` protocols."""

    guard_kwargs: dict[str, Any]

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs, **self.guard_kwargs)


class GuardedRunner(web.AppRunner):
    """An ``AppRunner`` whose connections are guarded (see the module docs)."""

    def __init__(
        self,
        app: web.Application,
        *,
        render: ErrorRenderer,
        on_client_error: Callable[[str], None],
        limits: ConnectionLimits,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            app,
            keepalive_timeout=limits.keepalive_timeout_s,
            lingering_time=LINGERING_S,
            auto_decompress=False,
            **kwargs,
        )
        self._guard_kwargs = {"render": render, "on_client_error": on_client_error, "limits": limits}

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # same layout; only the protocol factory differs
        assert isinstance(server, _GuardedServer)
        server.guard_kwargs = self._guard_kwargs
        return server
