"""The rest of vLLM's surface, forwarded as it is: ``POST /v1/embeddings``, ``/tokenize``,
``/detokenize``, ``/v1/rerank``, ``/v1/score``, ``/pooling`` and ``GET /v1/models/{id}`` — and a
404 in OpenAI's shape for any other path.

None of these leaves KV state behind that a later request could reuse, so they are not routed:
the least-loaded eligible instance serves them (``Prepared.routed`` false), with no decision and
no KV accounting; failover still retries a refused attempt elsewhere. The body is forwarded byte
for byte; only ``model`` is read (to pick instances serving it). Errors: OpenAI's shape.
May import: :mod:`smetric.serve.apis.base` and what it may, and ``smetric._core`` (the shared wording).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from smetric._core import SHARED_NO_ROUTE
from smetric.serve.apis.base import Api, Prepared, Route, StreamState
from smetric.serve.errors import ProxyError
from smetric.serve.request import RequestError
from smetric.serve.session import TurnCounter
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["FORWARDED", "PassThroughApi", "PassThroughRequest"]

FORWARDED: tuple[Route, ...] = (
    Route("POST", "/v1/embeddings"),
    Route("POST", "/tokenize"),
    Route("POST", "/detokenize"),
    Route("POST", "/v1/rerank"),
    Route("POST", "/v1/score"),
    Route("POST", "/pooling"),
    Route("GET", "/v1/models/{model_id}"),
)
"""The vLLM routes forwarded unrouted."""
UNKNOWN = Route("*", "/{path:.*}")
"""Every other path: a 404 in OpenAI's shape (registered last)."""


@dataclass(frozen=True, slots=True)
class PassThroughRequest:
    method: str
    path: str
    """The engine's path, with the query string."""
    model: str | None


class _Whole(StreamState):
    """An event stream relayed as it comes (nothing to scan: it is complete when it ends)."""

    done = False
    finished = True

    def feed(self, chunk: bytes) -> list[bytes]:
        return []

    @property
    def tokens(self) -> int:
        return 0

    def drops_on_continuation(self, event: bytes) -> bool:
        return False

    def forget(self, event: bytes) -> None:
        return None

    @property
    def end_marker(self) -> bytes:
        return b""


class PassThroughApi(Api[PassThroughRequest]):
    name = "passthrough"
    path = "/v1/embeddings"

    def routes(self) -> tuple[Route, ...]:
        return (*FORWARDED, UNKNOWN)

    def parse(self, raw: bytes) -> PassThroughRequest:
        return PassThroughRequest("POST", self.path, _model_of(raw))

    def parse_route(self, raw: bytes, route: Route, params: Mapping[str, str], query: str) -> PassThroughRequest:
        if route == UNKNOWN:
            path = "/" + params.get("path", "")
            message = SHARED_NO_ROUTE.replace("{path}", path)
            raise RequestError(message, status=404, type="NotFoundError", code="not_found")
        suffix = f"?{query}" if query else ""
        if "model_id" in params:
            return PassThroughRequest("GET", f"/v1/models/{params['model_id']}{suffix}", None)
        return PassThroughRequest(route.method, route.path + suffix, _model_of(raw))

    def model(self, request: PassThroughRequest) -> str | None:
        return request.model

    def tokenizes(self, source: TokenSource, request: PassThroughRequest) -> bool:
        return False

    def routing_tokens(self, source: TokenSource, request: PassThroughRequest) -> RoutingTokens:
        return RoutingTokens(array("I"), 0, source.kind)

    def prepare(
        self,
        request: PassThroughRequest,
        raw: bytes,
        tokens: RoutingTokens,
        headers: Mapping[str, str],
        sessions: TurnCounter,
    ) -> Prepared[PassThroughRequest]:
        return Prepared(request, request.path, raw, tokens, None, request.model, None, None, request.method, False)

    def stream(self, *, keep: bool) -> StreamState:
        return _Whole()

    def output_tokens(self, answer: bytes) -> int:
        return 0

    def continuation(
        self, prepared: Prepared[PassThroughRequest], state: StreamState, source: TokenSource
    ) -> Prepared[PassThroughRequest] | None:
        return None

    def reject(self, error: RequestError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def fail(self, error: ProxyError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def stream_failure(self, error: ProxyError) -> bytes:
        return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


def _model_of(raw: bytes) -> str | None:
    """The body's ``model`` when it is a JSON object naming one (the engine judges the rest)."""
    if not raw.lstrip().startswith(b"{"):
        return None
    try:
        model = json.loads(raw).get("model")
    except (ValueError, UnicodeDecodeError):
        return None
    return model if isinstance(model, str) else None
