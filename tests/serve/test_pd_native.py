"""PD mode on the compiled gateway: the native path speaks vLLM's disaggregated-prefill protocol
as the app's PD backend does (``rust/smetric-gateway/src/native/pd.rs``).

The engines are real ``FakeEngine`` prefill and decode instances behind recording relays, so
each test sees the exact bodies each leg sent. The differential test sends the same requests
through the gateway and to the app behind it (handed to it as the gateway hands requests on), in
approximate and in tokenizer mode, and holds every leg's body equal; the fault tests
break the prefill leg in each way the module names and check where the request ends.

Bounded: two or three fake engines at 1,000× speed, at most 40 requests a test; ≈5 s in all."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from proxy_util import Stub, app_request, metric, pd_router, request

from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}
MESSAGES = [SYSTEM, {"role": "user", "content": "fix the failing test " * 20}]
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 4, "stream": True, "min_tokens": 2}),
    (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
    ),
    ("/v1/messages", {"model": "fake-model", "system": "be brief", "messages": MESSAGES[1:], "max_tokens": 4}),
    ("/v1/responses", {"model": "fake-model", "input": "summarise " * 50, "max_output_tokens": 4, "store": True}),
    ("/v1/completions", {"prompt": "def main():\n" * 60, "max_tokens": 4, "stream": True}),
]


def decision(headers: dict[str, str]) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (f.partition("=") for f in headers["x-smetric-decision"].split("; "))}


def relay(target: str, seen: list[tuple[str, dict[str, Any]]], answered: list[bytes] | None = None) -> Handler:
    """A handler that records each body it is posted (and in ``answered`` each answer) and
    answers with ``target``'s answer."""

    async def handle(req: web.Request) -> web.StreamResponse:
        raw = await req.read()
        if req.method == "POST":
            seen.append((req.path, json.loads(raw)))
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                req.method, target + req.path_qs, data=raw or None, headers={"Content-Type": "application/json"}
            ) as r,
        ):
            body = await r.read()
            if answered is not None and req.method == "POST":
                answered.append(body)
            return web.Response(body=body, status=r.status, content_type=r.content_type)

    return handle


@pytest.fixture
def engines() -> Iterator[tuple[FakeEngine, FakeEngine]]:
    prefill = FakeEngine(port=0, role="prefill", speedup=1000).start()
    decode = FakeEngine(port=0, role="decode", speedup=1000).start()
    yield prefill, decode
    prefill.stop()
    decode.stop()


TOKENS = {
    "approximate": {"mode": "approximate"},
    "tokenizer": {
        "mode": "tokenizer",
        "tokenizer": str(Path(__file__).parents[1] / "data" / "serve" / "tokenizer.json"),
    },
}


def pd_proxy(prefill: list[str], decode: list[str], tokens: str = "approximate") -> ProxyServer:
    cfg = load_config(
        prefill=prefill,
        decode=decode,
        port=0,
        engine_load=False,
        probe_interval_s=0.1,
        tokens=TOKENS[tokens],
    )
    return ProxyServer(cfg).start()


def native_requests(server: ProxyServer) -> float:
    page = request(server.url, "/metrics", method="GET")[2].decode()
    return sum(
        metric(page, "smetric_proxy_native_requests_total", api=a)
        for a in ("chat", "messages", "responses", "completions")
    )


