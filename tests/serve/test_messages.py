"""``POST /v1/messages`` through ``smetric serve``: Anthropic's official SDK against fake engines
(streaming and not, tool use, multi-turn, ``count_tokens``), the conversion vLLM makes, Anthropic's
error shape, PD, and streams cut at every part × cut point (aiohttp stubs that die on purpose).
Every test is bounded in requests and time; servers listen on loopback only."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import anthropic
import pytest
from aiohttp import web
from proxy_util import Stub, colocated_router, metric, pd_router, proxy_for, request

from smetric.anthropic import MessagesRequestError, to_chat
from smetric.fake_engine import FakeEngine
from smetric.serve.apis.messages import MessagesApi
from smetric.serve.config import load_config
from smetric.serve.errors import ProxyError
from smetric.serve.proxy import ProxyServer
from smetric.serve.tokens import TokenConfig, TokenSource, approximate_ids

MODEL = "fake-model"
SYSTEM_TEXT = "You are Claude Code, a careful coding agent. " * 30
TOOLS: list[Any] = [
    {"name": "read_file", "description": "Reads a file.", "input_schema": {"properties": {"path": {"type": "string"}}}}
]


def decision(header: str) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (p.partition("=") for p in header.split("; "))}


def settled(p: ProxyServer) -> None:
    """Every instance's load is back to zero and no lifecycle call came twice."""
    router = colocated_router(p)
    deadline = time.monotonic() + 5
    while router.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert router.stats()["in_flight"] == 0
    assert router.stats()["unknown_request_events"] == 0


def system(session: int) -> list[dict[str, Any]]:
    """Claude Code's system blocks: a per-request billing header (vLLM drops it), then the prompt."""
    return [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2; cch={session}{time.monotonic_ns()};"},
        {"type": "text", "text": SYSTEM_TEXT},
    ]


# -- the conversion ------------------------------------------------------------------------------


