"""The interface of an API adapter: what one client API (``POST /v1/chat/completions``, …) owns on
a request's path, so that each API is one module and the rest of the proxy never branches on it.

An adapter owns, for its API:

* **body parsing**: :meth:`Api.parse` validates the bytes into the API's own request type ``R``
  (a :class:`~smetric.serve.request.RequestError` for bad input);
* **routing tokens and turn**: :meth:`Api.routing_tokens` (with the configured
  :class:`~smetric.serve.tokens.TokenSource`), :meth:`Api.turn` (session hints where the body has
  no roles), and what the router reads of the request, gathered in a :class:`Prepared`;
* **stream format**: :meth:`Api.stream` gives the scanner of its event stream
  (:class:`StreamState`: end marker, finish, output tokens, what a continuation's opening drops)
  and :meth:`Api.continuation` the request that continues a cut stream on another instance;
* **error shape**: :meth:`Api.reject`, :meth:`Api.fail` and :meth:`Api.stream_failure` render
  the proxy's own errors as the API's clients expect them.

The backends (:mod:`smetric.serve.backends`) see only :class:`Prepared`;
the relay (:mod:`smetric.serve.relay`) only :class:`StreamState`. A new API (Anthropic Messages,
OpenAI Responses, a pass-through) is one module implementing :class:`Api` plus one line in
:data:`smetric.serve.apis.APIS`.

Invariants: a :class:`Prepared` is immutable — a continuation is a new one; ``Prepared.body`` is
what is forwarded, byte for byte. May import: :mod:`smetric.serve.errors`, ``.request``,
``.session``, ``.tokens``, ``.config``, ``aiohttp.web``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiohttp import web

from smetric.serve.config import ServeConfig
from smetric.serve.errors import ProxyError
from smetric.serve.request import RequestError
from smetric.serve.session import TurnCounter
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["Api", "Prepared", "R", "Route", "StreamState", "answer_count", "usage_count"]

R = TypeVar("R")
"""An API's parsed request type."""


def usage_count(usage: object, *keys: str) -> int | None:
    """The count at ``keys`` inside a usage object (``usage_count(u, "prompt_tokens_details",
    "cached_tokens")``), or None when a level is missing or the value is not a count (a
    non-negative int, never a bool): the engine's usage is read, never trusted."""
    for key in keys:
        usage = usage.get(key) if isinstance(usage, dict) else None
    return usage if isinstance(usage, int) and not isinstance(usage, bool) and usage >= 0 else None


def answer_count(answer: bytes, *keys: str) -> int | None:
    """:func:`usage_count` at ``keys`` of a whole JSON answer, or None when it is not JSON."""
    try:
        return usage_count(json.loads(answer), *keys)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Prepared(Generic[R]):
    """A request ready to route: its API's parsed form, the bytes to forward, and what the
    router reads (the same for every API)."""

    request: R
    path: str
    """The engine's path the body is POSTed to."""
    body: bytes
    """Forwarded unchanged (a continuation's is rewritten by its adapter)."""
    tokens: RoutingTokens
    turn: int | None
    """The turn from a session hint; None: the router reads it from ``messages`` or its index."""
    model: str | None
    messages: list[dict[str, Any]] | None
    """The conversation (chat roles tell the router the turn), or None."""
    namespace: str | None
    """vLLM's ``cache_salt``: requests in different namespaces share no cached blocks."""
    method: str = "POST"
    """The HTTP method the engine is called with."""
    routed: bool = True
    """False: no routing decision and no KV accounting — the least-loaded eligible instance."""
    pin: str | None = None
    """The instance tag (:func:`smetric.serve.pinning.instance_tag`) of the one instance that
    can serve it (it holds state the request names, e.g. a stored response), or None."""
    prefill_overrides: Mapping[str, Any] | None = None
    """Body fields a PD prefill-only copy sets besides the generic ones (Responses: its own
    output limit ``max_output_tokens`` and ``store: false``), so the PD backend needs no
    knowledge of the API."""

    hide_usage: bool = False
    """The proxy asked the engine for a stream's usage (the realized hit) that the client did not
    ask for: the usage event is kept from the client (:meth:`StreamState.shown`)."""
    kv_transfer_params: bool | None = None
    """Whether ``body`` has a top-level ``kv_transfer_params`` (which the co-located backend
    removes), as the adapter's parse found it; None: not known, the backend looks in the bytes."""
    previous_instance: str | None = None
    """The instance the client's llm-d session cookie names (``--policy llmd_session_affinity``
    only: :func:`smetric.serve.session.affinity_instance`), or None."""
    session_key: str | None = None
    """The client's session header (vllm-router's hash policies only:
    :data:`smetric.serve.session.HASH_POLICIES`), or None: they then hash the prompt."""
    turn_key: str | None = None
    """The session key the request's turn was counted under in the session table (a hinted
    request without roles), or None: released with the session (``docs/serve.md``, "Session life")."""
    group_instance: str | None = None
    """A sub-agent's first request: the instance its parent session was answered on last, which
    the parent rule may start it on (:meth:`smetric.serve.failover.Failover.serve`), or None."""
    ends_session: bool = False
    """The request is its session's last (``x-session-end: true``): its answer expires llm-d's
    session cookie instead of setting it."""


