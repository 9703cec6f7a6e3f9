"""A Responses stream cut mid-way (issue 19 item 4): per part — text, reasoning, function call,
structured output — and per cut point, the client's stream is either continued on another
instance into one well-formed stream holding everything exactly once, or ended with
``response.failed`` (a function call's arguments, structured output: never continued). The
engines are scripted: the first answer is cut after ``k`` events, the second continues it as vLLM
continues an ``in_progress`` last item. Then once through the proxy with the SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from proxy_util import TIMEOUT_S, Stub, metric, request

from smetric._core import SessionTable
from smetric.serve.apis.responses import ResponsesApi, ResponsesStream
from smetric.serve.config import load_config
from smetric.serve.pinning import ResponseIds
from smetric.serve.proxy import ProxyServer
from smetric.serve.tokens import TokenConfig, TokenSource

openai = pytest.importorskip("openai")

SOURCE = TokenSource(TokenConfig(mode="approximate"))
A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
Part = tuple[str, str]
"""(item kind, its text or arguments)."""

DELTA = {"message": "output_text", "reasoning": "reasoning_text", "function_call": "function_call_arguments"}


def engine_stream(resp_id: str, parts: list[Part], *, first_id: str | None = None) -> list[bytes]:
    """The events vLLM streams for ``parts`` (each text in 3-character deltas)."""
    seq = 0
    out: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        nonlocal seq
        out.append(
            f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, "sequence_number": seq, **fields}).encode()
        )
        seq += 1

    response = {
        "id": resp_id,
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": "in_progress",
        "output": [],
    }
    emit("response.created", response=response)
    emit("response.in_progress", response=response)
    done_items = []
    for index, (kind, text) in enumerate(parts):
        item_id = first_id if index == 0 and first_id else f"{kind[:2]}_{resp_id}_{index}"
        if kind == "function_call":
            item = {
                "id": item_id,
                "type": kind,
                "call_id": f"call_{index}",
                "name": "sh",
                "arguments": "",
                "status": "in_progress",
            }
        elif kind == "reasoning":
            item = {"id": item_id, "type": kind, "summary": [], "content": [], "status": "in_progress"}
        else:
            item = {"id": item_id, "type": kind, "role": "assistant", "content": [], "status": "in_progress"}
        emit("response.output_item.added", output_index=index, item=item)
        where = {"item_id": item_id, "output_index": index}
        part = {"type": "reasoning_text" if kind == "reasoning" else "output_text", "text": ""}
        if kind != "function_call":
            emit("response.content_part.added", content_index=0, part=part, **where)
        for i in range(0, len(text), 3):
            emit(
                f"response.{DELTA[kind]}.delta",
                delta=text[i : i + 3],
                **where,
                **({} if kind == "function_call" else {"content_index": 0}),
            )
        if kind == "function_call":
            emit("response.function_call_arguments.done", arguments=text, **where)
            final = {**item, "arguments": text, "status": "completed"}
        else:
            emit(f"response.{DELTA[kind]}.done", text=text, content_index=0, **where)
            emit("response.content_part.done", content_index=0, part={**part, "text": text}, **where)
            final = {**item, "content": [{**part, "text": text}], "status": "completed"}
        emit("response.output_item.done", output_index=index, item=final)
        done_items.append(final)
    deltas = sum(-(-len(t) // 3) for _, t in parts)
    usage = {"input_tokens": 10, "output_tokens": deltas, "total_tokens": 10 + deltas}
    emit("response.completed", response={**response, "status": "completed", "output": done_items, "usage": usage})
    return out


def relay(state: ResponsesStream, events: list[bytes]) -> list[dict[str, Any]]:
    """What the client receives for ``events`` (as the relay writes them)."""
    sent = state.outgoing(b"", state.feed(b"".join(e + b"\n\n" for e in events)))
    return [json.loads(block.partition(b"data: ")[2]) for block in sent.split(b"\n\n") if block]


def check_well_formed(stream: list[dict[str, Any]], parts: list[Part]) -> None:
    """One created, sequence numbers 0, 1, 2, …, every item added and done once with its whole
    text, and a final response holding every item under the created response's id."""
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    assert [e["type"] for e in stream].count("response.created") == 1
    assert stream[-1]["type"] == "response.completed"
    assert stream[-1]["response"]["id"] == stream[0]["response"]["id"]
    added = [e for e in stream if e["type"] == "response.output_item.added"]
    done = [e for e in stream if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [e["output_index"] for e in done] == list(range(len(parts)))
    for index, (kind, text) in enumerate(parts):
        item_id = added[index]["item"]["id"]
        deltas = [e for e in stream if e["type"].endswith(".delta") and e["output_index"] == index]
        assert all(e["item_id"] == item_id for e in deltas)
        assert "".join(e["delta"] for e in deltas) == text, (kind, "each piece exactly once")
        openings = [e for e in stream if e["type"] == "response.content_part.added" and e["output_index"] == index]
        assert len(openings) == (0 if kind == "function_call" else 1)
        for e in stream:
            if e.get("output_index") == index and e["type"] in (
                "response.output_text.done",
                "response.reasoning_text.done",
            ):
                assert e["text"] == text and e["item_id"] == item_id
            if e.get("output_index") == index and e["type"] == "response.content_part.done":
                assert e["part"]["text"] == text
        final = done[index]["item"]
        assert final["id"] == item_id
        assert (final["arguments"] if kind == "function_call" else final["content"][0]["text"]) == text
    assert stream[-1]["response"]["output"] == [e["item"] for e in done]


def first_request(api: ResponsesApi, **extra: Any) -> Any:
    raw = json.dumps({"model": "m", "input": "go", "stream": True, **extra}).encode()
    req = api.parse(raw)
    return api.prepare(req, raw, api.routing_tokens(SOURCE, req), {}, SessionTable())


CASES = {
    "text": [("message", "hello there, general kenobi")],
    "reasoning": [("reasoning", "think about it first"), ("message", "the answer")],
    "function call": [("reasoning", "need a tool"), ("function_call", '{"cmd": "ls -la"}')],
    "structured output": [("message", '{"name": "x", "age": 3}')],
}


def cut_points(parts: list[Part]) -> dict[str, int]:
    """Where to cut the first answer (events the client receives before the cut)."""
    events = [json.loads(e.partition(b"data: ")[2]) for e in engine_stream("resp_x", parts)]
    last = len(parts) - 1
    inside = next(i for i, e in enumerate(events) if e["type"].endswith(".delta") and e["output_index"] == last) + 2
    after_first = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done") + 1
    return {"before any item": 2, "inside the last part": inside, "after the first item": after_first}


@pytest.mark.parametrize("part", list(CASES))
@pytest.mark.parametrize("cut", ["before any item", "inside the last part", "after the first item"])
def test_a_cut_stream_is_continued_whole_or_ended_with_response_failed(part: str, cut: str) -> None:
    parts = CASES[part]
    api = ResponsesApi(ResponseIds("k"))
    extra = (
        {"text": {"format": {"type": "json_schema", "name": "p", "schema": {}}}} if part == "structured output" else {}
    )
    prepared = first_request(api, **extra)
    whole = engine_stream("resp_a", parts)
    k = cut_points(parts)[cut]
    state = api.stream(keep=True)
    state.begin(A)
    client = relay(state, whole[:k])
    continued = api.continuation(prepared, state, SOURCE)
    _, _, items_seen = client, None, [e for e in client if e["type"] == "response.output_item.added"]
    open_kind = None
    if items_seen and not any(
        e["type"] == "response.output_item.done" and e["output_index"] == items_seen[-1]["output_index"] for e in client
    ):
        open_kind = items_seen[-1]["item"]["type"]
    structured_started = part == "structured output" and bool(items_seen)
    if open_kind == "function_call" or structured_started:
        assert continued is None  # the failover ends the stream with response.failed
        failure = api.stream_failure(
            __import__("smetric.serve.errors", fromlist=["ProxyError"]).ProxyError.unavailable("cut")
        )
        assert (
            failure.startswith(b"event: response.failed\n")
            and json.loads(failure.partition(b"data: ")[2])["response"]["status"] == "failed"
        )
        return
    assert continued is not None
    body = json.loads(continued.body)
    assert body["stream"] is True and body["store"] is False
    received_text = {i: "" for i in range(len(parts))}
    for e in client:
        if e["type"].endswith(".delta"):
            received_text[e["output_index"]] += e["delta"]
    if open_kind is not None:
        assert body["input"][-1]["status"] == "in_progress"
        assert continued.request.chat.continue_final_message
    # the second engine continues: the open part's rest first, then the parts not yet begun
    begun = len(items_seen)
    rest: list[Part] = []
    if open_kind is not None:
        index = begun - 1
        rest.append((parts[index][0], parts[index][1][len(received_text[index]) :]))
    rest += parts[begun:]
    state.begin(B)
    client += relay(state, engine_stream("resp_b", rest))
    check_well_formed(client, parts)
    assert state.done


def test_a_second_cut_or_a_stored_follow_up_is_not_continued() -> None:
    api = ResponsesApi(ResponseIds("k"))
    state = api.stream(keep=True)
    state.begin(A)
    relay(state, engine_stream("resp_a", CASES["text"])[:5])
    assert api.continuation(first_request(api), state, SOURCE) is not None
    assert api.continuation(first_request(api), state, SOURCE) is None  # one splice per stream
    pinned = first_request(api, previous_response_id=api.ids.issue("resp_0", A))
    fresh = api.stream(keep=True)
    fresh.begin(A)
    relay(fresh, engine_stream("resp_a", CASES["text"])[:5])
    assert api.continuation(pinned, fresh, SOURCE) is None


def test_through_the_proxy_a_cut_text_stream_reaches_the_sdk_whole_and_a_cut_call_fails() -> None:
    parts: dict[str, list[Part]] = {"text": CASES["text"], "call": CASES["function call"]}
    served: list[str] = []

    def stub(dies: bool) -> Stub:
        async def handler(request: web.Request) -> web.StreamResponse:
            if request.path == "/v1/models":
                return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
            if request.path != "/v1/responses":
                return web.json_response({})
            body = await request.json()
            served.append(json.dumps(body))
            which = "call" if body.get("metadata", {}).get("part") == "call" else "text"
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if dies:
                events = engine_stream("resp_a", parts[which])
                await resp.write(
                    b"".join(e + b"\n\n" for e in events[: cut_points(parts[which])["inside the last part"]])
                )
                await asyncio.sleep(0)
                assert request.transport is not None
                request.transport.abort()  # the engine dies mid-stream
                return resp
            last = body["input"][-1]
            done_text = last["content"][0]["text"] if last.get("status") == "in_progress" else ""
            rest = [("message", parts["text"][0][1][len(done_text) :])]
            await resp.write(b"".join(e + b"\n\n" for e in engine_stream("resp_b", rest)))
            await resp.write_eof()
            return resp

        return Stub(handler).start()

    dying, healthy = stub(True), stub(False)
    # the dying stub is the only instance at first: every first attempt is cut there
    server = ProxyServer(load_config(instances=[dying.url, healthy.url], port=0, policy="round_robin")).start()
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
    try:
        outcomes: dict[str, list[Any]] = {}
        for which in ("text", "call"):
            for _ in range(2):  # round-robin: one of the two first attempts lands on the dying stub
                events = list(sdk.responses.create(model="m", input="go", stream=True, metadata={"part": which}))
                if any(e.type == "response.failed" for e in events) or (len(served) and "in_progress" in served[-1]):
                    outcomes[which] = events
                    break
                outcomes.setdefault(which, events)
        text = outcomes["text"]
        assert text[-1].type == "response.completed"
        assert text[-1].response.output_text == parts["text"][0][1]
        assert "".join(e.delta for e in text if e.type == "response.output_text.delta") == parts["text"][0][1]
        call = outcomes["call"]
        assert call[-1].type == "response.failed"
        assert not any(e.type == "response.function_call_arguments.done" for e in call)  # no broken call delivered
        page = request(server.url, "/metrics", method="GET")[2].decode()  # takes the gateway's records
        assert metric(page, "smetric_proxy_resumed_streams_total") >= 1
        assert metric(page, "smetric_proxy_unresumed_streams_total") == 1  # the cut call, counted
    finally:
        sdk.close()
        server.stop()
        dying.stop()
        healthy.stop()


def _client_events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(block.partition(b"data: ")[2]) for block in raw.split(b"\n\n") if block.strip()]