def test_a_messages_request_converts_to_the_chat_request_vllm_renders() -> None:
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: a"}, {"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files"}, {"type": "text", "text": ""}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "use ls", "signature": "s"},
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "."}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}]},
                    {"type": "text", "text": "now read it"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                ],
            },
            {"role": "system", "content": "inline reminder"},
        ],
        "tools": [{"name": "ls", "input_schema": {"properties": {}}}],
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    }
    c = to_chat(body)
    assert c.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "reasoning": "use ls",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "."}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "now read it"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            ],
        },
        {"role": "system", "content": "inline reminder"},
    ]
    assert c.tools == [
        {
            "type": "function",
            "function": {
                "name": "ls",
                "description": None,
                "parameters": {"properties": {}, "type": "object"},
            },
        }
    ]
    assert c.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "none"}
    merged = to_chat(body, merge_inline_system=True).messages
    assert merged[0] == {"role": "system", "content": "Be brief.inline reminder"} and merged[-1]["role"] == "user"
    for bad, param in [
        ({**body, "max_tokens": 0}, "max_tokens"),
        ({**body, "messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({**body, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages.0.content"),
        ({**body, "tools": [{"name": "t"}]}, "tools"),
        ({**body, "tool_choice": {"type": "tool"}}, "tool_choice"),
        ({**body, "thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking"),
    ]:
        with pytest.raises(MessagesRequestError) as e:
            to_chat(bad)
        assert e.value.param == param


# -- the official SDK through the proxy ----------------------------------------------------------


def test_the_anthropic_sdk_streams_uses_tools_and_follow_ups_stay_home(fleet: list[FakeEngine]) -> None:
    p = proxy_for([e.url for e in fleet])
    client = anthropic.Anthropic(base_url=p.url, api_key="sk-test", max_retries=0, timeout=30)
    try:
        homes: dict[int, str] = {}
        turns: dict[int, list[Any]] = {}
        for s in range(6):
            turns[s] = [{"role": "user", "content": f"session {s}: fix the failing test " + "context " * 80}]
            kwargs: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": 6,
                "system": system(s),
                "messages": turns[s],
                "tools": TOOLS,
                "tool_choice": {"type": "tool", "name": "read_file"},
            }
            if s % 2:
                with client.messages.stream(**kwargs) as stream:
                    message = stream.get_final_message()
                    header = stream.response.headers["x-smetric-decision"]
            else:
                raw = client.messages.with_raw_response.create(**kwargs)
                message, header = raw.parse(), raw.headers["x-smetric-decision"]
            assert message.stop_reason in ("tool_use", "max_tokens")
            (block,) = message.content
            assert block.type == "tool_use" and block.name == "read_file" and isinstance(block.input, dict)
            assert block.input["text"].startswith("lorem"), "the streamed input_json_delta pieces form the object"
            homes[s] = decision(header)["instance"]
            turns[s] += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "def f(): pass\n" * 20}],
                },
            ]
        assert set(homes.values()) == {e.url for e in fleet}, "first turns use every instance"
        for turn in (2, 3):
            for s in range(6):
                kwargs = {"model": MODEL, "max_tokens": 4, "system": system(s), "messages": turns[s], "tools": TOOLS}
                if (s + turn) % 2:
                    with client.messages.stream(**kwargs) as stream:
                        text = "".join(stream.text_stream)
                        message = stream.get_final_message()
                        header = stream.response.headers["x-smetric-decision"]
                    assert text == message.content[0].text
                else:
                    raw = client.messages.with_raw_response.create(**kwargs)
                    message, header = raw.parse(), raw.headers["x-smetric-decision"]
                d = decision(header)
                assert (d["instance"], d["first_turn"], d["reason"]) == (homes[s], "0", "sticky"), (turn, s, d)
                cached = message.usage.cache_read_input_tokens
                assert cached is not None and cached > 300
                assert int(d["local_hit_tokens"]) == cached, "the router's predicted hit is the engine's"
                assert message.content[0].type == "text" and message.stop_reason == "max_tokens"
                turns[s] += [
                    {"role": "assistant", "content": message.content[0].text},
                    {"role": "user", "content": f"turn {turn}: and now the docs " * 10},
                ]
        counted = client.messages.count_tokens(model=MODEL, system=system(0), messages=turns[0], tools=TOOLS)
        engine = fleet[0] if homes[0] == fleet[0].url else fleet[1]
        status, _, body = request(
            engine.url, "/v1/messages/count_tokens", {"model": MODEL, "system": system(0), "messages": turns[0]}
        )
        assert status == 200 and counted.input_tokens == json.loads(body)["input_tokens"] > 300
        settled(p)
    finally:
        client.close()
        p.stop()


def test_messages_errors_are_in_anthropics_shape_with_its_statuses(fleet: list[FakeEngine]) -> None:
    p = proxy_for([e.url for e in fleet])
    client = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=30)
    try:
        with pytest.raises(anthropic.NotFoundError) as nf:
            client.messages.create(model="no-such-model", max_tokens=3, messages=[{"role": "user", "content": "x"}])
        assert nf.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": "The model `no-such-model` does not exist."},
        }
        for raw in (b"{not json", b'{"model": "fake-model", "messages": []}', b"[]"):
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                status, _, body = request(p.url, path, raw=raw)
                doc = json.loads(body)
                assert status == 400 and doc["type"] == "error", (path, raw, body)
                assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["message"]
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "robot", "content": "x"}])  # type: ignore[typeddict-item]
        settled(p)
    finally:
        client.close()
        p.stop()


