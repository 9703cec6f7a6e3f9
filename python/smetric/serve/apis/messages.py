"""``POST /v1/messages``: Anthropic's Messages API (Claude Code's only API) as vLLM serves it.

Body: validated and converted to the chat request vLLM renders (:func:`smetric.anthropic.to_chat`:
system as a string or blocks, text / image / ``tool_use`` / ``tool_result`` / thinking blocks,
tools, tool_choice, thinking). Routing tokens: that chat request rendered like any chat request
(:meth:`smetric.serve.tokens.TokenSource.routing_tokens`), with the inline system messages merged
into the leading one when the template requires system-first ordering, as vLLM decides it — so
with the model's local tokenizer the ids, and the predicted local hit, are the engine's (its
``cache_read_input_tokens``). The turn comes from the converted roles, like chat. Claude Code's
``x-claude-code-session-id`` / ``x-claude-code-agent-id`` are read by
:func:`smetric.serve.session.session_hint` (a sub-agent is a session of its own); with roles in
the body the router needs no hint. ``x-api-key`` and ``anthropic-version`` are forwarded with the
other end-to-end headers (vLLM ignores the version and checks the key against ``--api-key``).

Stream: Anthropic's SSE events (``event: NAME\\ndata: {json}``), ``message_stop`` the end marker,
a ``message_delta`` with a ``stop_reason`` the finish; each ``content_block_delta`` but a
signature is one output token. **A cut stream**: when the client has no content block yet (only
``message_start``), the request is sent again elsewhere and the new stream's ``message_start`` is
dropped, so the client sees one message. Once a content block has started, a continuation over
``/v1/messages`` is not faithful on vLLM: it renders a trailing assistant message as a finished
turn (``continue_final_message`` cannot be set through this endpoint: vLLM's own value overrides
``chat_template_kwargs``), so the model would start a new answer and the client would get a
duplicated or broken structure — a ``tool_use`` block cut inside its ``input_json_delta`` least of
all. Such a stream is ended with Anthropic's ``error`` event, and counted in
:attr:`MessagesApi.unresumable_cuts`.

Errors: Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's
statuses (the proxy's 503 becomes 529 ``overloaded_error``, its 504 ``timeout_error``).
May import: :mod:`smetric.serve.apis.base` and what it may, :mod:`smetric.anthropic`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from smetric.anthropic import ChatConversion, MessagesRequestError, anthropic_error, error_type, to_chat
from smetric.serve.apis.base import Api, Prepared, StreamState
from smetric.serve.errors import ProxyError
from smetric.serve.request import OpenAIRequest, RequestError
from smetric.serve.session import SessionTable
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["COUNT_TOKENS_PATH", "MessagesApi", "MessagesRequest", "MessagesStream", "anthropic_status"]

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
"""Counted by an engine (its rendering), not routed: the app forwards it to the least-loaded one."""

_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_STATUS = {503: 529}
"""The proxy's statuses Anthropic spells differently (its "overloaded" is 529)."""


