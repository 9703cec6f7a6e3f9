"""What OpenAI's two completion APIs share: the error shape, the ``data:`` event stream ending in
``data: [DONE]``, the body parser (:func:`smetric.serve.request.parse_request`), session hints,
the output-token count of a whole answer, and the rule for what a cut stream may be continued
with. :mod:`.chat` and :mod:`.completions` add what differs: where a stream chunk's text is, the
opening chunk a continuation drops, and how the received parts are put back into the request.

:class:`OpenAIStream` only scans bytes on the relay path — ``[DONE]``, a non-null
``finish_reason``, and the usage chunk (the one event it decodes) — and keeps the raw events,
decoded only when a cut stream must be continued (:meth:`OpenAIStream.received`): O(chunk
bytes) per chunk and no JSON work.

Continuation (:meth:`OpenAIApi.continuation`), from what the client already received
(:class:`Received`): nothing yet → the original request again (the new stream's opening dropped);
text (and, for chat, a reasoning that ended because text followed it) → the API's continuation
request, whose chunks are relayed under the first attempt's ``id``. Never continued — the stream
ends with the API's error event — when a cut falls where a fresh engine could not go on
faithfully: after any ``tool_calls`` delta (a tool call's arguments restarted by a new parser and
decoder), in guided / structured output (``response_format`` JSON, ``guided_*``,
``structured_outputs``, chat's forced ``tool_choice``: the new decoder would start the grammar
from its root), inside a reasoning (see :mod:`.chat`), with ``n`` ≠ 1 or completions' ``echo``.
A second cut is continued from the original request, never from a continuation (so nothing is
put back twice).
May import: :mod:`smetric.serve.apis.base` and what it may.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from smetric._core import SHARED_USAGE_OPTION
from smetric.serve.apis.base import Api, Prepared, StreamState, answer_count, usage_count
from smetric.serve.errors import ProxyError
from smetric.serve.request import Endpoint, OpenAIRequest, RequestError, parse_request
from smetric.serve.session import TurnCounter, session_hint
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["OpenAIApi", "OpenAIStream", "Received"]

_DONE = b"data: [DONE]\n\n"

_CHUNK_ID = re.compile(rb'"id":\s*"[^"\\]*"')
"""A chunk's ``"id"`` field (vLLM writes it first in every chunk, before any tool call's ``id``)."""

_STRUCTURED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
"""vLLM's request fields that constrain decoding to a grammar (its ``guided_*`` and their successor)."""

_STRUCTURED_FORMATS = ("json_schema", "json_object", "structural_tag")
"""``response_format`` types decoded under a grammar (``text`` is free text)."""


@dataclass(frozen=True, slots=True)
class Received:
    """What the client of a cut stream already has, decoded from its kept events."""

    text: str
    """The answer's text (chat ``delta.content``, completions ``text``)."""
    reasoning: str
    """Chat: ``delta.reasoning`` (vLLM's name since 0.11; ``reasoning_content`` before)."""
    tool_calls: bool
    """Chat: a ``tool_calls`` delta was sent (part of a call the client is assembling)."""
    pieces: int
    """Chunks that carried any of it (one generated token each)."""

    @property
    def nothing(self) -> bool:
        return not self.pieces and not self.tool_calls


def _cached_tokens(usage: object) -> int | None:
    """OpenAI's ``usage.prompt_tokens_details.cached_tokens`` (vLLM fills it with
    ``--enable-prompt-tokens-details``), or None."""
    return usage_count(usage, "prompt_tokens_details", "cached_tokens")


_USAGE_OPTION: bytes = SHARED_USAGE_OPTION
"""The usage request spliced into a streamed body (the gateway splices the same bytes)."""


def _asking_for_usage(raw: bytes, stream_options_json: str | None) -> tuple[bytes, bool]:
    """A stream's body that asks the engine for its usage (the realized hit), and whether the
    client did not ask for it itself (then its usage event is hidden). ``stream_options_json``
    is the body's own field as the parse found it (None: absent). Without the field the option
    is spliced in after the opening brace (one copy of the body, no search); with one that lacks
    it, the body is re-encoded."""
    start = raw.find(b"{")
    if stream_options_json is None and start >= 0:
        return b"".join((raw[:start], _USAGE_OPTION, memoryview(raw)[start + 1 :])), True
    try:
        options = json.loads(stream_options_json) if stream_options_json is not None else None
    except ValueError:
        options = None
    if isinstance(options, dict) and options.get("include_usage") is True:
        return raw, False
    try:
        body = json.loads(raw)
    except ValueError:
        return raw, False
    if not isinstance(body, dict):
        return raw, False
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(body).encode(), True