def test_no_instance_left_is_anthropics_overloaded_error() -> None:
    async def dead(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        return web.Response(status=503)

    with Stub(dead) as a:
        p = proxy_for([a.url], max_attempts=2)
        try:
            status, _, body = request(
                p.url, "/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
            )
            assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
        finally:
            p.stop()


def test_messages_go_prefill_then_decode_in_pd_mode() -> None:
    ps = [FakeEngine(port=0, role="prefill", speedup=1000).start() for _ in range(2)]
    ds = [FakeEngine(port=0, role="decode", speedup=1000).start() for _ in range(2)]
    cfg = load_config(prefill=[e.url for e in ps], decode=[e.url for e in ds], port=0, engine_load=False)
    try:
        with ProxyServer(cfg) as proxy:
            client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0, timeout=30)
            messages: list[Any] = [{"role": "user", "content": "agent task " * 100}]
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=4, system=SYSTEM_TEXT, messages=messages
            )
            first, d = raw.parse(), decision(raw.headers["x-smetric-decision"])
            assert d["instance"] in [e.url for e in ds] and d["prefill"] in [e.url for e in ps]
            assert first.usage.cache_read_input_tokens, "the decode engine pulled the prefill's KV"
            messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "go on"}]
            with client.messages.stream(model=MODEL, max_tokens=4, system=SYSTEM_TEXT, messages=messages) as stream:
                follow = stream.get_final_message()
                d2 = decision(stream.response.headers["x-smetric-decision"])
            assert follow.stop_reason == "max_tokens" and d2["prefill"] == d["prefill"] and d2["reason"] == "sticky"
            client.close()
            assert pd_router(proxy).stats()["in_flight"] == 0
    finally:
        for e in ps + ds:
            e.stop()


# -- streams cut mid-way -------------------------------------------------------------------------


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _message(part: str) -> list[bytes]:
    """A complete vLLM Messages stream with one content block of ``part``."""
    start = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": MODEL}
    start |= {"stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 0}}
    block: dict[str, Any]
    if part == "text":
        block, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in ("hel", "lo")]
    elif part == "thinking":
        block = {"type": "thinking", "thinking": ""}
        deltas = [{"type": "thinking_delta", "thinking": t} for t in ("hm", "m")]
        deltas.append({"type": "signature_delta", "signature": "sig"})
    else:
        block = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": t} for t in ('{"path": ', '"a.py"}')]
    stop = "tool_use" if part == "tool_use" else "end_turn"
    return [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        *[_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas],
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 2}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]


CUT_POINTS = {"before_block": 1, "inside_block": 3, "after_block": -2}
"""Events of :func:`_message` the client has when the stream is cut (after_block: up to its
``content_block_stop``)."""


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]}).encode() + b"\n\n"


