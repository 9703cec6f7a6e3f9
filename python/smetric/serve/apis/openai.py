"""What OpenAI's two completion APIs share: the error shape, the ``data:`` event stream ending in
``data: [DONE]``, the body parser (:func:`smetric.serve.request.parse_request`), session hints, and
the output-token count of a whole answer. :mod:`.chat` and :mod:`.completions` add what differs:
where a stream chunk's text is, the opening chunk a continuation drops, and how a cut stream is
continued.

:class:`OpenAIStream` only scans bytes on the relay path — ``[DONE]``, a non-null
``finish_reason``, and the usage chunk (the one event it decodes) — and keeps the raw events,
decoded only when a cut stream must be continued (:meth:`OpenAIStream.text_and_pieces`): O(chunk
bytes) per chunk and no JSON work. May import: :mod:`smetric.serve.apis.base` and what it may.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from smetric.serve.apis.base import Api, Prepared, StreamState
from smetric.serve.errors import ProxyError
from smetric.serve.request import Endpoint, OpenAIRequest, RequestError, parse_request
from smetric.serve.session import SessionTable, session_hint
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["OpenAIApi", "OpenAIStream"]

_DONE = b"data: [DONE]\n\n"


def _cached_tokens(usage: object) -> int | None:
    """OpenAI's ``usage.prompt_tokens_details.cached_tokens`` (vLLM fills it with
    ``--enable-prompt-tokens-details``), or None."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


_USAGE_OPTION = b'{"stream_options":{"include_usage":true},'


def _asking_for_usage(raw: bytes) -> tuple[bytes, bool]:
    """A stream's body that asks the engine for its usage (the realized hit), and whether the
    client did not ask for it itself (then its usage event is hidden). Without a
    ``stream_options`` field the option is spliced in after the opening brace (O(1) beyond one
    search); with one that lacks it, the body is re-encoded."""
    start = raw.find(b"{")
    if b'"stream_options"' not in raw and start >= 0:
        return raw[:start] + _USAGE_OPTION + raw[start + 1 :], True
    try:
        body = json.loads(raw)
    except ValueError:
        return raw, False
    options = body.get("stream_options") if isinstance(body, dict) else None
    if isinstance(options, dict) and options.get("include_usage") is True:
        return raw, False
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(body).encode(), True


class OpenAIStream(StreamState):
    """An OpenAI completion stream (``data: {chunk}`` events, ``data: [DONE]`` at the end)."""

    __slots__ = (
        "_api",
        "_events",
        "cached_tokens",
        "chunks",
        "done",
        "finished",
        "hide_usage",
        "keep",
        "output_tokens",
        "pending",
    )

    def __init__(self, api: OpenAIApi, *, keep: bool) -> None:
        self._api = api
        self.keep = keep
        self.pending = b""
        self.chunks = 0
        """Events with a ``finish_reason`` key: the choice chunks (one token each, plus chat's
        opening role chunk)."""
        self.output_tokens: int | None = None
        """``usage.completion_tokens`` when the stream carried it."""
        self.cached_tokens: int | None = None
        self.hide_usage = False
        self.finished = False
        self.done = False
        self._events: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
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
            self.cached_tokens = _cached_tokens(usage)
        if self.keep:
            self._events.append(event)

    def shown(self, event: bytes) -> bool:
        """Every event but the usage one (``choices: []`` with the token counts)."""
        return not (b'"completion_tokens"' in event and (b'"choices":[]' in event or b'"choices": []' in event))

    def forget(self, event: bytes) -> None:
        if b'"finish_reason"' in event:
            self.chunks -= 1
        if self.keep and event in self._events:
            self._events.remove(event)

    @property
    def tokens(self) -> int:
        """The usage figure when sent, else the choice chunks (less the API's opening chunks)."""
        if self.output_tokens is not None:
            return self.output_tokens
        return max(0, self.chunks - self._api.opening_chunks)

    def drops_on_continuation(self, event: bytes) -> bool:
        return event.startswith(b"data:") and self._api.is_opening_chunk(event)

    @property
    def end_marker(self) -> bytes:
        return _DONE

    def text_and_pieces(self) -> tuple[str, int]:
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
            piece = self._api.text_of(choices[0])
            if isinstance(piece, str) and piece:
                pieces.append(piece)
        return "".join(pieces), len(pieces)