@dataclass(frozen=True, slots=True)
class Route:
    """One route an adapter serves: an HTTP method and an aiohttp path pattern (``{name}`` is
    a path parameter)."""

    method: str
    path: str


class StreamState(ABC):
    """An API's event stream as it is relayed: split into events, scanned for what accounting and
    continuation need. Relaying must stay O(chunk bytes); decoding is left to continuation."""

    done: bool
    """The API's end marker arrived."""
    finished: bool
    """The answer is complete (a finish reason arrived), even if the end marker is lost."""
    cached_tokens: int | None = None
    """Prompt tokens the engine served from its cache, when the stream's usage said (the
    realized hit of the decision log); the API's scanner sets it."""
    hide_usage: bool = False
    """Set from :attr:`Prepared.hide_usage`: the relay then writes only the events :meth:`shown`
    lets through (event by event instead of chunk by chunk)."""

    def shown(self, event: bytes) -> bool:
        """Whether a fed event goes to the client when ``hide_usage`` is set (default: all)."""
        return True

    @abstractmethod
    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete events in what is pending plus ``chunk`` (each without its separator)."""

    @property
    @abstractmethod
    def tokens(self) -> int:
        """Output tokens so far."""

    @abstractmethod
    def drops_on_continuation(self, event: bytes) -> bool:
        """Whether ``event``, the first of a continuation, repeats what the client already has
        (it is then dropped and :meth:`forget` is called)."""

    @abstractmethod
    def forget(self, event: bytes) -> None:
        """Removes a fed event from the counts."""

    @property
    @abstractmethod
    def end_marker(self) -> bytes:
        """What ends a stream whose upstream ended without its marker (written when not ``done``)."""

    def begin(self, instance: str) -> None:
        """An attempt at ``instance`` starts relaying into this stream (default: nothing)."""
        return None

    def outgoing(self, chunk: bytes, events: list[bytes]) -> bytes:
        """What the client receives for ``chunk``, whose complete events :meth:`feed` returned
        as ``events`` (default: the chunk as it came; an API that rewrites events sends those)."""
        return chunk


class Api(ABC, Generic[R]):
    """One client API (see the module docs)."""

    name: str
    """Short name (logs, metrics)."""
    path: str
    """The path clients POST to, and the engines' path for it."""

    def bind(self, config: ServeConfig) -> Api[R]:
        """The adapter one proxy uses, configured by ``config`` (default: this one)."""
        return self

    def routes(self) -> tuple[Route, ...]:
        """The routes this adapter serves (default: ``POST`` :attr:`path`)."""
        return (Route("POST", self.path),)

    @abstractmethod
    def parse(self, raw: bytes) -> R:
        """Validates a body. Raises :class:`RequestError`."""

    def parse_route(self, raw: bytes, route: Route, params: Mapping[str, str], query: str) -> R:
        """Validates a request to ``route`` with its path parameters and query string (default:
        :meth:`parse` of the body). Raises :class:`RequestError`."""
        return self.parse(raw)

    @abstractmethod
    def model(self, request: R) -> str | None:
        """The model the request names (checked against the fleet's models before routing)."""

    @abstractmethod
    def tokenizes(self, source: TokenSource, request: R) -> bool:
        """Whether :meth:`routing_tokens` runs a BPE tokenizer (then it runs off the event loop)."""

    @abstractmethod
    def routing_tokens(self, source: TokenSource, request: R) -> RoutingTokens:
        """The ids the request is routed on. Raises :class:`RequestError`."""

    @abstractmethod
    def prepare(
        self, request: R, raw: bytes, tokens: RoutingTokens, headers: Mapping[str, str], sessions: TurnCounter
    ) -> Prepared[R]:
        """The request ready to route (its turn counted in ``sessions`` when a hint gives it)."""

    @abstractmethod
    def stream(self, *, keep: bool) -> StreamState:
        """A scanner of the API's event stream; ``keep``: keep the events for a continuation."""

    def relay_body(self, answer: bytes, instance: str) -> bytes:
        """The whole answer from ``instance`` as the client receives it (default: unchanged)."""
        return answer

    @abstractmethod
    def output_tokens(self, answer: bytes) -> int:
        """Output tokens of a whole (non-streamed) 200 answer (0 when it does not say)."""

    def realized_hit(self, answer: bytes) -> int | None:
        """Prompt tokens the engine served from its cache, read from a whole 200 answer's usage
        (the decision log's realized hit), or None when the answer does not say. The default
        knows no usage format: an adapter whose API reports cached tokens overrides it."""
        return None

    @abstractmethod
    def continuation(self, prepared: Prepared[R], state: StreamState, source: TokenSource) -> Prepared[R] | None:
        """The request that continues a stream cut after ``state``, or None when it cannot be
        continued faithfully."""

    @abstractmethod
    def reject(self, error: RequestError) -> web.Response:
        """The answer to a request the proxy refuses (bad input, unknown model, too large)."""

    @abstractmethod
    def fail(self, error: ProxyError) -> web.Response:
        """The answer when the proxy itself fails the request before any byte was sent."""

    @abstractmethod
    def stream_failure(self, error: ProxyError) -> bytes:
        """The bytes that end a started stream with ``error`` (its end marker included)."""