@pytest.mark.parametrize("tokens", list(TOKENS))
def test_each_leg_gets_the_body_the_app_sends_on_every_api(engines: tuple[FakeEngine, FakeEngine], tokens: str) -> None:
    prefill, decode = engines
    legs: dict[str, tuple[list[Any], list[Any]]] = {}
    answers: dict[str, list[tuple[int, str]]] = {}
    for plane in ("app", "compiled"):
        seen_p: list[tuple[str, dict[str, Any]]] = []
        seen_d: list[tuple[str, dict[str, Any]]] = []
        prefill_answers: list[bytes] = []
        with Stub(relay(prefill.url, seen_p, prefill_answers)) as p, Stub(relay(decode.url, seen_d)) as d:
            server = pd_proxy([p.url], [d.url], tokens)
            try:
                answers[plane] = []
                for path, body in REQUESTS:
                    if plane == "compiled":
                        status, headers, raw = request(server.url, path, body)
                    else:
                        status, headers, raw = app_request(server, path, body)
                    assert status == 200, (plane, path, raw[:300])
                    d_ = decision(headers)
                    assert (d_["prefill"], d_["instance"]) == (p.url, d.url)
                    assert d_["tokens"] == tokens, "routed on the mode's ids"
                    answers[plane].append((status, headers.get("content-type", "")))
                assert pd_router(server).stats()["in_flight"] == 0
                natives = native_requests(server)
            finally:
                server.stop()
        assert natives == (len(REQUESTS) if plane == "compiled" else 0), plane
        # The decode leg carries what its prefill leg answered (engine ids and times differ by
        # run: compared here, then set aside for the comparison of the planes).
        for (_, body), answer in zip(seen_d, prefill_answers, strict=True):
            assert body["kv_transfer_params"] == json.loads(answer)["kv_transfer_params"]
            body["kv_transfer_params"] = "from the prefill answer"
        legs[plane] = (seen_p, seen_d)
    for leg in (0, 1):
        for (path_c, c), (path_p, py) in zip(legs["compiled"][leg], legs["app"][leg], strict=True):
            differ = {
                k: (c.get(k), py.get(k)) for k in c.keys() | py.keys() if k != "messages" and c.get(k) != py.get(k)
            }
            assert (path_c, differ) == (path_p, {}), ("prefill", "decode")[leg]
            assert c == py and list(c) == list(py), "same keys in the same order"
    assert answers["compiled"] == answers["app"]
    prefill_bodies = [body for _, body in legs["compiled"][0]]
    assert all(b["stream"] is False and b["max_tokens"] == 1 for b in prefill_bodies)
    assert all(b["kv_transfer_params"]["do_remote_decode"] is True for b in prefill_bodies)
    assert all("stream_options" not in b and "min_tokens" not in b for b in prefill_bodies)
    assert prefill_bodies[4]["store"] is False and prefill_bodies[4]["max_output_tokens"] == 1


def failing_prefill(kind: str) -> Handler:
    async def handle(req: web.Request) -> web.StreamResponse:
        if req.method != "POST":
            return web.json_response({"status": "ok"})
        await req.read()
        if kind == "http_500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if kind == "no_kv_transfer_params":  # an engine started without a KV connector
            return web.json_response({"id": "x", "choices": [{"text": "a"}], "usage": {"completion_tokens": 1}})
        raise AssertionError(kind)

    return handle


