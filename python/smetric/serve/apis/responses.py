"""``/v1/responses``: OpenAI's Responses API as vLLM serves it — ``POST /v1/responses``, and
``GET`` / ``DELETE`` of ``/v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``.

Routing tokens: the input items turned into chat messages as vLLM turns them
(``vllm/entrypoints/openai/responses/utils.py::construct_input_messages``, re-implemented in
:func:`chat_messages`: ``instructions`` → a system message; a string input → a user message;
``function_call`` → an assistant ``tool_calls`` entry, ``reasoning`` → the assistant's
``reasoning`` (its first content text, else its first summary text), an assistant message → its
first text, each merged into the preceding assistant message when that one lacks the field;
``function_call_output`` → a ``tool`` message; other role items kept as they are), then
rendered with the chat template like a chat request (:class:`~smetric.serve.tokens.TokenSource`).
``store: false`` with the whole history (Codex) is therefore routed by content like chat.

Stored responses: a follow-up naming ``previous_response_id``, and the ``GET`` / ``DELETE`` /
``cancel`` routes, must reach the one instance holding that response (vLLM keeps it in one
process's memory). The ids the client sees are issued by the proxy and carry their instance
(:mod:`smetric.serve.pinning`): every ``id`` / ``previous_response_id`` in an answer — whole or
streamed — is rewritten to the proxy's id, and translated back when forwarding. Such a request is
pinned (:attr:`Prepared.pin`); when its instance is gone the failover answers that the stored
response is lost, never another instance without the history. An id that does not verify is
vLLM's own 404 ("Response with id … not found.").

Stream: ``event: …`` / ``data: {…}`` events, ended by ``response.completed``,
``response.failed`` or ``response.incomplete`` (no ``[DONE]``). A cut stream is continued on
another instance where it can be faithfully (:meth:`ResponsesApi.continuation`, spliced into the
client's stream by :class:`Splice`); otherwise it ends with a ``response.failed`` event in
Responses' own shape, counted by the failover. Errors: OpenAI's shape.

Invariants: the forwarded body differs from the client's only in ``previous_response_id`` (the
engine's id); a stream is relayed event by event (ids rewritten per event, O(event bytes)).
May import: :mod:`smetric.serve.apis.base` and what it may, ``.pinning``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from aiohttp import web

from smetric.serve.apis.base import Api, Prepared, Route, StreamState, answer_count, usage_count
from smetric.serve.config import ServeConfig
from smetric.serve.errors import ProxyError
from smetric.serve.pinning import ResponseIds
from smetric.serve.request import OpenAIRequest, RequestError, decode_json_body
from smetric.serve.session import TurnCounter, session_hint
from smetric.serve.tokens import RoutingTokens, TokenSource

__all__ = ["ResponsesApi", "ResponsesRequest", "ResponsesStream", "chat_messages"]

Operation = Literal["create", "retrieve", "delete", "cancel"]
TERMINAL_EVENTS = (b"response.completed", b"response.failed", b"response.incomplete")
"""The event types that end a Responses stream."""
PREFILL_OVERRIDES = MappingProxyType({"max_output_tokens": 1, "store": False})
"""A PD prefill leg generates one token and stores nothing (vLLM's store never evicts: a stored
prefill-only response would stay on the prefill instance for good)."""
_ID_FIELD = re.compile(rb'"(id|previous_response_id)":\s*"([^"\\]+)"')
_NOT_FOUND = re.compile(r"Response with id '([^']+)' not found")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """What the proxy reads of one Responses request."""

    operation: Operation
    engine_path: str
    """The engine's path (with the engine's id, and the query string of a ``GET``)."""
    body: dict[str, Any] | None = None
    """``create``: the body, ``previous_response_id`` translated to the engine's id."""
    chat: OpenAIRequest | None = None
    """``create``: the input as a chat request (what is rendered for routing)."""
    pin: str | None = None
    """The tag of the instance holding the named stored response."""
    hints: Mapping[str, str | None] = field(default_factory=dict)
    """Body fields that hint at a session (``prompt_cache_key``, ``user``)."""


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(message, param=param)


def _not_found(response_id: str) -> RequestError:
    """vLLM's answer to an id its store does not hold."""
    return RequestError(f"Response with id '{response_id}' not found.", status=404, param="response_id")


def _first_text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _merge(messages: list[dict[str, Any]], key: str, value: Any) -> bool:
    """Puts ``value`` under ``key`` of the last message when it is an assistant's without it."""
    if messages and messages[-1].get("role") == "assistant" and messages[-1].get(key) is None:
        messages[-1][key] = value
        return True
    return False


