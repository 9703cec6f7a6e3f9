"""A chat or completions stream cut mid-way (issue 19 item 4), through the proxy: per API, per
part — text, reasoning, tool call, structured output — and per cut point, the client's stream is
either continued on another instance into one well-formed stream holding every piece exactly
once, or ended with OpenAI's SSE error chunk then ``[DONE]`` and counted in
``proxy_unresumed_streams_total`` — never a broken or duplicated tool call.

The engines are scripted stubs (all alike): a request's first attempt streams its case's script
up to the cut and dies (the connection aborted); a continuation is answered from what the request
puts back (the final assistant message's text and reasoning, or the prompt's tail), so a
continuation that put back the wrong thing gets the wrong rest and fails the checks. Completions
have no reasoning or tool-call fields: there a model's thinking and calls are plain text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from proxy_util import TIMEOUT_S, Stub, colocated_router, events, metric, request

from smetric._core import SessionTable
from smetric.serve.apis.chat import ChatApi
from smetric.serve.apis.completions import CompletionsApi
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer
from smetric.serve.tokens import TokenConfig, TokenSource

Delta = tuple[str, Any]
"""``("content", text)``, ``("reasoning", text)`` or ``("tool", a delta.tool_calls entry)``."""

CALL_OPENING = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "sh", "arguments": ""}}
CHAT: dict[str, list[Delta]] = {
    "text": [("content", p) for p in ("Hel", "lo, ", "wor", "ld, ", "fri", "end")],
    "reasoning": [
        ("reasoning", "Let me "),
        ("reasoning", "think."),
        ("content", "The "),
        ("content", "answer "),
        ("content", "is "),
        ("content", "42."),
    ],
    "tool call": [
        ("content", "Run"),
        ("content", "ning: "),
        ("tool", CALL_OPENING),
        ("tool", {"index": 0, "function": {"arguments": '{"cmd"'}}),
        ("tool", {"index": 0, "function": {"arguments": ': "ls'}}),
        ("tool", {"index": 0, "function": {"arguments": ' -la"}'}}),
    ],
    "structured output": [("content", p) for p in ('{"na', 'me": ', '"x", ', '"ag', 'e": 3', "}")],
}
COMPLETIONS: dict[str, list[Delta]] = {
    "text": CHAT["text"],
    "reasoning": [("content", p) for p in ("<think>", "Let me ", "think.", "</think>", "The ", "answer 42.")],
    "tool call": [
        ("content", p)
        for p in ("Run: ", "<tool_call>", '{"name": "sh", ', '"arguments": ', '{"cmd": "ls"}}', "</tool_call>")
    ],
    "structured output": CHAT["structured output"],
}
STRUCTURED = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}}
CUTS = {"first chunk": 1, "middle": 3, "just before the end": 6}
"""Deltas the client receives before the cut (every script has 6)."""

CONTINUED, ENDED = "continued", "ended with an error"
EXPECTED = {
    ("chat", "text"): (CONTINUED, CONTINUED, CONTINUED),
    ("chat", "reasoning"): (ENDED, CONTINUED, CONTINUED),  # inside the reasoning; then in the text after it
    ("chat", "tool call"): (CONTINUED, ENDED, ENDED),  # in the text before the call; then inside the call
    ("chat", "structured output"): (ENDED, ENDED, ENDED),
    ("completions", "text"): (CONTINUED, CONTINUED, CONTINUED),
    ("completions", "reasoning"): (CONTINUED, CONTINUED, CONTINUED),
    ("completions", "tool call"): (CONTINUED, CONTINUED, CONTINUED),
    ("completions", "structured output"): (ENDED, ENDED, ENDED),
}
MAX_TOKENS = 50
PROMPT = "Say it: "


def chunk(api: str, delta: Delta | None, finish: str | None = None, rid: str = "cmpl-0") -> bytes:
    """One vLLM stream event (``delta`` None: chat's opening role chunk, or the finish chunk)."""
    if api == "chat":
        if delta is None:
            body: dict[str, Any] = {"role": "assistant", "content": ""} if finish is None else {}
        elif delta[0] == "tool":
            body = {"tool_calls": [delta[1]]}
        else:
            body = {delta[0]: delta[1]}
        choice: dict[str, Any] = {"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "" if delta is None else delta[1], "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    event = {"id": rid, "object": kind, "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class Engines:
    """Scripted engines: per case (the body's ``user``), its API, script, finish reason and the
    cuts of its successive attempts; every request body is kept."""

    def __init__(self) -> None:
        self.cases: dict[str, tuple[str, list[Delta], str, list[int]]] = {}
        self.seen: dict[str, list[dict[str, Any]]] = {}

    def add(self, case: str, api: str, script: list[Delta], cuts: list[int]) -> None:
        finish = "tool_calls" if any(kind == "tool" for kind, _ in script) else "stop"
        self.cases[case] = (api, script, finish, cuts)
        self.seen[case] = []

    @staticmethod
    def resume_at(api: str, script: list[Delta], body: dict[str, Any]) -> int:
        """How many deltas the request puts back (an AssertionError when no prefix matches)."""
        if api == "chat":
            final = body["messages"][-1] if body.get("continue_final_message") else {}
            text, reasoning = final.get("content", ""), final.get("reasoning", "")
        else:
            text, reasoning = body["prompt"][len(PROMPT) :], ""
        for k in range(len(script) + 1):
            head = script[:k]
            puts_back = all(kind != "tool" for kind, _ in head)  # a call is never put back
            if puts_back and (joined(head, "content"), joined(head, "reasoning")) == (text, reasoning):
                return k
        raise AssertionError(f"the continuation puts back what was never streamed: {text!r} {reasoning!r}")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        body = await request.json()
        case = body["user"]
        api, script, finish, cuts = self.cases[case]
        attempt = len(self.seen[case])
        self.seen[case].append(body)
        start = self.resume_at(api, script, body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rid = f"cmpl-{attempt}"  # each engine names its own answer
        opening = chunk(api, None, rid=rid) if api == "chat" else b""
        if attempt < len(cuts):
            await resp.write(opening + b"".join(chunk(api, d, rid=rid) for d in script[start : cuts[attempt]]))
            assert request.transport is not None
            request.transport.abort()  # the engine dies mid-stream
            return resp
        rest = b"".join(chunk(api, d, rid=rid) for d in script[start:])
        await resp.write(opening + rest + chunk(api, None, finish, rid) + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[ProxyServer, Engines]]:
    engines = Engines()
    stubs = [Stub(engines.handle).start() for _ in range(3)]
    config = load_config(
        instances=[s.url for s in stubs],
        port=0,
        policy="round_robin",
        eject_after=1000,
        probe_interval_s=60.0,
        engine_load=False,
    )
    server = ProxyServer(config).start()
    yield server, engines
    server.stop()
    for stub in stubs:
        stub.stop()


def counters(server: ProxyServer) -> tuple[float, float]:
    """``(resumed, unresumed)`` streams as ``/metrics`` reports them."""
    status, _, page = request(server.url, "/metrics", method="GET")
    assert status == 200
    text = page.decode()
    return metric(text, "smetric_proxy_resumed_streams_total"), metric(text, "smetric_proxy_unresumed_streams_total")


def settled(server: ProxyServer) -> None:
    """Every attempt's lifecycle was closed: nothing in flight once the answers are in."""
    router = colocated_router(server)
    deadline = time.monotonic() + TIMEOUT_S
    while router.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert router.stats()["in_flight"] == 0
    assert router.stats()["unknown_request_events"] == 0


def first_body(api: str, case: str, part: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": MAX_TOKENS, "user": case}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "go"}]
        if part == "tool call":
            body["tools"] = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}]
    else:
        body["prompt"] = PROMPT
    return body | (STRUCTURED if part == "structured output" else {})


def received(api: str, evs: list[Any]) -> dict[str, Any]:
    """What a client assembles from the stream (each structure's opening counted)."""
    out: dict[str, Any] = {"roles": 0, "content": "", "reasoning": "", "calls": {}, "finishes": [], "errors": []}
    out["ids"] = set()
    for e in evs:
        if not isinstance(e, dict):
            continue
        if "error" in e:
            out["errors"].append(e["error"])
            continue
        out["ids"].add(e["id"])
        for choice in e["choices"]:
            if choice["finish_reason"] is not None:
                out["finishes"].append(choice["finish_reason"])
            if api == "completions":
                out["content"] += choice["text"]
                continue
            delta = choice["delta"]
            out["roles"] += "role" in delta
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or []:
                mine = out["calls"].setdefault(call["index"], {"ids": [], "names": [], "arguments": ""})
                if "id" in call:
                    mine["ids"].append(call["id"])
                if "name" in call["function"]:
                    mine["names"].append(call["function"]["name"])
                mine["arguments"] += call["function"].get("arguments") or ""
    return out


def joined(script: list[Delta], kind: str) -> str:
    return "".join(v for k, v in script if k == kind)


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("part", list(CHAT))
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_cut_stream_is_continued_whole_or_ended_with_the_error_chunk(
    fleet: tuple[ProxyServer, Engines], api: str, part: str, cut: str
) -> None:
    server, engines = fleet
    script = (CHAT if api == "chat" else COMPLETIONS)[part]
    case = f"{api}/{part}/{cut}"
    k = CUTS[cut]
    engines.add(case, api, script, [k])
    expected = EXPECTED[(api, part)][list(CUTS).index(cut)]
    resumed, unresumed = counters(server)
    status, _, body = request(
        server.url, "/v1/chat/completions" if api == "chat" else "/v1/completions", first_body(api, case, part)
    )
    assert status == 200
    evs = events(body)
    got = received(api, evs)
    assert evs[-1] == "[DONE]" and evs.count("[DONE]") == 1
    assert got["roles"] == (1 if api == "chat" else 0), "one opening, the continuation's dropped"
    assert got["ids"] == {"cmpl-0"}, "one stream, one id: the continuation's chunks carry the first's"
    seen = engines.seen[case]
    if expected == CONTINUED:
        assert got["errors"] == [] and got["finishes"] == [engines.cases[case][2]]
        assert got["content"] == joined(script, "content")
        assert got["reasoning"] == joined(script, "reasoning")
        calls = [(CALL_OPENING["id"], "sh", '{"cmd": "ls -la"}')] if api == "chat" and part == "tool call" else []
        assert [(c["ids"], c["names"], c["arguments"]) for c in got["calls"].values()] == [
            ([i], [n], a) for i, n, a in calls
        ], "the call whole, opened once"
        assert len(seen) == 2
        cont = seen[1]
        assert cont["max_tokens"] == MAX_TOKENS - k, "the budget less the chunks already sent"
        if api == "chat":
            final = {"role": "assistant", "content": joined(script[:k], "content")}
            if joined(script[:k], "reasoning"):
                final["reasoning"] = joined(script[:k], "reasoning")
            assert cont["messages"] == [*seen[0]["messages"], final], "one assistant message, everything in it"
            assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
        else:
            assert cont["prompt"] == PROMPT + joined(script[:k], "content")
        assert counters(server) == (resumed + 1, unresumed)
    else:
        assert len(seen) == 1, "not continued"
        assert got["finishes"] == [], "no finish: the client cannot take the part for complete"
        assert len(got["errors"]) == 1 and got["errors"][0]["code"] == 503
        assert isinstance(evs[-2], dict) and "error" in evs[-2], "the error chunk, then [DONE]"
        assert got["content"] == joined(script[:k], "content"), "what was sent, nothing after"
        assert counters(server) == (resumed, unresumed + 1)
    settled(server)


@pytest.mark.parametrize("part", ["tool call", "structured output", "reasoning"])
def test_a_chat_stream_cut_after_its_opening_only_is_asked_again_as_it_was(
    fleet: tuple[ProxyServer, Engines], part: str
) -> None:
    server, engines = fleet
    case = f"chat/{part}/opening"
    engines.add(case, "chat", CHAT[part], [0])
    status, _, body = request(server.url, "/v1/chat/completions", first_body("chat", case, part))
    assert status == 200
    got = received("chat", events(body))
    assert got["errors"] == [] and got["roles"] == 1 and len(got["finishes"]) == 1
    assert got["content"] == joined(CHAT[part], "content")
    assert engines.seen[case][1] == engines.seen[case][0], "nothing received: nothing put back"
    settled(server)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_second_cut_is_continued_from_the_original_request(fleet: tuple[ProxyServer, Engines], api: str) -> None:
    server, engines = fleet
    part = "reasoning" if api == "chat" else "text"
    script = (CHAT if api == "chat" else COMPLETIONS)[part]
    case = f"{api}/second cut"
    engines.add(case, api, script, [3, 5])  # cut after 3 deltas, then again after 5
    status, _, body = request(
        server.url, "/v1/chat/completions" if api == "chat" else "/v1/completions", first_body(api, case, part)
    )
    assert status == 200
    got = received(api, events(body))
    assert got["errors"] == [] and got["content"] == joined(script, "content")
    assert got["reasoning"] == joined(script, "reasoning") and got["ids"] == {"cmpl-0"}
    first, _, third = engines.seen[case]
    assert third["max_tokens"] == MAX_TOKENS - 5
    if api == "chat":
        final = {
            "role": "assistant",
            "content": joined(script[:5], "content"),
            "reasoning": joined(script[:5], "reasoning"),
        }
        assert third["messages"] == [*first["messages"], final]
    else:
        assert third["prompt"] == PROMPT + joined(script[:5], "content")
    settled(server)


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": {"type": "object"}},
        {"guided_regex": "[a-z]+"},
        {"guided_choice": ["a", "b"]},
        {"structured_outputs": {"json": {"type": "object"}}},
        {"response_format": {"type": "json_object"}},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "sh"}}},
    ],
)
def test_every_form_of_guided_output_is_not_continued_and_free_text_is(extra: dict[str, Any]) -> None:
    source = TokenSource(TokenConfig(mode="approximate"))
    for api, body in (
        (ChatApi(), {"messages": [{"role": "user", "content": "go"}], "stream": True}),
        (CompletionsApi(), {"prompt": PROMPT, "stream": True}),
    ):
        free = {"response_format": {"type": "text"}, "tool_choice": "auto"}
        # completions have no tools: a tool_choice there guides nothing
        guided = "tool_choice" not in extra or isinstance(api, ChatApi)
        for fields, continued in ((extra, not guided), (free, True)):
            raw = json.dumps(body | fields).encode()
            req = api.parse(raw)
            prepared = api.prepare(req, raw, api.routing_tokens(source, req), {}, SessionTable())
            state = api.stream(keep=True)
            name = api.name
            state.feed(chunk(name, None) if name == "chat" else b"")
            state.feed(chunk(name, ("content", '{"a')))
            assert (api.continuation(prepared, state, source) is not None) is continued, (name, fields)