class OpenAIApi(Api[OpenAIRequest]):
    """An OpenAI completion API: everything but where text lives and how a cut stream continues."""

    endpoint: Endpoint
    opening_chunks: int
    """Choice chunks that open a stream without a token (chat's role chunk)."""

    def parse(self, raw: bytes) -> OpenAIRequest:
        return parse_request(raw, self.endpoint)

    def model(self, request: OpenAIRequest) -> str | None:
        return request.model

    def tokenizes(self, source: TokenSource, request: OpenAIRequest) -> bool:
        return request.prompt_ids is None and source.kind == "tokenizer"

    def routing_tokens(self, source: TokenSource, request: OpenAIRequest) -> RoutingTokens:
        return source.routing_tokens(request)

    def prepare(
        self,
        request: OpenAIRequest,
        raw: bytes,
        tokens: RoutingTokens,
        headers: Mapping[str, str],
        sessions: SessionTable,
    ) -> Prepared[OpenAIRequest]:
        turn = None
        if request.messages is None:  # with messages the router reads the turn from the roles
            hint = session_hint(headers, prompt_cache_key=request.prompt_cache_key, user=request.user)
            turn = None if hint is None else sessions.next_turn(hint.key)
        body, hide_usage = _asking_for_usage(raw) if request.stream else (raw, False)
        return self._prepared(request, body, tokens, turn, hide_usage=hide_usage)

    def _prepared(
        self, request: OpenAIRequest, body: bytes, tokens: RoutingTokens, turn: int | None, *, hide_usage: bool = False
    ) -> Prepared[OpenAIRequest]:
        return Prepared(
            request, self.path, body, tokens, turn, request.model, request.messages, request.namespace, hide_usage
        )

    def stream(self, *, keep: bool) -> OpenAIStream:
        return OpenAIStream(self, keep=keep)

    def realized_hit(self, answer: bytes) -> int | None:
        try:
            usage = json.loads(answer).get("usage")
        except (ValueError, AttributeError):
            return None
        return _cached_tokens(usage)

    def output_tokens(self, answer: bytes) -> int:
        try:
            usage = json.loads(answer).get("usage") or {}
        except (ValueError, AttributeError):
            return 0
        n = usage.get("completion_tokens")
        return n if isinstance(n, int) and n >= 0 else 0

    def continuation(
        self, prepared: Prepared[OpenAIRequest], state: StreamState, source: TokenSource
    ) -> Prepared[OpenAIRequest] | None:
        """Continues a single-choice stream with the text so far (its output budget reduced by
        the chunks already sent); the API says how (:meth:`_continue`)."""
        if not isinstance(state, OpenAIStream):
            return None
        try:
            body = json.loads(prepared.body)
        except ValueError:
            return None
        if body.get("n", 1) != 1:
            return None
        text, used = state.text_and_pieces()
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                body[key] = max(1, body[key] - used)
        request = self._continue(prepared.request, body, text)
        if request is None:
            return None
        # The continuation's turn comes from its messages or the index: its session was counted.
        return self._prepared(request, json.dumps(body).encode(), source.routing_tokens(request), None)

    @abstractmethod
    def _continue(self, request: OpenAIRequest, body: dict[str, Any], text: str) -> OpenAIRequest | None:
        """Rewrites ``body`` (in place) to continue after ``text``; the request it now is, or None."""

    @abstractmethod
    def text_of(self, choice: dict[str, Any]) -> object:
        """The text a stream chunk's first choice carries."""

    def is_opening_chunk(self, event: bytes) -> bool:
        """Whether a continuation's first event repeats the stream's opening (default: never)."""
        return False

    def reject(self, error: RequestError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def fail(self, error: ProxyError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def stream_failure(self, error: ProxyError) -> bytes:
        return b"data: " + json.dumps(error.body()).encode() + b"\n\n" + _DONE
