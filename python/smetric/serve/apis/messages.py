"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API (Claude
Code's only API) as vLLM serves it. ``count_tokens`` is validated here and counted by the
least-loaded eligible instance with its own rendering (``Prepared.routed`` false: nothing is
prefilled, so no decision and no KV accounting).

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
other end-to-end headers (vLLM reads neither: its ``--api-key`` checks ``Authorization: Bearer``).

Stream: Anthropic's SSE events (``event: NAME\\ndata: {json}``), ``message_stop`` the end marker,
a ``message_delta`` with a ``stop_reason`` the finish; each ``content_block_delta`` but a
signature is one output token. **A cut stream** is continued on another instance so that the
client keeps every block it received and never gets a second opening or a broken block:

* cut before any content block (only ``message_start`` out): the request is sent again as it
  was and the new stream's ``message_start`` is dropped;
* cut inside or right after a **text** block (thinking blocks before it allowed): continued over
  the engine's ``/v1/chat/completions`` — vLLM's conversion of the request plus an assistant
  message with the text (and reasoning) so far, ``continue_final_message`` — because
  ``/v1/messages`` cannot continue: vLLM renders a trailing assistant message there as a
  finished turn (its own ``continue_final_message=false`` overrides ``chat_template_kwargs``).
  The chat chunks are translated back into Anthropic events (:class:`_ChatTranslation`): the
  open text block goes on at its index, a new part opens the next index, and the message ends
  with vLLM's ``message_delta`` (stop reason mapped as vLLM maps it) and ``message_stop``;
* cut inside or after a **thinking** block with no text after it, or once a **tool_use** block
  has started (its ``input_json_delta`` cannot be continued: a tool parser starts a call from
  its beginning): the stream is ended with Anthropic's ``error`` event and counted
  (``smetric_proxy_unresumed_streams_total``).