@pytest.mark.parametrize("part", list(CASES))
@pytest.mark.parametrize("cut", ["before any item", "inside the last part", "after the first item"])
def test_the_gateway_continues_a_cut_stream_natively_as_the_app_would(part: str, cut: str) -> None:
    """The matrix above through the compiled plane's native continuation: the engine that takes
    the first attempt dies after ``k`` events, the other continues what the continuation's input
    asks for; the client's stream is one well-formed stream (the proxy's ids, the sequence
    numbers and indices following on) or ends with ``response.failed``, and the gateway, not the
    app, served it."""
    parts = CASES[part]
    extra = (
        {"text": {"format": {"type": "json_schema", "name": "p", "schema": {}}}} if part == "structured output" else {}
    )
    whole = engine_stream("resp_a", parts)
    k = cut_points(parts)[cut]
    # What the client has at the cut, and so what the second engine streams (as the matrix above).
    api = ResponsesApi(ResponseIds("k"))
    state = api.stream(keep=True)
    state.begin(A)
    had = relay(state, whole[:k])
    continued = api.continuation(first_request(api, **extra), state, SOURCE)
    seen = [e for e in had if e["type"] == "response.output_item.added"]
    received_text = {i: "" for i in range(len(parts))}
    for e in had:
        if e["type"].endswith(".delta"):
            received_text[e["output_index"]] += e["delta"]
    closed = {e["output_index"] for e in had if e["type"] == "response.output_item.done"}
    rest: list[Part] = []
    if seen and seen[-1]["output_index"] not in closed:
        index = len(seen) - 1
        rest.append((parts[index][0], parts[index][1][len(received_text[index]) :]))
    rest += parts[len(seen) :]
    bodies: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/responses":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        body = await request.json()
        bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if body["input"] == "go":  # the first attempt: cut after k events
            await resp.write(b"".join(e + b"\n\n" for e in whole[:k]))
            await asyncio.sleep(0)
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(b"".join(e + b"\n\n" for e in engine_stream("resp_b", rest)))
        await resp.write_eof()
        return resp

    with Stub(handler) as a, Stub(handler) as b:
        instances = [{"url": u, "kv_events": "off"} for u in (a.url, b.url)]
        config = load_config(instances=instances, port=0, policy="round_robin", eject_after=100)
        server = ProxyServer(config).start()
        try:
            first = {"model": "m", "input": "go", "stream": True, **extra}
            status, _, raw = request(server.url, "/v1/responses", first)
            assert status == 200
            client = _client_events(raw)
            page = request(server.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_native_requests_total", api="responses") == 1
            if continued is None:
                assert client[-1]["type"] == "response.failed" and len(bodies) == 1
                assert metric(page, "smetric_proxy_unresumed_streams_total") == 1
                return
            assert metric(page, "smetric_proxy_resumed_streams_total") == 1
            assert bodies[1] == json.loads(continued.body), "the app's continuation request, field for field"
            check_well_formed(client, parts)
            assert client[0]["response"]["id"].startswith("resp_a-"), "the proxy's id for the first engine's"
        finally:
            server.stop()
