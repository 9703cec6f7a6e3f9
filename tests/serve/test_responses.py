"""``/v1/responses`` through ``smetric serve``: the adapter on its own (vLLM's item → message
conversion, the proxy's pinned ids), then the official ``openai`` SDK against fake engines —
Responses streamed and not, tool use, multi-turn with the whole history (first turns spread,
follow-ups sticky), a ``previous_response_id`` chain through two proxy replicas used alternately,
and its clean failure once its instance is killed; chat completions through the SDK too."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from proxy_util import TIMEOUT_S, Stub, request

from smetric._core import SessionTable
from smetric.fake_engine import FakeEngine
from smetric.fake_engine.responses import RESPONSES, input_messages
from smetric.serve.apis.base import Route
from smetric.serve.apis.responses import ResponsesApi, ResponsesStream, chat_messages, rewrite_ids
from smetric.serve.config import load_config
from smetric.serve.pinning import ResponseIds, instance_tag
from smetric.serve.proxy import ProxyServer
from smetric.serve.request import RequestError
from smetric.serve.tokens import TokenConfig, TokenSource

openai = pytest.importorskip("openai")

KEY = "test-replicas-share-this-key"
A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


# -- the adapter on its own ---------------------------------------------------------------------


def test_input_items_become_the_chat_messages_vllm_renders() -> None:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "use ls"}]},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": '{"cmd":"ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "one file"}]},
        {"role": "user", "content": "thanks"},
    ]
    messages = chat_messages("be brief", items)
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1] == items[0]  # a user item is kept as it is
    # reasoning, then both calls merged into one assistant message
    assert messages[2]["reasoning"] == "use ls" and [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "sh", "arguments": '{"cmd":"ls"}'}
    assert messages[3] == {"role": "tool", "content": "a.txt", "tool_call_id": "c1"}
    assert messages[4] == {"role": "assistant", "content": "one file"}
    assert messages[5] == {"role": "user", "content": "thanks"}
    assert chat_messages(None, "hi") == [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError, match="Unsupported input item type: bogus"):
        chat_messages(None, [{"type": "bogus"}])
    with pytest.raises(RequestError, match="Encrypted content"):
        chat_messages(None, [{"type": "reasoning", "encrypted_content": "x", "summary": []}])


def test_the_proxy_and_the_fake_engine_convert_items_alike() -> None:
    """Two conversions written apart (the proxy's, the fake engine's) agree on every item kind."""
    items: list[dict[str, Any]] = [
        {"type": "function_call", "call_id": "c0", "name": "f", "arguments": "{}"},  # opens a turn
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}], "summary": []},
        {"type": "function_call_output", "call_id": "c0", "output": "ok"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
        {"role": "assistant", "content": "said"},
        {"role": "assistant", "content": "said twice"},
        {"type": "message", "role": "developer", "content": "dev"},
    ]
    assert chat_messages(None, json.loads(json.dumps(items))) == input_messages(json.loads(json.dumps(items)))


def test_proxy_ids_carry_their_instance_and_cannot_be_forged() -> None:
    ids = ResponseIds(KEY)
    issued = ids.issue("resp_abc", A)
    opened = ids.open(issued)
    assert opened is not None and opened.engine_id == "resp_abc" and opened.tag == instance_tag(A)
    assert ResponseIds(KEY).open(issued) == opened  # another replica with the key opens it
    assert ResponseIds("another key").open(issued) is None
    engine, _, mac = issued.rsplit("-", 2)
    assert ids.open(f"{engine}-{instance_tag(B)}-{mac}") is None  # retargeted: the mac breaks
    assert ids.open("resp_abc") is None and ids.open("") is None


def test_a_follow_up_of_a_stored_response_is_pinned_and_forwarded_with_the_engines_id() -> None:
    api = ResponsesApi(ResponseIds(KEY))
    proxy_id = api.ids.issue("resp_prev", B)
    raw = json.dumps({"model": "m", "input": "next", "previous_response_id": proxy_id}).encode()
    req = api.parse(raw)
    source = TokenSource(TokenConfig(mode="approximate"))
    prepared = api.prepare(req, raw, api.routing_tokens(source, req), {}, SessionTable())
    assert prepared.pin == instance_tag(B) and prepared.routed
    assert json.loads(prepared.body)["previous_response_id"] == "resp_prev"
    forged = json.dumps({"input": "x", "previous_response_id": "resp_prev"}).encode()
    with pytest.raises(RequestError) as e:
        api.parse(forged)
    assert e.value.status == 404 and "not found" in e.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1]", None),
        (b'{"model": "m"}', "input"),
        (b'{"input": 3}', "input"),
        (b'{"input": ["x"]}', "input"),
        (b'{"input": [{"type": "bogus"}]}', "input"),
        (b'{"input": [{"type": "function_call", "call_id": "c"}]}', "input"),
        (b'{"input": "x", "tools": {}}', "tools"),
        (b'{"input": "x", "max_output_tokens": 0}', "max_output_tokens"),
        (b'{"input": "x", "stream": "yes"}', "stream"),
        (b'{"input": "x", "previous_response_id": 7}', "previous_response_id"),
    ],
)
def test_bad_bodies_are_400s_in_openais_shape(body: bytes, param: str | None) -> None:
    api = ResponsesApi(ResponseIds(KEY))
    with pytest.raises(RequestError) as e:
        api.parse(body)
    assert e.value.status == 400 and e.value.param == param
    answer = api.reject(e.value)
    assert answer.status == 400 and answer.body is not None
    assert json.loads(bytes(answer.body))["error"]["param"] == param


def test_a_stored_responses_route_with_a_forged_id_is_vllms_404() -> None:
    api = ResponsesApi(ResponseIds(KEY))
    for route in api.routes()[1:]:
        with pytest.raises(RequestError) as e:
            api.parse_route(b"", route, {"response_id": "resp_guess"}, "")
        assert e.value.status == 404 and e.value.message == "Response with id 'resp_guess' not found."
    good = api.ids.issue("resp_1", A)
    get = api.parse_route(b"", Route("GET", "/v1/responses/{response_id}"), {"response_id": good}, "stream=true")
    assert get.engine_path == "/v1/responses/resp_1?stream=true" and get.pin == instance_tag(A)


def test_answers_and_stream_events_show_the_proxys_ids() -> None:
    ids = ResponseIds(KEY)
    body = b'{"id":"resp_1","previous_response_id":"resp_0","output":[{"id":"msg_1","type":"message"}]}'
    out = json.loads(rewrite_ids(body, ids, A))
    assert out["id"] == ids.issue("resp_1", A) and out["previous_response_id"] == ids.issue("resp_0", A)
    assert out["output"][0]["id"] == "msg_1"
    state = ResponsesStream(ids)
    state.begin(A)
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1"}}\n\n'
    completed = (
        b'event: response.completed\ndata: {"type":"response.completed",'
        b'"response":{"id":"resp_1","usage":{"output_tokens":3}}}\n\n'
    )
    events = state.feed(created + completed[:30])
    assert ids.issue("resp_1", A).encode() in state.outgoing(b"", events) and not state.done
    state.feed(completed[30:])
    assert state.done and state.tokens == 3


# -- through the proxy, with the official SDK ---------------------------------------------------


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeEngine]]:
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    engines = [FakeEngine(port=0, speedup=1000).start() for _ in range(2)]
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def proxy(engines: list[FakeEngine], **overrides: Any) -> ProxyServer:
    urls = [e.url for e in engines]
    return ProxyServer(load_config(instances=urls, port=0, response_id_key=KEY, **overrides)).start()


def client(server: ProxyServer) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S)


def decision(headers: Any) -> dict[str, str]:
    pairs = (p.split("=", 1) for p in headers["x-smetric-decision"].split("; "))
    return {k: v for k, v in pairs}


def test_the_openai_sdk_works_through_the_proxy_streamed_and_not_with_tools(fleet: list[FakeEngine]) -> None:
    with proxy(fleet) as server, client(server) as sdk:
        whole = sdk.responses.create(model="fake-model", input="hello there", max_output_tokens=8)
        assert whole.status == "incomplete" and whole.output_text and whole.usage.output_tokens == 8
        assert whole.id.rsplit("-", 2)[1] in {instance_tag(e.url) for e in fleet}
        with sdk.responses.stream(model="fake-model", input="stream me") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        assert deltas and final.status == "completed" and final.output_text == "".join(deltas)
        cut = list(sdk.responses.create(model="fake-model", input="short", max_output_tokens=3, stream=True))
        assert [e.type for e in cut].count("response.output_text.delta") == 3
        assert cut[-1].type == "response.incomplete" and cut[-1].response.id.startswith("resp_")
        assert final.id.rsplit("-", 2)[1] in {instance_tag(e.url) for e in fleet}
        tools = [{"type": "function", "name": "sh", "description": "run", "parameters": {"type": "object"}}]
        history: list[Any] = [
            {"role": "user", "content": "list the files"},
            {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt b.txt"},
        ]
        answer = sdk.responses.create(model="fake-model", input=history, tools=tools, store=False)
        assert answer.status == "completed" and answer.output_text
        chat = sdk.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content
        chunks = sdk.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi again"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_first_turns_spread_and_follow_ups_stick_with_the_whole_history(fleet: list[FakeEngine]) -> None:
    with proxy(fleet) as server, client(server) as sdk:
        raw = sdk.responses.with_raw_response
        homes = {}
        histories: dict[int, list[Any]] = {}
        for s in range(6):
            histories[s] = [{"role": "user", "content": f"session {s}: " + "context " * 40}]
            r = raw.create(model="fake-model", input=histories[s], store=False, max_output_tokens=4)
            homes[s] = decision(r.headers)["instance"]
            assert decision(r.headers)["first_turn"] == "1"
            histories[s] += [{"role": "assistant", "content": r.parse().output_text}]
        assert len(set(homes.values())) == 2  # first turns spread over both instances
        for s in range(6):
            histories[s] += [{"role": "user", "content": "and then?"}]
            r = raw.create(model="fake-model", input=histories[s], store=False, max_output_tokens=4)
            assert decision(r.headers)["instance"] == homes[s] and decision(r.headers)["first_turn"] == "0"


def test_a_previous_response_id_chain_alternates_replicas_then_fails_cleanly(fleet: list[FakeEngine]) -> None:
    with proxy(fleet) as one, proxy(fleet) as two, client(one) as first_sdk, client(two) as second_sdk:
        sdks = [first_sdk, second_sdk]
        first = sdks[0].responses.create(model="fake-model", input="remember 7", max_output_tokens=4)
        home = first.id.rsplit("-", 2)[1]
        previous = first
        for turn in range(1, 5):  # replicas alternate; every follow-up reaches the one instance
            previous = sdks[turn % 2].responses.create(
                model="fake-model", input=f"turn {turn}", previous_response_id=previous.id, max_output_tokens=4
            )
            assert previous.id.rsplit("-", 2)[1] == home and previous.status == "incomplete"
        # the stored response's own routes, through the other replica
        got = sdks[1].responses.retrieve(previous.id)
        assert got.id == previous.id and got.output_text == previous.output_text
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            sdks[0].responses.cancel(previous.id)
        status, _, _ = request(one.url, f"/v1/responses/{previous.id}", method="DELETE")
        assert status == 405  # vLLM 0.32 serves no DELETE: the engine's answer, from the right instance
        # a forged id: vLLM's own 404, no instance asked
        engine_id = previous.id.rsplit("-", 2)[0]
        with pytest.raises(openai.NotFoundError, match="not found"):
            sdks[0].responses.create(model="fake-model", input="x", previous_response_id=engine_id)
        # the instance holding the chain dies: a clear error that says the response is lost
        victim = next(e for e in fleet if instance_tag(e.url) == home)
        victim.stop()
        for sdk in sdks:
            with pytest.raises(openai.APIStatusError) as e:
                sdk.responses.create(
                    model="fake-model", input="still there?", previous_response_id=previous.id, max_output_tokens=4
                )
            assert e.value.status_code in (404, 503) and "lost" in str(e.value.message)
        # a conversation without a stored response is still served by the instance left
        alive = sdks[0].responses.create(model="fake-model", input="fresh start", max_output_tokens=4)
        assert alive.id.rsplit("-", 2)[1] != home


# -- the pass-through -----------------------------------------------------------------------------

FORWARDED = [
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/score"),
    ("POST", "/pooling"),
    ("GET", "/v1/models/fake-model"),
]


def test_the_rest_of_vllms_surface_passes_through_to_the_least_loaded_instance() -> None:
    release = threading.Event()

    def stub(name: str) -> Stub:
        async def handler(request: web.Request) -> web.StreamResponse:
            if request.path == "/v1/models":
                return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            if request.path == "/kv_event_sources":
                return web.json_response({})
            if request.path == "/v1/chat/completions":  # held open: its instance is loaded
                await asyncio.to_thread(release.wait, TIMEOUT_S)
                return web.json_response({"choices": [], "usage": {"completion_tokens": 1}})
            body = (await request.read()).decode()
            return web.json_response({"at": name, "method": request.method, "path": request.path_qs, "body": body})

        return Stub(handler).start()

    stubs = [stub("a"), stub("b")]
    server = ProxyServer(load_config(instances=[s.url for s in stubs], port=0)).start()
    try:
        for method, path in FORWARDED:
            raw = b'{"model": "fake-model", "input": "x",  "odd": [1,2]}' if method == "POST" else None
            status, headers, body = request(server.url, path + "?q=1", raw=raw, method=method)
            answer = json.loads(body)
            assert status == 200 and answer["method"] == method and answer["path"] == path + "?q=1"
            assert answer["body"] == (raw or b"").decode()  # byte for byte
            assert "reason=pass-through" in headers["x-smetric-decision"]
        # a chat request held on one instance: the next pass-through goes to the other
        held = threading.Thread(
            target=request, args=(server.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
        )
        held.start()
        deadline = time.monotonic() + TIMEOUT_S
        while not any(seen["path"] == "/v1/chat/completions" for s in stubs for seen in s.seen):
            assert time.monotonic() < deadline, "the chat request never reached an instance"
            time.sleep(0.01)
        busy = next(i for i, s in enumerate(stubs) if any(x["path"] == "/v1/chat/completions" for x in s.seen))
        for _ in range(3):
            _, _, body = request(server.url, "/v1/embeddings", {"model": "fake-model", "input": "y"})
            assert json.loads(body)["at"] == "ab"[1 - busy]
        release.set()
        held.join(TIMEOUT_S)
        for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/whatever")):
            status, _, body = request(server.url, path, method=method, raw=b"{}" if method == "POST" else None)
            error = json.loads(body)["error"]
            assert status == 404 and error["type"] == "NotFoundError" and "no such route" in error["message"]
        status, headers, body = request(server.url, "/v1/chat/completions", method="GET")
        assert status == 405 and headers["allow"] == "POST" and json.loads(body)["error"]["message"]
    finally:
        release.set()
        server.stop()
        for s in stubs:
            s.stop()


def test_responses_in_pd_mode_prefill_then_decode_and_a_stored_chain_stays_on_its_decode_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    ps = [FakeEngine(port=0, role="prefill", speedup=1000).start() for _ in range(2)]
    ds = [FakeEngine(port=0, role="decode", speedup=1000).start() for _ in range(2)]
    cfg = load_config(
        prefill=[e.url for e in ps], decode=[e.url for e in ds], port=0, engine_load=False, response_id_key=KEY
    )
    try:
        with ProxyServer(cfg) as server, client(server) as sdk:
            raw = sdk.responses.with_raw_response.create(
                model="fake-model", input="agent context " * 100, max_output_tokens=4
            )
            first = raw.parse()
            d = decision(raw.headers)
            assert d["prefill"] in [e.url for e in ps] and d["instance"] in [e.url for e in ds]
            assert first.usage.input_tokens_details.cached_tokens > 0, "the decode instance pulled the KV"
            assert first.id.rsplit("-", 2)[1] == instance_tag(d["instance"]), "stored where it was decoded"
            assert all(not e.stack.app[RESPONSES].responses for e in ps), "a prefill leg stores nothing"
            follow = sdk.responses.create(
                model="fake-model", input="go on", previous_response_id=first.id, max_output_tokens=4, stream=True
            )
            events = list(follow)
            assert events[-1].type == "response.incomplete"
            assert events[-1].response.id.rsplit("-", 2)[1] == instance_tag(d["instance"])
            assert sdk.responses.retrieve(first.id).output_text == first.output_text
    finally:
        for engine in ps + ds:
            engine.stop()