def chat_messages(instructions: str | None, items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages vLLM renders for ``instructions`` and the ``input`` (module docs).
    Raises :class:`RequestError` for an item vLLM refuses."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise _bad(f"input[{i}]: a function_call needs a string {name}", "input")
            call = {
                "id": item["call_id"],
                "function": {"name": item["name"], "arguments": item["arguments"]},
                "type": "function",
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                calls = last.get("tool_calls")
                if calls is None:
                    last["tool_calls"] = [call]
                    continue
                if isinstance(calls, list):
                    calls.append(call)
                    continue
            messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise _bad("Encrypted content is not supported.", "input")
            text = _first_text(item.get("content")) or _first_text(item.get("summary")) or ""
            if not _merge(messages, "reasoning", text):
                messages.append({"role": "assistant", "reasoning": text})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
        elif item.get("role") == "assistant" and _first_text(item.get("content")) is not None:
            said = _first_text(item.get("content"))
            if not _merge(messages, "content", said):
                messages.append({"role": "assistant", "content": said})
        elif isinstance(item.get("role"), str):
            messages.append(item)
        else:
            raise _bad(f"Unsupported input item type: {kind}", "input")
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' function tools in chat's form (what a chat template is given)."""
    if tools is None:
        return None
    # vLLM validates every field but the type into its FunctionDefinition, which keeps extra
    # fields (``strict``), and the template is given its dump.
    return [
        {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        for tool in tools
        if tool.get("type") == "function"
    ]


class ResponsesStream(StreamState):
    """A Responses event stream: scans for the terminal event and the usage; rewrites the
    engine's response ids to the proxy's; after a cut, splices a continuation in
    (:class:`Splice`)."""

    __slots__ = (
        "_ids",
        "_instance",
        "cached_tokens",
        "deltas",
        "done",
        "events",
        "finished",
        "keep",
        "output_tokens",
        "pending",
        "splice",
    )

    def __init__(self, ids: ResponseIds, *, keep: bool = False) -> None:
        self._ids = ids
        self._instance = ""
        self.keep = keep
        self.pending = b""
        self.done = False
        self.finished = False
        self.deltas = 0
        self.output_tokens: int | None = None
        self.events: list[bytes] = []
        """The events relayed so far, as the client received them (kept for a continuation)."""
        self.splice: Splice | None = None

    def begin(self, instance: str) -> None:
        self._instance = instance

    def feed(self, chunk: bytes) -> list[bytes]:
        *events, self.pending = (self.pending + chunk).split(b"\n\n")
        for event in events:
            self._scan(event)
        return events

    def _scan(self, event: bytes) -> None:
        head = event[:64]
        if b"delta" in head:
            self.deltas += 1
        elif any(kind in head for kind in TERMINAL_EVENTS):
            self.done = self.finished = True
            try:
                usage = _data(event)["response"]["usage"]
                self.cached_tokens = usage_count(usage, "input_tokens_details", "cached_tokens")
                self.output_tokens = int(usage["output_tokens"])
            except (ValueError, KeyError, TypeError):
                pass

    def outgoing(self, chunk: bytes, events: list[bytes]) -> bytes:
        out = []
        for event in events:
            if self.splice is not None:
                spliced = self.splice.event(event)
                if spliced is None:
                    continue
                event = spliced
            event = rewrite_ids(event, self._ids, self._instance)
            if self.keep:
                self.events.append(event)
            out.append(event + b"\n\n")
        return b"".join(out)

    @property
    def tokens(self) -> int:
        return self.output_tokens if self.output_tokens is not None else self.deltas

    def drops_on_continuation(self, event: bytes) -> bool:
        return False  # the splice drops what repeats (in outgoing)

    def forget(self, event: bytes) -> None:
        return None

    @property
    def end_marker(self) -> bytes:
        return b""


def _data(event: bytes) -> Any:
    """The decoded ``data:`` of one SSE event."""
    return json.loads(event.partition(b"data:")[2])


_DELTAS = {
    "response.output_text.delta": "output_text",
    "response.reasoning_text.delta": "reasoning_text",
    "response.function_call_arguments.delta": "arguments",
}
_TEXT_DONE = ("response.output_text.done", "response.reasoning_text.done")


@dataclass(slots=True)
class _Item:
    """One output item as the client received it."""

    index: int
    item: dict[str, Any]
    """Its ``output_item.added`` item, then its ``output_item.done`` item."""
    text: str = ""
    """Its streamed text (a message's, a reasoning's) or arguments (a function call's)."""
    done: bool = False

    @property
    def kind(self) -> str:
        return str(self.item.get("type"))

    def as_input(self, *, status: str) -> dict[str, Any]:
        """The item as the next request's input (vLLM continues an ``in_progress`` last one)."""
        if self.kind == "function_call":
            return {k: self.item.get(k) for k in ("type", "call_id", "name", "arguments")}
        if self.kind == "reasoning":
            return {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": self.text}]}
        return {
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": self.text, "annotations": []}],
        }


def received(events: list[bytes]) -> tuple[dict[str, Any] | None, list[_Item], int]:
    """What the client has of a cut stream: the ``response.created`` response, the output
    items, and the last sequence number. O(events)."""
    response: dict[str, Any] | None = None
    items: dict[int, _Item] = {}
    sequence = -1
    for event in events:
        try:
            data = _data(event)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        kind = data.get("type")
        sequence = max(sequence, data.get("sequence_number", sequence))
        index = data.get("output_index")
        if kind == "response.created":
            response = data.get("response")
        elif kind == "response.output_item.added" and isinstance(index, int):
            items[index] = _Item(index, dict(data.get("item") or {}))
        elif kind in _DELTAS and index in items:
            items[index].text += str(data.get("delta") or "")
        elif kind == "response.output_item.done" and index in items:
            items[index].item, items[index].done = dict(data.get("item") or {}), True
    return response, [items[i] for i in sorted(items)], sequence


@dataclass(slots=True)
class Splice:
    """Turns a continuation's events into the rest of the client's stream: its opening and the
    continued item's opening dropped, indices shifted after what the client has, the continued
    item under its first id with its text so far prefixed to every ``done`` event, sequence
    numbers following the client's, and the terminal event's response carrying the client's id
    and every output item. O(event bytes) per event (each is decoded: continuation only)."""

    response: dict[str, Any]
    """The client's ``response.created`` response (its id already the proxy's)."""
    before: list[_Item]
    """The client's items; the last is the continued one when ``open``."""
    open: bool
    sequence: int
    output_tokens: int

    def _index(self, index: object) -> int:
        base = len(self.before) - (1 if self.open else 0)
        return base + (index if isinstance(index, int) else 0)

    def event(self, event: bytes) -> bytes | None:
        try:
            data = _data(event)
        except ValueError:
            return None
        kind = data.get("type")
        if kind in ("response.created", "response.in_progress"):
            return None
        continued = self.before[-1] if self.open and data.get("output_index") == 0 else None
        if continued is not None:
            prefix = continued.text
            if kind in ("response.output_item.added", "response.content_part.added"):
                return None
            data["item_id"] = continued.item.get("id")
            if kind in _TEXT_DONE:
                data["text"] = prefix + str(data.get("text") or "")
            elif kind == "response.content_part.done" and isinstance(data.get("part"), dict):
                data["part"]["text"] = prefix + str(data["part"].get("text") or "")
            elif kind == "response.output_item.done":
                data["item"] = _continued(continued, data.get("item"))
                data.pop("item_id")
        if "output_index" in data:
            data["output_index"] = self._index(data["output_index"])
        if kind is not None and kind.encode() in TERMINAL_EVENTS and isinstance(data.get("response"), dict):
            data["response"] = self._final(data["response"])
        self.sequence += 1
        data["sequence_number"] = self.sequence
        return f"event: {kind}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode()

    def _final(self, answer: dict[str, Any]) -> dict[str, Any]:
        output = [item.item for item in self.before[: len(self.before) - (1 if self.open else 0)]]
        rest = list(answer.get("output") or [])
        if self.open and rest:
            rest[0] = _continued(self.before[-1], rest[0])
        usage = answer.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            usage["output_tokens"] += self.output_tokens
            if isinstance(usage.get("total_tokens"), int):
                usage["total_tokens"] += self.output_tokens
        keep = {k: v for k, v in answer.items() if k not in ("id", "created_at", "output", "previous_response_id")}
        return {**self.response, **keep, "output": output + rest}


def _continued(first: _Item, item: object) -> dict[str, Any]:
    """The continued item's ``done`` form: the first attempt's id and text so far in front."""
    out = dict(item) if isinstance(item, dict) else {}
    out["id"] = first.item.get("id")
    content = out.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        content[0] = {**content[0], "text": first.text + str(content[0].get("text") or "")}
    return out


def rewrite_ids(data: bytes, ids: ResponseIds, instance: str) -> bytes:
    """``data`` with every ``id`` / ``previous_response_id`` that names a response of
    ``instance`` (``resp_…``) replaced by the proxy's id for it."""

    def proxy_id(match: re.Match[bytes]) -> bytes:
        key, value = match.group(1), match.group(2).decode()
        if (not value.startswith("resp_") and key == b"id") or ids.open(value) is not None:
            return match.group(0)  # an item's id (msg_…, fc_…, rs_…), or already the proxy's
        return b'"' + key + b'":"' + ids.issue(value, instance).encode() + b'"'

    return _ID_FIELD.sub(proxy_id, data)


class ResponsesApi(Api[ResponsesRequest]):
    name = "responses"
    path = "/v1/responses"

    def __init__(self, ids: ResponseIds | None = None) -> None:
        self.ids = ids or ResponseIds(None)

    def bind(self, config: ServeConfig) -> ResponsesApi:
        return ResponsesApi(ResponseIds(config.response_id_key))

    def routes(self) -> tuple[Route, ...]:
        item = "/v1/responses/{response_id}"
        return (Route("POST", self.path), Route("GET", item), Route("DELETE", item), Route("POST", item + "/cancel"))

    def _open(self, proxy_id: str) -> tuple[str, str]:
        opened = self.ids.open(proxy_id)
        if opened is None:
            raise _not_found(proxy_id)
        return opened.engine_id, opened.tag

    def parse_route(self, raw: bytes, route: Route, params: Mapping[str, str], query: str) -> ResponsesRequest:
        if "response_id" not in params:
            return self.parse(raw)
        engine_id, tag = self._open(params["response_id"])
        path = f"/v1/responses/{engine_id}"
        if route.method == "GET":
            return ResponsesRequest("retrieve", path + (f"?{query}" if query else ""), pin=tag)
        if route.method == "DELETE":
            return ResponsesRequest("delete", path, pin=tag)
        return ResponsesRequest("cancel", path + "/cancel", pin=tag)

    def parse(self, raw: bytes) -> ResponsesRequest:
        body = decode_json_body(raw)
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        for name in ("model", "instructions", "previous_response_id", "prompt_cache_key", "user", "cache_salt"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise _bad(f"{name} must be a string", name)
        for name in ("stream", "store", "background"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                raise _bad(f"{name} must be a boolean", name)
        limit = body.get("max_output_tokens")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise _bad("max_output_tokens must be an integer of at least 1", "max_output_tokens")
        items = body.get("input")
        if not isinstance(items, str | list) or (
            isinstance(items, list) and not all(isinstance(i, dict) for i in items)
        ):
            raise _bad("input must be a string or a list of items (objects)", "input")
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise _bad("tools must be a list of objects", "tools")
        pin = None
        previous = body.get("previous_response_id")
        if previous is not None:
            engine_id, pin = self._open(previous)
            body = {**body, "previous_response_id": engine_id}
        messages = chat_messages(body.get("instructions"), items)
        chat = OpenAIRequest(
            endpoint="chat",
            model=body.get("model"),
            stream=bool(body.get("stream")),
            max_tokens=limit,
            user=body.get("user"),
            prompt_cache_key=body.get("prompt_cache_key"),
            namespace=body.get("cache_salt"),
            messages=messages or [{"role": "user", "content": ""}],
            tools=chat_tools(tools),
            chat_template_kwargs=None,
            add_generation_prompt=True,
            continue_final_message=False,
            add_special_tokens=False,
            prompt_text=None,
            prompt_ids=None,
        )
        hints = {"prompt_cache_key": body.get("prompt_cache_key"), "user": body.get("user")}
        return ResponsesRequest("create", self.path, body=body, chat=chat, pin=pin, hints=hints)

    def model(self, request: ResponsesRequest) -> str | None:
        return None if request.chat is None else request.chat.model

    def tokenizes(self, source: TokenSource, request: ResponsesRequest) -> bool:
        return request.chat is not None and source.kind == "tokenizer"

    def routing_tokens(self, source: TokenSource, request: ResponsesRequest) -> RoutingTokens:
        if request.chat is None:  # a stored response's route: nothing to route on
            return RoutingTokens(array("I"), 0, source.kind)
        return source.routing_tokens(request.chat)

    def prepare(
        self,
        request: ResponsesRequest,
        raw: bytes,
        tokens: RoutingTokens,
        headers: Mapping[str, str],
        sessions: TurnCounter,
    ) -> Prepared[ResponsesRequest]:
        if request.chat is None:
            method = "GET" if request.operation == "retrieve" else "DELETE" if request.operation == "delete" else "POST"
            return Prepared(
                request, request.engine_path, b"", tokens, None, None, None, None, method, False, request.pin
            )
        assert request.body is not None
        body = raw if request.pin is None else json.dumps(request.body).encode()
        turn = hint = None
        if request.pin is not None:
            # A follow-up of a stored response carries only the new input: its roles do not say
            # the turn, a session hint may.
            hint = session_hint(headers, **request.hints)
            turn = sessions.next_turn(hint.key) if hint is not None else 2
        chat = request.chat
        messages = None if request.pin is not None else chat.messages
        return Prepared(
            request,
            self.path,
            body,
            tokens,
            turn,
            chat.model,
            messages,
            chat.namespace,
            "POST",
            True,
            request.pin,
            PREFILL_OVERRIDES,
            kv_transfer_params="kv_transfer_params" in request.body,
            turn_key=None if hint is None else hint.key,
        )

    def stream(self, *, keep: bool) -> ResponsesStream:
        return ResponsesStream(self.ids, keep=keep)

    def relay_body(self, answer: bytes, instance: str) -> bytes:
        out = rewrite_ids(answer, self.ids, instance)
        if b"not found" not in out[:512]:
            return out

        def proxy_id(match: re.Match[str]) -> str:
            return f"Response with id '{self.ids.issue(match.group(1), instance)}' not found"

        return _NOT_FOUND.sub(proxy_id, out.decode(errors="replace")).encode()

    def realized_hit(self, answer: bytes) -> int | None:
        """Responses' ``usage.input_tokens_details.cached_tokens`` of a whole answer."""
        return answer_count(answer, "usage", "input_tokens_details", "cached_tokens")

    def output_tokens(self, answer: bytes) -> int:
        return answer_count(answer, "usage", "output_tokens") or 0

    def continuation(
        self, prepared: Prepared[ResponsesRequest], state: StreamState, source: TokenSource
    ) -> Prepared[ResponsesRequest] | None:
        """The request that continues a cut stream on another instance: the input plus every
        item the client received, the last one ``in_progress`` when it was cut inside a message
        or a reasoning (vLLM then continues that message). None — the stream ends with
        ``response.failed`` — when it cannot be continued faithfully: cut inside a function
        call's arguments or in structured output (``text.format`` a JSON schema or object: a
        fresh decoder would restart the schema), a follow-up of a stored response (its history
        lived on the failed instance), or a second cut."""
        request = prepared.request
        if not isinstance(state, ResponsesStream) or not state.keep or state.splice is not None:
            return None
        if request.body is None or request.pin is not None:
            return None
        response, items, sequence = received(state.events)
        if response is None:
            return None
        body = dict(request.body)
        text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
        structured = isinstance(text_format, dict) and text_format.get("type") in ("json_schema", "json_object")
        if structured and any(item.kind == "message" for item in items):
            return None
        open_item = items[-1] if items and not items[-1].done else None
        if open_item is not None and open_item.kind not in ("message", "reasoning"):
            return None
        items_in = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        done = [item.as_input(status="completed") for item in items if item.done]
        tail = [] if open_item is None else [open_item.as_input(status="in_progress")]
        body.update(input=[*items_in, *done, *tail], stream=True, store=False)
        if isinstance(body.get("max_output_tokens"), int):
            body["max_output_tokens"] = max(1, body["max_output_tokens"] - state.deltas)
        continued = self.parse(json.dumps(body).encode())
        if open_item is not None and continued.chat is not None:
            chat = dataclasses.replace(continued.chat, add_generation_prompt=False, continue_final_message=True)
            continued = dataclasses.replace(continued, chat=chat)
        state.splice = Splice(response, items, open_item is not None, sequence, state.tokens)
        state.done = state.finished = False
        assert continued.chat is not None
        tokens = source.routing_tokens(continued.chat)
        chat = continued.chat
        return Prepared(
            continued,
            self.path,
            json.dumps(body).encode(),
            tokens,
            None,
            chat.model,
            chat.messages,
            chat.namespace,
            prefill_overrides=PREFILL_OVERRIDES,
            kv_transfer_params="kv_transfer_params" in body,
        )

    def reject(self, error: RequestError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def fail(self, error: ProxyError) -> web.Response:
        return web.json_response(error.body(), status=error.status)

    def stream_failure(self, error: ProxyError) -> bytes:
        """Responses' own terminal event for a stream the proxy must end."""
        event = {
            "type": "response.failed",
            "sequence_number": -1,
            "response": {
                "object": "response",
                "status": "failed",
                "error": {"code": "server_error", "message": error.message},
            },
        }
        return b"event: response.failed\ndata: " + json.dumps(event).encode() + b"\n\n"