def test_a_completion_with_echo_is_not_continued() -> None:
    source = TokenSource(TokenConfig(mode="approximate"))
    api = CompletionsApi()
    raw = json.dumps({"prompt": PROMPT, "stream": True, "echo": True}).encode()
    req = api.parse(raw)
    state = api.stream(keep=True)
    state.feed(chunk("completions", ("content", PROMPT + "Hel")))
    assert (
        api.continuation(api.prepare(req, raw, api.routing_tokens(source, req), {}, SessionTable()), state, source)
        is None
    )


def test_the_openai_sdk_gets_a_cut_call_as_an_error_and_never_a_broken_call(
    fleet: tuple[ProxyServer, Engines],
) -> None:
    openai = pytest.importorskip("openai")
    server, engines = fleet
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
    try:
        outcomes = {}
        for k in (1, 4):  # before the call: continued; inside its arguments: an error
            case = f"sdk/{k}"
            engines.add(case, "chat", CHAT["tool call"], [k])
            body = first_body("chat", case, "tool call")
            stream = sdk.chat.completions.create(
                model="m", messages=body["messages"], tools=body["tools"], stream=True, max_tokens=MAX_TOKENS, user=case
            )
            arguments = ""
            try:
                for part in stream:
                    for call in part.choices[0].delta.tool_calls or [] if part.choices else []:
                        arguments += call.function.arguments or "" if call.function else ""
                outcomes[k] = arguments
            except openai.APIError as e:
                outcomes[k] = e
        assert outcomes[1] == '{"cmd": "ls -la"}'
        assert isinstance(outcomes[4], openai.APIError) and "could not be continued" in str(outcomes[4])
    finally:
        sdk.close()
    settled(server)