CHAT_CONTINUATION = [
    _chat_chunk({"role": "assistant", "content": ""}),
    _chat_chunk({"content": "lo"}),
    _chat_chunk({"content": " world"}, finish="stop"),
    b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
"""What a healthy engine streams for a continuation over ``/v1/chat/completions``."""


def _stub(events: list[bytes], cut: int | None, received: list[tuple[str, dict[str, Any]]]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if request.path not in ("/v1/messages", "/v1/chat/completions"):
            return web.Response(status=404 if request.path != "/health" else 200)
        received.append((request.path, await request.json()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if request.path == "/v1/chat/completions":
            await resp.write(b"".join(CHAT_CONTINUATION))
        else:
            await resp.write(b"".join(events if cut is None else events[:cut]))
            if cut is not None:
                assert request.transport is not None
                request.transport.abort()  # the engine dies mid-stream
                return resp
        await resp.write_eof()
        return resp

    return handler


def _parsed(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.decode().split("\n\n"):
        if block.strip():
            name_line, data_line = block.split("\n", 1)
            out.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def _cut_stream(events: list[bytes], cut: int) -> tuple[ProxyServer, list[Any], bytes, list[Stub]]:
    """One streamed request through a proxy whose first instance dies after ``events[:cut]``."""
    received: list[tuple[str, dict[str, Any]]] = []
    a, b = Stub(_stub(events, cut, received)).start(), Stub(_stub(events, None, received)).start()
    p = proxy_for([a.url, b.url], policy="round_robin", eject_after=100)
    body = {"model": MODEL, "max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    headers = {"x-api-key": "sk-client", "anthropic-version": "2023-06-01"}
    status, _, raw = request(p.url, "/v1/messages", body, headers=headers)
    assert status == 200
    return p, received, raw, [a, b]


def _delta(index: int, **delta: Any) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _tail(index: int, output_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    """The end of a message continued over chat: the open block closed, vLLM's stop and usage."""
    return [
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


@pytest.mark.parametrize("part", ["text", "thinking", "tool_use"])
@pytest.mark.parametrize("cut_at", sorted(CUT_POINTS))
def test_a_cut_messages_stream_keeps_every_block_and_never_breaks_one(part: str, cut_at: str) -> None:
    cut = CUT_POINTS[cut_at]
    events = _message(part)
    p, received, raw, stubs = _cut_stream(events, cut)
    try:
        got, full = _parsed(raw), _parsed(b"".join(events))
        had = full[:cut]
        assert got[: len(had)] == had, "every event the client had is kept as it was"
        assert [n for n, _ in got].count("message_start") == 1, "one message, never a second opening"
        if cut_at == "before_block":
            assert got == full, "nothing but message_start had reached the client: the answer is whole"
            assert [r[0] for r in received] == ["/v1/messages"] * 2 and received[1] == received[0]
        elif part == "text":
            (path, chat) = received[-1]
            assert path == "/v1/chat/completions"
            so_far = "hel" if cut_at == "inside_block" else "hello"
            assert chat["messages"] == [{"role": "user", "content": "x"}, {"role": "assistant", "content": so_far}]
            assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
            assert chat["max_tokens"] == 9 - (1 if cut_at == "inside_block" else 2), "less the deltas sent"
            if cut_at == "inside_block":  # the open block goes on at its index
                expected = [*had, _delta(0, type="text_delta", text="lo"), _delta(0, type="text_delta", text=" world")]
                assert got == [*expected, *_tail(0, 3)]
            else:  # the client's block was closed: the rest is a new block
                start = (
                    "content_block_start",
                    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
                )
                expected = [
                    *had,
                    start,
                    _delta(1, type="text_delta", text="lo"),
                    _delta(1, type="text_delta", text=" world"),
                ]
                assert got == [*expected, *_tail(1, 4)]
            page = request(p.url, "/metrics", method="GET")[2].decode()  # takes the gateway's records
            assert metric(page, "smetric_proxy_resumed_streams_total") == 1
        else:
            name, error = got[-1]
            assert len(got) == len(had) + 1 and name == "error" and error["type"] == "error", got
            assert error["error"]["type"] == "overloaded_error" and error["error"]["message"]
            page = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_unresumed_streams_total") == 1
        for stub in stubs:
            for seen in stub.seen:
                if seen["path"] == "/v1/messages":
                    forwarded = {k.lower(): v for k, v in seen["headers"].items()}
                    assert forwarded["x-api-key"] == "sk-client" and forwarded["anthropic-version"] == "2023-06-01"
        settled(p)
    finally:
        p.stop()
        for stub in stubs:
            stub.stop()


def test_a_text_block_cut_after_thinking_is_continued_with_the_reasoning_in_the_history() -> None:
    thinking, text = _message("thinking"), _message("text")
    events = [*thinking[:5], *[e.replace(b'"index": 0', b'"index": 1') for e in text[1:3]]]
    p, received, raw, stubs = _cut_stream(events, len(events))
    try:
        got = _parsed(raw)
        path, chat = received[-1]
        assert path == "/v1/chat/completions"
        assert chat["messages"][-1] == {"role": "assistant", "content": "hel", "reasoning": "hmm"}
        assert got[: len(events)] == _parsed(b"".join(events))
        assert got[len(events) :] == [
            _delta(1, type="text_delta", text="lo"),
            _delta(1, type="text_delta", text=" world"),
            *_tail(1, 3 + 2),  # two thinking deltas and "hel" before, two after
        ]
        settled(p)
    finally:
        p.stop()
        for stub in stubs:
            stub.stop()


def test_the_proxys_own_errors_are_anthropics_and_a_stream_ends_with_an_error_event() -> None:
    api = MessagesApi()
    for error, status, kind in [
        (ProxyError.unavailable("gone"), 529, "overloaded_error"),
        (ProxyError.timeout("slow"), 504, "timeout_error"),
        (ProxyError.internal(), 500, "api_error"),
    ]:
        response = api.fail(error)
        assert response.status == status and response.body is not None
        assert json.loads(bytes(response.body)) == {"type": "error", "error": {"type": kind, "message": error.message}}
    event = api.stream_failure(ProxyError.unavailable("cut"))
    assert _parsed(event) == [("error", {"type": "error", "error": {"type": "overloaded_error", "message": "cut"}})]
    state = api.stream(keep=False)
    events = b"".join(_message("text"))
    assert len(state.feed(events[:-5])) == 6 and state.finished and not state.done and state.tokens == 2
    state.feed(events[-5:])
    assert state.done and state.end_marker.startswith(b"event: message_stop\n")


def test_the_sdk_reads_a_continued_stream_as_one_message() -> None:
    received: list[tuple[str, dict[str, Any]]] = []
    events = _message("text")
    with Stub(_stub(events, 3, received)) as a, Stub(_stub(events, None, received)) as b:
        p = proxy_for([a.url, b.url], policy="round_robin", eject_after=100)
        client = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=30)
        try:
            with client.messages.stream(model=MODEL, max_tokens=9, messages=[{"role": "user", "content": "x"}]) as s:
                message = s.get_final_message()
            assert [block.type for block in message.content] == ["text"]
            assert message.content[0].text == "hello world" and message.stop_reason == "end_turn"  # type: ignore[union-attr]
            assert [path for path, _ in received] == ["/v1/messages", "/v1/chat/completions"]
            settled(p)
        finally:
            client.close()
            p.stop()


def test_count_tokens_is_counted_by_an_engine_and_fails_over() -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        return web.Response(status=503 if request.method == "POST" else 200)

    engine = FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=1000).start()
    try:
        with Stub(broken) as dead:
            p = proxy_for([dead.url, engine.url], eject_after=100)
            try:
                body = {"model": MODEL, "system": SYSTEM_TEXT, "messages": [{"role": "user", "content": "count me"}]}
                direct = json.loads(request(engine.url, "/v1/messages/count_tokens", body)[2])["input_tokens"]
                for _ in range(3):
                    status, _, raw = request(p.url, "/v1/messages/count_tokens", body)
                    assert status == 200 and json.loads(raw)["input_tokens"] == direct > 100
                assert any(s["path"] == "/v1/messages/count_tokens" for s in dead.seen), "the dead one was tried"
                assert colocated_router(p).stats()["in_flight"] == 0, "counting is no routed request"
            finally:
                p.stop()
    finally:
        engine.stop()


def test_inline_system_messages_are_merged_when_the_template_wants_system_first() -> None:
    strict = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    lenient = strict.replace("raise_exception('System message must be at the beginning.')", "''")
    body = {
        "model": MODEL,
        "max_tokens": 3,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "a reminder"},
            {"role": "user", "content": "go"},
        ],
    }
    api = MessagesApi()
    request_ = api.parse(json.dumps(body).encode())
    texts = {}
    for name, template in (("strict", strict), ("lenient", lenient)):
        source = TokenSource(TokenConfig(mode="approximate", chat_template=template))
        texts[name] = api.routing_tokens(source, request_).ids.tobytes()
        assert source.requires_leading_system(tools=False) is (name == "strict")
    merged = TokenSource(TokenConfig(mode="approximate", chat_template=lenient)).render(
        dataclasses.replace(request_.chat, messages=to_chat(body, merge_inline_system=True).messages)
    )
    assert texts["strict"] != texts["lenient"]
    assert texts["strict"] == approximate_ids(merged).tobytes(), "rendered as vLLM merges it: system first"