class OpenAIStream(StreamState):
    """An OpenAI completion stream (``data: {chunk}`` events, ``data: [DONE]`` at the end)."""

    __slots__ = (
        "_api",
        "_attempts",
        "_events",
        "_id",
        "_renamed",
        "cached_tokens",
        "chunks",
        "done",
        "finished",
        "hide_usage",
        "keep",
        "origin",
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
        self.origin: Prepared[OpenAIRequest] | None = None
        """The client's own request, set at the first continuation: every later one is built
        from it and the whole stream so far, so nothing is put back twice."""
        self._attempts = 0
        self._id: bytes | None = None
        """The ``"id": "…"`` field of the first attempt's chunks: a continuation's carry it too."""
        self._renamed: bytes | None = None
        """The current continuation's own ``"id"`` field, once seen."""

    def begin(self, instance: str) -> None:
        self._attempts += 1
        self._renamed = None

    def outgoing(self, chunk: bytes, events: list[bytes]) -> bytes:
        """A continuation's chunks under the first attempt's id (one stream, one id)."""
        if self._attempts < 2 or not self._id:
            return chunk
        if self._renamed is None:
            found = next((m for m in map(_CHUNK_ID.search, events) if m is not None), None)
            if found is None:
                return chunk
            self._renamed = found.group(0)
        return chunk if self._renamed == self._id else chunk.replace(self._renamed, self._id)

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
        if self._id is None and self._attempts <= 1:
            found = _CHUNK_ID.search(event)  # the first event only: b"" when it has no id
            self._id = b"" if found is None else found.group(0)
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

    def received(self) -> Received:
        """What the client has so far (decodes the kept events)."""
        text: list[str] = []
        reasoning: list[str] = []
        pieces = 0
        tool_calls = False
        for event in self._events:
            try:
                obj = json.loads(event[5:])
            except ValueError:
                continue
            choices = obj.get("choices") or [] if isinstance(obj, dict) else []
            if not choices or not isinstance(choices[0], dict):
                continue
            choice = choices[0]
            piece = self._api.text_of(choice)
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = {}
            thought = delta.get("reasoning", delta.get("reasoning_content"))
            carried = False
            if isinstance(piece, str) and piece:
                text.append(piece)
                carried = True
            if isinstance(thought, str) and thought:
                reasoning.append(thought)
                carried = True
            if delta.get("tool_calls"):
                tool_calls = carried = True
            pieces += carried
        return Received("".join(text), "".join(reasoning), tool_calls, pieces)


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
        sessions: TurnCounter,
    ) -> Prepared[OpenAIRequest]:
        turn = hint = None
        if request.messages is None:  # with messages the router reads the turn from the roles
            hint = session_hint(headers, prompt_cache_key=request.prompt_cache_key, user=request.user)
            turn = None if hint is None else sessions.next_turn(hint.key)
        body, hide_usage = _asking_for_usage(raw, request.stream_options_json) if request.stream else (raw, False)
        prepared = self._prepared(request, body, tokens, turn, hide_usage=hide_usage)
        return prepared if hint is None else replace(prepared, turn_key=hint.key)

    def _prepared(
        self, request: OpenAIRequest, body: bytes, tokens: RoutingTokens, turn: int | None, *, hide_usage: bool = False
    ) -> Prepared[OpenAIRequest]:
        return Prepared(
            request,
            self.path,
            body,
            tokens,
            turn,
            request.model,
            request.messages,
            request.namespace,
            hide_usage=hide_usage,
            kv_transfer_params=request.kv_transfer_params,
        )

    def stream(self, *, keep: bool) -> OpenAIStream:
        return OpenAIStream(self, keep=keep)

    def realized_hit(self, answer: bytes) -> int | None:
        return answer_count(answer, "usage", "prompt_tokens_details", "cached_tokens")

    def output_tokens(self, answer: bytes) -> int:
        return answer_count(answer, "usage", "completion_tokens") or 0

    def continuation(
        self, prepared: Prepared[OpenAIRequest], state: StreamState, source: TokenSource
    ) -> Prepared[OpenAIRequest] | None:
        """The request that continues a single-choice stream from what the client received (its
        output budget reduced by the chunks already sent), or None when it cannot be continued
        faithfully (see the module docs); the API says how text is put back (:meth:`_continue`)."""
        if not isinstance(state, OpenAIStream) or not state.keep:
            return None
        origin = state.origin = state.origin or prepared
        try:
            body = json.loads(origin.body)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("n", 1) != 1:
            return None
        got = state.received()
        if got.nothing:  # only the opening reached the client: the request again, as it was
            return origin
        if got.tool_calls or self.structured(body) or not self.continuable(body, got):
            return None
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                body[key] = max(1, body[key] - got.pieces)
        request = self._continue(origin.request, body, got)
        if request is None:
            return None
        # The continuation's turn comes from its messages or the index: its session was counted.
        return self._prepared(request, json.dumps(body).encode(), source.routing_tokens(request), None)

    @staticmethod
    def structured(body: Mapping[str, Any]) -> bool:
        """Whether the output is decoded under a grammar (the module docs list the fields)."""
        if any(body.get(key) is not None for key in _STRUCTURED_FIELDS):
            return True
        fmt = body.get("response_format")
        return isinstance(fmt, dict) and fmt.get("type") in _STRUCTURED_FORMATS

    def continuable(self, body: Mapping[str, Any], got: Received) -> bool:
        """Whether the API can put ``got`` back faithfully, besides the shared rules (default: yes)."""
        return True

    @abstractmethod
    def _continue(self, request: OpenAIRequest, body: dict[str, Any], got: Received) -> OpenAIRequest | None:
        """Rewrites ``body`` (in place) to continue after ``got``; the request it now is, or None."""

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