@pytest.mark.parametrize("kind", ["http_500", "no_kv_transfer_params"])
def test_a_failed_prefill_leg_is_failed_over_natively(engines: tuple[FakeEngine, FakeEngine], kind: str) -> None:
    """The gateway retries a PD attempt whose prefill leg failed, both legs routed again without
    the failed instance; every request is the gateway's own."""
    prefill, decode = engines
    with Stub(failing_prefill(kind)) as bad:
        server = pd_proxy([bad.url, prefill.url], [decode.url])
        try:
            retried = 0
            sent = 0
            for n in range(40):
                sent += 1
                # No shared prefix: each first turn is a fair draw between the idle instances.
                msgs = [{"role": "user", "content": f"task {n} " * 30}]
                status, headers, raw = request(server.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
                assert status == 200, raw[:300]
                d = decision(headers)
                assert d["prefill"] == prefill.url, "only the healthy prefill instance serves"
                retried += int(d["attempt"]) > 1
                if retried:
                    break
            assert retried, "the failing prefill instance was tried first at least once in 40 first turns"
            page = request(server.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_retries_total", cause=kind) >= 1
            assert native_requests(server) == sent, "failed over by the gateway, not handed to the app"
            assert pd_router(server).stats()["in_flight"] == 0
        finally:
            server.stop()


def test_a_prefill_leg_refused_as_the_clients_mistake_is_the_clients_answer(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    _, decode = engines
    error = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}

    async def refuses(req: web.Request) -> web.StreamResponse:
        if req.method != "POST":
            return web.json_response({"status": "ok"})
        await req.read()
        return web.json_response(error, status=400)

    seen_d: list[tuple[str, dict[str, Any]]] = []
    with Stub(refuses) as p, Stub(relay(decode.url, seen_d)) as d:
        server = pd_proxy([p.url], [d.url])
        try:
            status, headers, raw = request(server.url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})
            assert status == 400 and json.loads(raw) == error
            assert decision(headers)["prefill"] == p.url
            assert seen_d == [], "the decode instance never heard of it"
            assert pd_router(server).stats()["in_flight"] == 0
            assert native_requests(server) == 1
        finally:
            server.stop()


def cutting_decode(decode: FakeEngine, cut: list[dict[str, Any]]) -> Handler:
    """A decode instance that serves through ``decode`` but dies after the answer's first two
    events (its opening and first token), recording each body it cut in ``cut``."""

    async def handle(req: web.Request) -> web.StreamResponse:
        if req.method != "POST":
            return web.json_response({"status": "ok"})
        raw = await req.read()
        async with (
            aiohttp.ClientSession() as session,
            session.post(decode.url + req.path, data=raw, headers={"Content-Type": "application/json"}) as r,
        ):
            answer = await r.read()
        cut.append(json.loads(raw))
        events = [e for e in answer.split(b"\n\n") if e.strip()]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        await resp.write(b"".join(e + b"\n\n" for e in events[:2]))
        assert req.transport is not None
        req.transport.abort()  # the decode engine dies mid-stream
        return resp

    return handle


def test_a_cut_decode_stream_is_continued_natively_with_both_legs_routed_again(
    engines: tuple[FakeEngine, FakeEngine],
) -> None:
    """A decode stream cut after its first token is continued by the gateway: the continuation
    (the text so far as the final assistant message) goes through a prefill leg and to the other
    decode instance; the client gets one stream; the app serves none of it."""
    prefill, decode = engines
    cut: list[dict[str, Any]] = []
    seen_p: list[tuple[str, dict[str, Any]]] = []
    seen_d: list[tuple[str, dict[str, Any]]] = []
    with (
        Stub(cutting_decode(decode, cut)) as bad,
        Stub(relay(prefill.url, seen_p)) as p,
        Stub(relay(decode.url, seen_d)) as d,
    ):
        server = pd_proxy([p.url], [bad.url, d.url])
        try:
            sent = 0
            for n in range(20):  # until a first attempt's decode leg lands on the cutting instance
                sent += 1
                msgs = [{"role": "user", "content": f"task {n} " * 30}]
                body = {"messages": msgs, "max_tokens": 6, "stream": True}
                status, _, raw = request(server.url, "/v1/chat/completions", body)
                assert status == 200, raw[:300]
                chunks = [e for e in raw.split(b"\n\n") if e.strip()]
                assert chunks.count(b"data: [DONE]") == 1 and b"error" not in raw, raw[-300:]
                if cut:
                    break
            assert cut, "the cutting decode instance took a first attempt in 20 requests"
            continuation = seen_d[-1][1]
            assert continuation["continue_final_message"] is True
            assert continuation["messages"][-1]["role"] == "assistant" and continuation["messages"][-1]["content"]
            assert continuation["kv_transfer_params"], "the continuation went through a prefill leg"
            assert seen_p[-1][1]["messages"] == continuation["messages"], "both legs carry the continuation"
            page = request(server.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_resumed_streams_total") == 1
            assert native_requests(server) == sent, "continued by the gateway, not handed to the app"
            assert pd_router(server).stats()["in_flight"] == 0
        finally:
            server.stop()