def anthropic_status(status: int) -> int:
    """The status Anthropic's clients expect for one of the proxy's."""
    return _STATUS.get(status, status)


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A parsed Messages request: the body, its conversion, and the chat request it renders as."""

    body: dict[str, Any]
    conversion: ChatConversion
    chat: OpenAIRequest


def _chat_request(conversion: ChatConversion) -> OpenAIRequest:
    kwargs = dict(conversion.chat_template_kwargs or {})
    # vLLM's own add_generation_prompt (true) and continue_final_message (false) override the
    # request's kwargs on this endpoint; TokenSource would let the kwargs win, so drop them.
    kwargs.pop("add_generation_prompt", None)
    kwargs.pop("continue_final_message", None)
    return OpenAIRequest(
        endpoint="chat",
        model=conversion.model,
        stream=conversion.stream,
        max_tokens=conversion.max_tokens,
        user=None,
        prompt_cache_key=None,
        namespace=conversion.cache_salt,
        messages=conversion.messages,
        tools=conversion.tools,
        chat_template_kwargs=kwargs or None,
        add_generation_prompt=True,
        continue_final_message=False,
        add_special_tokens=False,
        prompt_text=None,
        prompt_ids=None,
    )


def _event_name(event: bytes) -> bytes:
    if not event.startswith(b"event:"):
        return b""
    end = event.find(b"\n")
    return event[6 : end if end >= 0 else len(event)].strip()


class MessagesStream(StreamState):
    """An Anthropic Messages event stream (see the module docs): scans event names only."""

    __slots__ = ("blocks", "deltas", "done", "finished", "keep", "pending", "resending")

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.pending = b""
        self.done = False
        self.finished = False
        self.deltas = 0
        self.blocks = 0
        """``content_block_start`` events the client received."""
        self.resending = False
        """A continuation's stream: its ``message_start`` repeats the client's."""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self.pending + chunk
        *events, self.pending = data.split(b"\n\n")
        for event in events:
            name = _event_name(event)
            if name == b"content_block_delta":
                if b'"signature_delta"' not in event:
                    self.deltas += 1
            elif name == b"content_block_start":
                self.blocks += 1
            elif name == b"message_delta":
                if b'"stop_reason"' in event and b'"stop_reason":null' not in event:
                    self.finished = True
            elif name == b"message_stop":
                self.done = True
        return events

    @property
    def tokens(self) -> int:
        return self.deltas

    def drops_on_continuation(self, event: bytes) -> bool:
        return self.resending and _event_name(event) == b"message_start"

    def forget(self, event: bytes) -> None:
        self.resending = False  # only the message_start is dropped, and it counts nothing

    @property
    def end_marker(self) -> bytes:
        return _MESSAGE_STOP


class MessagesApi(Api[MessagesRequest]):
    """``POST /v1/messages`` (see the module docs)."""

    name = "messages"
    path = "/v1/messages"

    def __init__(self) -> None:
        self.unresumable_cuts = 0
        """Streams cut after a content block started: ended with an ``error`` event."""

    def parse(self, raw: bytes) -> MessagesRequest:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"malformed JSON body: {e}") from None
        try:
            conversion = to_chat(body)
        except MessagesRequestError as e:
            raise RequestError(e.message, param=e.param) from None
        return MessagesRequest(body, conversion, _chat_request(conversion))

    def parse_count_tokens(self, raw: bytes) -> str:
        """Validates a ``count_tokens`` body; its model. Raises :class:`RequestError`."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"malformed JSON body: {e}") from None
        try:
            return to_chat(body, count_tokens=True).model
        except MessagesRequestError as e:
            raise RequestError(e.message, param=e.param) from None

    def model(self, request: MessagesRequest) -> str | None:
        return request.conversion.model

    def tokenizes(self, source: TokenSource, request: MessagesRequest) -> bool:
        return source.kind == "tokenizer"

    def routing_tokens(self, source: TokenSource, request: MessagesRequest) -> RoutingTokens:
        chat = request.chat
        if source.requires_leading_system(tools=chat.tools is not None) and any(
            m.get("role") == "system" for m in request.body["messages"]
        ):
            merged = to_chat(request.body, merge_inline_system=True)
            chat = _chat_request(merged)
        return source.routing_tokens(chat)

    def prepare(
        self,
        request: MessagesRequest,
        raw: bytes,
        tokens: RoutingTokens,
        headers: Mapping[str, str],
        sessions: SessionTable,
    ) -> Prepared[MessagesRequest]:
        conversion = request.conversion
        # The converted roles give the router the turn, as for chat.
        return Prepared(
            request, self.path, raw, tokens, None, conversion.model, conversion.messages, conversion.cache_salt
        )

    def stream(self, *, keep: bool) -> MessagesStream:
        return MessagesStream(keep=keep)

    def output_tokens(self, answer: bytes) -> int:
        try:
            usage = json.loads(answer).get("usage") or {}
        except (ValueError, AttributeError):
            return 0
        n = usage.get("output_tokens") if isinstance(usage, dict) else None
        return n if isinstance(n, int) and n >= 0 else 0

    def continuation(
        self, prepared: Prepared[MessagesRequest], state: StreamState, source: TokenSource
    ) -> Prepared[MessagesRequest] | None:
        if not isinstance(state, MessagesStream):
            return None
        if state.blocks:
            self.unresumable_cuts += 1
            return None
        state.resending = True
        return prepared

    def reject(self, error: RequestError) -> web.Response:
        status = anthropic_status(error.status)
        return web.json_response(anthropic_error(error.message, type=error_type(status)), status=status)

    def fail(self, error: ProxyError) -> web.Response:
        status = anthropic_status(error.status)
        return web.json_response(anthropic_error(error.message, type=error_type(status)), status=status)

    def stream_failure(self, error: ProxyError) -> bytes:
        body = anthropic_error(error.message, type=error_type(anthropic_status(error.status)))
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