Errors: Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's
statuses (the proxy's 503 becomes 529 ``overloaded_error``, its 504 ``timeout_error``).
May import: :mod:`smetric.serve.apis.base` and what it may, :mod:`smetric.anthropic`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from smetric.anthropic import ChatConversion, MessagesRequestError, anthropic_error, error_type, to_chat
from smetric.serve.apis.base import Api, Prepared, Route, StreamState, answer_count, usage_count
from smetric.serve.errors import ProxyError
from smetric.serve.request import OpenAIRequest, RequestError, decode_json_body
from smetric.serve.session import TurnCounter
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["COUNT_TOKENS_PATH", "MessagesApi", "MessagesRequest", "MessagesStream", "anthropic_status"]

CHAT_PATH = "/v1/chat/completions"
"""Where a cut Messages stream is continued (see the module docs)."""
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
"""Counted by an engine (its own rendering), not routed: the least-loaded eligible instance."""

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
    count_tokens: bool = False
    """A ``count_tokens`` request: counted by the least-loaded instance, not routed."""


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


def _blocks(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The content blocks of a client's events: type, index, text so far, whether stopped."""
    blocks: dict[int, dict[str, Any]] = {}
    for name, doc in events:
        index = doc.get("index")
        if not isinstance(index, int):
            continue
        if name == "content_block_start":
            kind = (doc.get("content_block") or {}).get("type")
            blocks[index] = {"type": kind, "index": index, "text": "", "thinking": "", "stopped": False}
        elif name == "content_block_delta" and index in blocks:
            delta = doc.get("delta") or {}
            for key in ("text", "thinking"):
                if isinstance(delta.get(key), str):
                    blocks[index][key] += delta[key]
        elif name == "content_block_stop" and index in blocks:
            blocks[index]["stopped"] = True
    return [blocks[i] for i in sorted(blocks)]


def _chat_body(
    body: Mapping[str, Any], conversion: ChatConversion, messages: list[dict[str, Any]], sent: int
) -> dict[str, Any]:
    """The chat request that continues a Messages stream after ``messages``' final assistant
    text (vLLM's conversion of the rest of the request: sampling, tools, thinking), its output
    budget reduced by the ``sent`` deltas."""
    out: dict[str, Any] = {
        "model": conversion.model,
        "messages": messages,
        "max_tokens": max(1, (conversion.max_tokens or 1) - sent),
        "stream": True,
        "stream_options": {"include_usage": True},
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    for field in ("temperature", "top_p", "top_k", "cache_salt", "vllm_xargs", "chat_template_kwargs"):
        if body.get(field) is not None:
            out[field] = body[field]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    kwargs = conversion.chat_template_kwargs or {}
    if "reasoning_effort" in kwargs:
        out["reasoning_effort"] = kwargs["reasoning_effort"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        out["thinking_token_budget"] = thinking.get("budget_tokens")
    if conversion.tools is not None:
        out["tools"] = conversion.tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")
        if choice.get("disable_parallel_tool_use") is not None:
            out["parallel_tool_calls"] = not choice["disable_parallel_tool_use"]
    elif conversion.tools is not None:
        out["tool_choice"] = "auto"
    return out


def _event_name(event: bytes) -> bytes:
    if not event.startswith(b"event:"):
        return b""
    end = event.find(b"\n")
    return event[6 : end if end >= 0 else len(event)].strip()


def _sse(name: str, data: dict[str, Any]) -> bytes:
    """One Anthropic event, without its separator (the relay adds it)."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode()


def _stop_reason(finish: str | None, stop: object, tool_used: bool) -> tuple[str, str | None]:
    """An OpenAI finish reason as Anthropic's ``(stop_reason, stop_sequence)``, as vLLM maps it."""
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


class _ChatTranslation:
    """Turns a continuation's chat-completion chunks into the Anthropic events that extend the
    client's message: the open text block goes on at its index, a new part opens the next one,
    and the end closes what is open with vLLM's ``message_delta`` and ``message_stop``."""

    __slots__ = ("finish", "next_index", "open_index", "open_type", "output_before", "stop", "tool_used", "usage_sent")

    def __init__(self, open_index: int | None, next_index: int, output_before: int) -> None:
        self.open_index = open_index
        """The client's block that is still open (a text block) or None."""
        self.open_type: str | None = "text" if open_index is not None else None
        self.next_index = next_index
        self.output_before = output_before
        self.finish: str | None = None
        self.stop: object = None
        self.tool_used = False
        self.usage_sent = False

    def _close(self) -> list[bytes]:
        if self.open_index is None:
            return []
        out = []
        if self.open_type == "thinking":  # vLLM signs a thinking block as it closes it
            delta = {"type": "signature_delta", "signature": uuid.uuid4().hex}
            out.append(
                _sse("content_block_delta", {"type": "content_block_delta", "index": self.open_index, "delta": delta})
            )
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": self.open_index}))
        self.open_index = self.open_type = None
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open_index, self.open_type = self.next_index, kind
        self.next_index += 1
        out.append(
            _sse(
                "content_block_start", {"type": "content_block_start", "index": self.open_index, "content_block": block}
            )
        )
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", {"type": "content_block_delta", "index": self.open_index, "delta": delta})

    def ending(self, output_tokens: int | None) -> list[bytes]:
        """What closes the message (open block, ``message_delta``) before ``message_stop``."""
        out = self._close()
        if not self.usage_sent:
            self.usage_sent = True
            reason, sequence = _stop_reason(self.finish or "stop", self.stop, self.tool_used)
            usage = {"output_tokens": self.output_before + (output_tokens or 0)}
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            out.append(_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        return out

    def translate(self, event: bytes) -> tuple[list[bytes], int]:
        """The Anthropic events of one chat event, and the content deltas among them."""
        if not event.startswith(b"data:"):
            return [], 0
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return [*self.ending(None), _MESSAGE_STOP.rstrip(b"\n")], 0
        try:
            chunk = json.loads(payload)
        except ValueError:
            return [], 0
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not choices:  # the usage chunk: the message's end
            usage = chunk.get("usage") if isinstance(chunk, dict) else None
            completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
            return self.ending(completion if isinstance(completion, int) else None), 0
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish, self.stop = choice["finish_reason"], choice.get("stop_reason")
        delta = choice.get("delta") or {}
        out: list[bytes] = []
        deltas = 0
        if delta.get("reasoning"):
            if self.open_type != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
            deltas += 1
        if delta.get("content"):
            if self.open_type != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            deltas += 1
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") and function.get("name"):
                self.tool_used = True
                block = {"type": "tool_use", "id": call["id"], "name": function["name"], "input": {}}
                out += self._open("tool_use", block)
            if function.get("arguments") and self.open_type == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
                deltas += 1
        return out, deltas


class MessagesStream(StreamState):
    """An Anthropic Messages event stream (see the module docs): scans event names only; keeps
    the events the client received when asked (a continuation decodes them). A continuation
    over chat translates its chunks (:class:`_ChatTranslation`)."""

    __slots__ = (
        "_events",
        "blocks",
        "cached_tokens",
        "deltas",
        "done",
        "finished",
        "keep",
        "pending",
        "resending",
        "translation",
    )

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.pending = b""
        self.done = False
        self.finished = False
        self.deltas = 0
        self.cached_tokens: int | None = None
        """The realized hit, once an event carried it (a slot shadows the base class default)."""
        self.blocks = 0
        """``content_block_start`` events the client received."""
        self.resending = False
        """A continuation's stream: its ``message_start`` repeats the client's."""
        self.translation: _ChatTranslation | None = None
        """Set while a continuation's chat stream is relayed."""
        self._events: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self.pending + chunk
        *events, self.pending = data.split(b"\n\n")
        if self.translation is not None:
            translated = []
            for event in events:
                out, deltas = self.translation.translate(event)
                self.finished |= self.translation.finish is not None
                self.deltas += deltas
                translated += out
            events = translated
        for event in events:
            name = _event_name(event)
            if name == b"content_block_delta":
                if b'"signature_delta"' not in event:
                    self.deltas += self.translation is None
            elif name == b"content_block_start":
                self.blocks += 1
            elif name == b"message_delta":
                if (
                    b'"stop_reason"' in event
                    and b'"stop_reason":null' not in event
                    and b'"stop_reason": null' not in event
                ):
                    self.finished = True
            elif name == b"message_stop":
                self.done = True
            if b'"cache_read_input_tokens"' in event and name in (b"message_start", b"message_delta"):
                self._read_cached_tokens(event)
            if self.keep:
                self._events.append(event)
        return events

    def _read_cached_tokens(self, event: bytes) -> None:
        """The realized hit from a ``message_start`` (its message's usage) or ``message_delta``
        (its usage) event: Anthropic's ``cache_read_input_tokens``."""
        try:
            data = json.loads(event.split(b"data:", 1)[1])
        except (IndexError, ValueError):
            return
        usage = data.get("usage") if isinstance(data, dict) else None
        if usage is None and isinstance(data, dict) and isinstance(data.get("message"), dict):
            usage = data["message"].get("usage")
        n = usage_count(usage, "cache_read_input_tokens")
        if n is not None:
            self.cached_tokens = n

    def client_view(self) -> list[tuple[str, dict[str, Any]]]:
        """The kept events, decoded: what the client has received."""
        out = []
        for event in self._events:
            name, _, data = event.partition(b"\n")
            try:
                doc = json.loads(data.removeprefix(b"data:"))
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append((name.removeprefix(b"event:").strip().decode(), doc))
        return out

    @property
    def tokens(self) -> int:
        return self.deltas

    def drops_on_continuation(self, event: bytes) -> bool:
        return self.resending and _event_name(event) == b"message_start"

    def forget(self, event: bytes) -> None:
        self.resending = False  # only the message_start is dropped, and it counts nothing

    @property
    def end_marker(self) -> bytes:
        closing = self.translation.ending(None) if self.translation is not None else []
        return b"".join(e + b"\n\n" for e in closing) + _MESSAGE_STOP


class MessagesApi(Api[MessagesRequest]):
    """``POST /v1/messages`` (see the module docs)."""

    name = "messages"
    path = "/v1/messages"

    def parse(self, raw: bytes) -> MessagesRequest:
        body = decode_json_body(raw)
        try:
            conversion = to_chat(body)
        except MessagesRequestError as e:
            raise RequestError(e.message, param=e.param) from None
        return MessagesRequest(body, conversion, _chat_request(conversion))

    def routes(self) -> tuple[Route, ...]:
        return (Route("POST", self.path), Route("POST", COUNT_TOKENS_PATH))

    def parse_route(self, raw: bytes, route: Route, params: Mapping[str, str], query: str) -> MessagesRequest:
        if route.path != COUNT_TOKENS_PATH:
            return self.parse(raw)
        body = decode_json_body(raw)
        try:
            conversion = to_chat(body, count_tokens=True)
        except MessagesRequestError as e:
            raise RequestError(e.message, param=e.param) from None
        return MessagesRequest(body, conversion, _chat_request(conversion), count_tokens=True)

    def model(self, request: MessagesRequest) -> str | None:
        return request.conversion.model

    def tokenizes(self, source: TokenSource, request: MessagesRequest) -> bool:
        return source.kind == "tokenizer" and not request.count_tokens

    def routing_tokens(self, source: TokenSource, request: MessagesRequest) -> RoutingTokens:
        if request.count_tokens:  # not routed: the engine counts with its own rendering
            return RoutingTokens(array("I"), 0, source.kind)
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
        sessions: TurnCounter,
    ) -> Prepared[MessagesRequest]:
        conversion = request.conversion
        if request.count_tokens:  # nothing is prefilled: no decision, no KV accounting
            return Prepared(request, COUNT_TOKENS_PATH, raw, tokens, None, conversion.model, None, None, routed=False)
        # The converted roles give the router the turn, as for chat.
        return Prepared(
            request,
            self.path,
            raw,
            tokens,
            None,
            conversion.model,
            conversion.messages,
            conversion.cache_salt,
            kv_transfer_params="kv_transfer_params" in request.body,
        )

    def stream(self, *, keep: bool) -> MessagesStream:
        return MessagesStream(keep=keep)

    def realized_hit(self, answer: bytes) -> int | None:
        """Anthropic's ``usage.cache_read_input_tokens`` of a whole answer."""
        return answer_count(answer, "usage", "cache_read_input_tokens")

    def output_tokens(self, answer: bytes) -> int:
        return answer_count(answer, "usage", "output_tokens") or 0

    def continuation(
        self, prepared: Prepared[MessagesRequest], state: StreamState, source: TokenSource
    ) -> Prepared[MessagesRequest] | None:
        if not isinstance(state, MessagesStream):
            return None
        if not state.blocks:
            state.resending = True
            return prepared
        blocks = _blocks(state.client_view())
        last = blocks[-1] if blocks else None
        # Only text can be continued faithfully: vLLM's chat endpoint continues the final
        # message's content; a thinking block cannot be left open by the template, and a tool
        # call's arguments are not continued by a tool parser.
        if last is None or last["type"] != "text" or any(b["type"] not in ("text", "thinking") for b in blocks):
            return None  # the failover ends the stream with the error event and counts it
        request = prepared.request
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        reasoning = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        assistant: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            assistant["reasoning"] = reasoning
        body = _chat_body(request.body, request.conversion, [*request.conversion.messages, assistant], state.deltas)
        chat = dataclasses.replace(
            request.chat,
            messages=body["messages"],
            continue_final_message=True,
            add_generation_prompt=False,
            max_tokens=body["max_tokens"],
        )
        open_index = None if last["stopped"] else last["index"]
        state.translation = _ChatTranslation(open_index, last["index"] + 1, state.deltas)
        # The continuation's turn comes from its messages (a follow-up of its own history).
        return Prepared(
            request,
            CHAT_PATH,
            json.dumps(body).encode(),
            source.routing_tokens(chat),
            None,
            prepared.model,
            body["messages"],
            prepared.namespace,
            kv_transfer_params="kv_transfer_params" in body,
        )

    def reject(self, error: RequestError) -> web.Response:
        status = anthropic_status(error.status)
        return web.json_response(anthropic_error(error.message, type=error_type(status)), status=status)

    def fail(self, error: ProxyError) -> web.Response:
        status = anthropic_status(error.status)
        return web.json_response(anthropic_error(error.message, type=error_type(status)), status=status)

    def stream_failure(self, error: ProxyError) -> bytes:
        body = anthropic_error(error.message, type=error_type(anthropic_status(error.status)))
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
