"""The compiled data plane's native path (``rust/smetric-gateway/src/native``): that the APIs are
served without the app, with everything the app would give them, and that what the gateway
leaves to the app is carried on by it.

The whole serve suite runs through the gateway (the only data plane); these tests pin that the
native path, not delegation, served what they send (``proxy_native_requests_total``), compare
its answers with what the app answers the same request handed to it (``app_request``: the app's
loopback port, the gateway's fields), and test the hand-offs themselves. Upstreams: fake engines
in process, or stubs. Bounded: a handful of requests each.
"""

from __future__ import annotations

import base64
import json
import re
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from proxy_util import Stub, app_request, chat_text, events, metric, proxy_for, request, sender

from smetric._core import GATEWAY_HEADER, SHARED_ROUTES
from smetric.fake_engine import FakeEngine
from smetric.serve.apis import ResponsesApi
from smetric.serve.compiled import plane_summary
from smetric.serve.pinning import ResponseIds, instance_tag
from smetric.serve.proxy import NOT_FROM_GATEWAY, ProxyServer

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}
CHAT = "/v1/chat/completions"


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    started = [FakeEngine(port=0, speedup=1000).start() for _ in range(2)]
    yield started
    for e in started:
        e.stop()


def compiled(urls: list[str], **overrides: Any) -> ProxyServer:
    instances = [{"url": url, "kv_events": "off"} for url in urls]
    return proxy_for(instances, tokens={"mode": "approximate"}, **overrides)


def page(p: ProxyServer) -> str:
    return request(p.url, "/metrics", method="GET")[2].decode()


def decision(headers: dict[str, str]) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (f.partition("=") for f in headers["x-smetric-decision"].split("; "))}


Case = tuple[str, str, Any, dict[str, str]]
"""A request: method, path, body (JSON, raw bytes or None) and headers."""


def answered(p: ProxyServer, plane: str, cases: list[Case]) -> list[tuple[int, Any]]:
    """Each case's status and JSON answer, sent through the gateway (``compiled``) or handed to
    the app behind it (``app``): the two lists a differential test holds equal."""
    send = sender(p, plane)
    out = []
    for method, path, body, headers in cases:
        payload = {"raw": body} if isinstance(body, bytes) else {} if body is None else {"body": body}
        status, _, raw = send(p.url, path, method=method, headers=headers, **payload)
        out.append((status, json.loads(raw)))
    return out


def log_lines(path: Path, count: int) -> list[dict[str, Any]]:
    """The decision log's lines once it has ``count`` (the log is written off the loop)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def test_chat_and_completions_are_served_natively_with_what_the_app_gives(
    engines: list[FakeEngine], tmp_path: Path
) -> None:
    log = tmp_path / "decisions.jsonl"
    p = compiled([e.url for e in engines], decision_log=str(log))
    try:
        first = {"messages": [SYSTEM, {"role": "user", "content": "list the files"}], "max_tokens": 4}
        status, headers, body = request(p.url, CHAT, first, headers={"x-request-id": "req-1"})
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]
        assert headers["x-request-id"] == "req-1" and headers["server"] == "smetric"
        home = decision(headers)
        assert home["first_turn"] == "1" and home["tokens"] == "approximate" and home["attempt"] == "1"
        # The follow-up, streamed without asking for usage: sticky, its usage kept from the client.
        answer = {"role": "assistant", "content": json.loads(body)["choices"][0]["message"]["content"]}
        follow = {
            "messages": [*first["messages"], answer, {"role": "user", "content": "go"}],
            "max_tokens": 4,
            "stream": True,
        }
        status, headers, body = request(p.url, CHAT, follow)
        assert status == 200 and chat_text(body) and events(body)[-1] == "[DONE]"
        assert len(headers["x-request-id"]) == 32, "minted"
        again = decision(headers)
        assert again["first_turn"] == "0" and again["instance"] == home["instance"]
        assert int(again["local_hit_tokens"]) > 0
        assert not any(isinstance(e, dict) and e.get("usage") for e in events(body)), "usage hidden"
        ids = {"prompt": list(range(100, 400)), "max_tokens": 2}
        status, headers, _ = request(p.url, "/v1/completions", ids)
        assert status == 200 and decision(headers)["tokens"] == "ids"
        text = page(p)
        assert metric(text, "smetric_proxy_native_requests_total", api="chat") == 2
        assert metric(text, "smetric_proxy_native_requests_total", api="completions") == 1
        assert metric(text, "smetric_proxy_responses_total", code="200") == 3
        assert metric(text, "smetric_proxy_decisions_total", policy="smetric", reason="sticky", first_turn="false") == 1
        assert metric(text, "smetric_proxy_prompt_tokens_total", source="ids") == 300
        lines = log_lines(log, 3)
        assert lines[0]["request_id"] == "req-1"
        streamed = lines[1]
        assert streamed["instance"] == home["instance"] and streamed["reason"] == "sticky"
        assert streamed["cached_tokens"] is not None and streamed["cached_tokens"] > 0, "the realized hit"
        assert streamed["ttft_s"] is not None and streamed["status"] == 200 and streamed["attempts"] == 1
    finally:
        p.stop()


def test_the_app_takes_the_gateways_records_when_it_rings_without_polling_or_a_scrape(
    engines: list[FakeEngine], tmp_path: Path
) -> None:
    """A natively served request reaches the decision log by the gateway's bell alone (no
    ``/metrics`` render drains it), requests in a burst are all taken, and an idle gateway
    leaves its bell silent."""
    log = tmp_path / "decisions.jsonl"
    p = compiled([e.url for e in engines], decision_log=str(log))
    try:
        body = {"messages": [SYSTEM, {"role": "user", "content": "hi"}], "max_tokens": 2}
        assert request(p.url, CHAT, body, headers={"x-request-id": "rung-1"})[0] == 200
        assert [line["request_id"] for line in log_lines(log, 1)] == ["rung-1"]
        for i in range(5):  # faster than the pace: batched, none lost
            assert request(p.url, CHAT, body, headers={"x-request-id": f"burst-{i}"})[0] == 200
        assert len(log_lines(log, 6)) == 6
        assert p.proxy is not None and p.proxy.compiled is not None
        gateway = p.proxy.compiled.gateway
        time.sleep(0.2)  # past the pace: the last take cleared the bell, nothing rang since
        readable, _, _ = select.select([gateway.records_fd()], [], [], 0)
        assert readable == [], "an idle gateway rang"
    finally:
        p.stop()


def test_anthropic_messages_are_served_natively_in_their_own_shapes(engines: list[FakeEngine], tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    p = compiled([e.url for e in engines], decision_log=str(log))
    try:
        system = [
            {"type": "text", "text": "x-anthropic-billing-header: 1"},
            {"type": "text", "text": SYSTEM["content"]},
        ]
        turn = {
            "model": "fake-model",
            "max_tokens": 4,
            "system": system,
            "messages": [{"role": "user", "content": "ls"}],
        }
        headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-claude-code-session-id": "s-1"}
        status, answer_headers, body = request(p.url, "/v1/messages", turn, headers=headers)
        assert status == 200 and json.loads(body)["type"] == "message"
        home = decision(answer_headers)
        reply = json.loads(body)["content"]
        follow = {**turn, "stream": True}
        follow["messages"] = [
            *turn["messages"],
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "go"},
        ]
        status, answer_headers, body = request(p.url, "/v1/messages", follow, headers=headers)
        assert status == 200 and b"event: message_stop" in body
        again = decision(answer_headers)
        assert again["first_turn"] == "0" and again["instance"] == home["instance"]
        # A body whose fault lies deeper than its first fields: `to_chat`'s 400, in Anthropic's shape.
        wrong_role = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "nobody", "content": "x"}]}
        status, _, raw = request(p.url, "/v1/messages", wrong_role)
        assert status == 400 and json.loads(raw)["type"] == "error"
        text = page(p)
        assert metric(text, "smetric_proxy_native_requests_total", api="messages") == 3
        lines = log_lines(log, 3)
        streamed = next(line for line in lines if line["api"] == "messages" and line["first_turn"] is False)
        assert streamed["session"] == "s-1" and streamed["cached_tokens"] and streamed["cached_tokens"] > 0
    finally:
        p.stop()


@pytest.fixture
def storing_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeEngine]]:
    """Engines that store responses (vLLM's switch, read when an engine starts)."""
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    started = [FakeEngine(port=0, speedup=1000).start() for _ in range(2)]
    yield started
    for e in started:
        e.stop()


def test_responses_are_served_natively_with_the_apps_ids(storing_engines: list[FakeEngine]) -> None:
    engines = storing_engines
    p = compiled([e.url for e in engines], response_id_key="shared-by-the-replicas")
    try:
        assert p.proxy is not None
        ids = next(api for api in p.proxy.apis if isinstance(api, ResponsesApi)).ids
        codex = {"model": "fake-model", "store": False, "instructions": SYSTEM["content"], "input": "list the files"}
        status, headers, body = request(p.url, "/v1/responses", {**codex, "max_output_tokens": 4})
        answer = json.loads(body)
        assert status == 200 and ids.open(answer["id"]) is not None, "an id the app opens"
        home = decision(headers)["instance"]
        follow = {
            **codex,
            "stream": True,
            "input": [
                {"type": "message", "role": "user", "content": "list the files"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a b"}]},
                {"type": "message", "role": "user", "content": "go"},
            ],
        }
        status, headers, body = request(p.url, "/v1/responses", follow)
        assert status == 200 and decision(headers)["instance"] == home
        created = next(e for e in events_of(body) if e["type"] == "response.created")
        assert ids.open(created["response"]["id"]) is not None
        assert events_of(body)[-1]["type"] in ("response.completed", "response.incomplete")
        # An id the proxy did not issue: the adapter's 404, answered at the door.
        status, _, raw = request(p.url, "/v1/responses", {**codex, "previous_response_id": "resp_forged"})
        assert status == 404 and "not found" in json.loads(raw)["error"]["message"]
        assert metric(page(p), "smetric_proxy_native_requests_total", api="responses") == 3
        # A chain of stored responses (the official SDK, as Codex sends them): each follow-up
        # served natively, pinned to the instance that stored the chain, the engine given its
        # own id.
        with openai.OpenAI(base_url=p.url + "/v1", api_key="sk-test", max_retries=0, timeout=30) as sdk:
            previous = sdk.responses.create(model="fake-model", input="remember 7", max_output_tokens=4)
            holder = previous.id.rsplit("-", 2)[1]
            for turn in range(3):
                previous = sdk.responses.create(
                    model="fake-model", input=f"go on {turn}", previous_response_id=previous.id, max_output_tokens=4
                )
                assert previous.id.rsplit("-", 2)[1] == holder, "only the instance that stored it"
                assert ids.open(previous.id) is not None
        assert metric(page(p), "smetric_proxy_native_requests_total", api="responses") == 7
    finally:
        p.stop()


def test_pass_through_and_a_stored_responses_routes_are_served_natively(storing_engines: list[FakeEngine]) -> None:
    """vLLM's unrouted surface goes to the least-loaded instance without the app, failed over
    like any attempt; a stored response's GET and cancel go to the instance that stored it, the
    engine's ids rewritten to the proxy's, and its instance's failure is the lost-state 503."""
    engines = storing_engines
    p = compiled([e.url for e in engines], response_id_key="shared-by-the-replicas", eject_after=100)
    try:
        with openai.OpenAI(base_url=p.url + "/v1", api_key="sk-test", max_retries=0, timeout=30) as sdk:
            stored = sdk.responses.create(model="fake-model", input="remember 7", max_output_tokens=4)
            got = sdk.responses.retrieve(stored.id)
            assert got.id == stored.id and got.output_text == stored.output_text, "the proxy's id, not the engine's"
            tag = stored.id.rsplit("-", 2)[1]
            _, headers, _ = request(p.url, f"/v1/responses/{stored.id}/cancel", {})
            assert decision(headers)["reason"] == "pass-through" and instance_tag(decision(headers)["instance"]) == tag
        # The fake engine has no /v1/models/{id}: its 404 is relayed as it came.
        status, headers, _ = request(p.url, "/v1/models/fake-model", method="GET")
        assert status == 404 and decision(headers)["reason"] == "pass-through"
        text = page(p)
        assert metric(text, "smetric_proxy_native_requests_total", api="responses") == 3
        assert metric(text, "smetric_proxy_native_requests_total", api="passthrough") == 1
        holder = next(e for e in engines if instance_tag(e.url) == tag)
        dead = holder.url
        first_in_order = dead == engines[0].url
        holder.stop()
        status, _, raw = request(p.url, f"/v1/responses/{stored.id}", method="GET")
        error = json.loads(raw)["error"]
        assert status == 503 and error["param"] == "previous_response_id" and "it is lost" in error["message"]
        # A pass-through whose first instance is dead is served by the other.
        for _ in range(2):
            status, headers, _ = request(p.url, "/v1/models/fake-model", method="GET")
            assert status == 404 and decision(headers)["instance"] != dead
            # Both idle: the fleet's first is tried first, and a dead first fails over.
            assert decision(headers)["attempt"] == ("2" if first_in_order else "1")
        assert metric(page(p), "smetric_proxy_native_requests_total", api="passthrough") == 3
    finally:
        p.stop()


def test_a_stored_response_whose_instance_left_is_lost_natively_as_the_app_answers_it(
    engines: list[FakeEngine],
) -> None:
    """An id the key issued for an instance no longer in the fleet: its routes and a follow-up
    naming it get the failover's lost-state 404, from the gateway as from the app handed the same
    request."""
    key = "shared-by-the-replicas"
    gone = ResponseIds(key).issue("resp_engine-1", "http://127.0.0.1:9")
    p = compiled([e.url for e in engines], response_id_key=key)
    cases: list[Case] = [
        ("GET", f"/v1/responses/{gone}", None, {}),
        ("POST", f"/v1/responses/{gone}/cancel", {}, {}),
        ("POST", "/v1/responses", {"input": "and then?", "previous_response_id": gone, "max_output_tokens": 2}, {}),
    ]
    try:
        native = answered(p, "compiled", cases)
        assert metric(page(p), "smetric_proxy_native_requests_total", api="responses") == len(cases), "the gateway's"
        assert native == answered(p, "app", cases)
        for status, body in native:
            error = body["error"]
            assert status == 404 and error["param"] == "previous_response_id", body
            assert "no longer in the fleet" in error["message"]
    finally:
        p.stop()


def test_the_session_end_endpoints_are_answered_natively_for_ids_taken_as_written(engines: list[FakeEngine]) -> None:
    """An end endpoint naming a plain id is answered by the gateway (the shared table's entry
    released, the app counting the end); an escaped id is decoded as the app decodes it, and one
    the app reads its own way (not UTF-8, a `+` in the query) is the app's."""
    p = compiled([e.url for e in engines])
    try:
        body = {"prompt": "p " * 20, "max_tokens": 1}
        assert request(p.url, "/v1/completions", body, headers={"x-session-id": "s-1"})[0] == 200
        assert p.proxy is not None and len(p.proxy.sessions) == 1
        status, _, raw = request(p.url, "/v1/sessions/s-1/end", method="POST")
        assert status == 200 and json.loads(raw) == {"object": "session.end", "id": "s-1", "ended": True, "held": True}
        assert len(p.proxy.sessions) == 0, "released at once, in the one table"
        status, _, raw = request(p.url, "/finish_session?session_id=s-2", method="POST")
        assert status == 200 and json.loads(raw)["held"] is False
        # A session named in UTF-8 with a slash, ended by its escaped id: the same key.
        utf8 = "sessão/1".encode().decode("latin-1")  # urllib sends a header's str as Latin-1
        assert request(p.url, "/v1/completions", body, headers={"x-session-id": utf8})[0] == 200
        assert len(p.proxy.sessions) == 1
        status, _, raw = request(p.url, "/v1/sessions/sess%C3%A3o%2F1/end", method="POST")
        ended = {"object": "session.end", "id": "sessão/1", "ended": True, "held": True}
        assert status == 200 and json.loads(raw) == ended
        assert len(p.proxy.sessions) == 0
        status, _, raw = request(p.url, "/finish_session?session%5Fid=a%2Db", method="POST")
        assert status == 200 and json.loads(raw)["id"] == "a-b"
        # Read by the app its own way: escapes that are not UTF-8, a `+` in the query.
        status, _, raw = request(p.url, "/v1/sessions/a%FFb/end", method="POST")
        assert status == 200 and json.loads(raw)["id"] == "a%FFb", "the app keeps it escaped"
        status, _, raw = request(p.url, "/finish_session?session_id=a+b", method="POST")
        assert status == 200 and json.loads(raw)["id"] == "a b"
        text = page(p)
        assert metric(text, "smetric_proxy_native_requests_total", api="session_end") == 4
        assert metric(text, "smetric_proxy_session_ends_total", via="endpoint", held="true") == 2
        assert metric(text, "smetric_proxy_session_ends_total", via="endpoint", held="false") == 4
    finally:
        p.stop()


def test_anthropic_count_tokens_is_validated_and_counted_natively(engines: list[FakeEngine]) -> None:
    """``count_tokens`` through the official SDK: validated as the app validates it (no
    ``max_tokens``), counted by an engine without a routing decision; a body the app must
    refuse is its 400, answered natively."""
    p = compiled([e.url for e in engines])
    try:
        claude = anthropic.Anthropic(base_url=p.url, api_key="sk-test", max_retries=0, timeout=30)
        messages: Any = [{"role": "user", "content": "count me"}]
        counted = claude.messages.count_tokens(model="fake-model", messages=messages)
        assert counted.input_tokens > 0
        raw = claude.messages.with_raw_response.count_tokens(model="fake-model", messages=messages)
        assert decision(raw.headers)["reason"] == "pass-through"
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.count_tokens(model="fake-model", messages=[])
        assert metric(page(p), "smetric_proxy_native_requests_total", api="messages") == 3
    finally:
        p.stop()


def events_of(body: bytes) -> list[dict[str, Any]]:
    """The ``data:`` objects of a Responses stream."""
    return [json.loads(block.partition("data: ")[2]) for block in body.decode().split("\n\n") if "data: " in block]


def test_a_clients_gateway_fields_are_dropped_not_trusted(engines: list[FakeEngine]) -> None:
    p = compiled([engines[0].url])
    try:
        forged = {
            "x-smetric-gateway": "guess",
            "x-smetric-gateway-refused": "queue_full",
            "x-smetric-gateway-failed": f"{engines[0].url} http_500",
        }
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "model": "nope"}
        # An unknown model is the app's to answer: the request is delegated, forged fields and all.
        status, _, raw = request(p.url, CHAT, body, headers=forged)
        assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found"
        del body["model"]
        status, _, _ = request(p.url, CHAT, body, headers=forged)
        assert status == 200
        text = page(p)
        assert metric(text, "smetric_proxy_admission_rejections_total", reason="queue_full") == 0
        assert metric(text, "smetric_proxy_retries_total", cause="http_500") == 0
    finally:
        p.stop()


def test_a_dead_instance_is_failed_over_natively_and_ejected_at_once(engines: list[FakeEngine]) -> None:
    """The gateway's own failover: the first request's attempt at the dead instance fails to
    connect, is retried on the live one (attempt 2 in its decision), and ejects the dead one at
    once (eject_after=1): no later request tries it. The app counts the retry and mirrors the
    ejection from the record."""
    dead = engines[1].url
    engines[1].stop()
    # Probes that never re-admit it within the test.
    p = compiled([dead, engines[0].url], policy="round_robin", eject_after=1, probe_interval_s=60)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answers = [request(p.url, CHAT, body) for _ in range(4)]
        assert [a[0] for a in answers] == [200] * 4, "every request served by the live instance"
        assert decision(answers[0][1])["attempt"] == "2" and decision(answers[0][1])["instance"] == engines[0].url
        assert {decision(a[1])["attempt"] for a in answers[1:]} == {"1"}, "the ejected instance not tried again"
        deadline = time.monotonic() + 5
        while metric(text := page(p), "smetric_proxy_instance_ejected", instance=dead) != 1:
            assert time.monotonic() < deadline, "the app never mirrored the gateway's ejection"
            time.sleep(0.02)
        assert metric(text, "smetric_proxy_retries_total", cause="ClientConnectorError") == 1
        assert metric(text, "smetric_proxy_native_requests_total", api="chat") == 4, "every request native"
    finally:
        p.stop()


def _stub_answering(status: int, seen: list[str] | None = None) -> Any:
    """An engine stub answering every POST with ``status`` (a completions answer when 200)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        await request.read()
        if seen is not None and request.path == "/v1/completions":
            seen.append(request.headers.get("x-request-id", ""))
        if status != 200:
            return web.json_response({"error": {"message": "engine fault"}}, status=status)
        choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
        return web.json_response({"id": "c", "choices": [choice], "usage": {"completion_tokens": 1}})

    return handler


def test_a_500_is_charged_only_once_another_instance_answers_and_the_same_500_twice_is_the_answer() -> None:
    """A 500 may be the request's doing: the gateway retries it elsewhere and charges the first
    instance only once another one answered (ejecting it, eject_after=1); a request two
    instances fail with the same 500 is answered with it, nobody charged."""
    body = {"prompt": "p " * 20, "max_tokens": 1}
    seen: list[str] = []
    with Stub(_stub_answering(500, seen)) as bad, Stub(_stub_answering(200)) as good:
        p = compiled([bad.url, good.url], policy="round_robin", eject_after=1, probe_interval_s=60)
        try:
            status, headers, _ = request(p.url, "/v1/completions", body, headers={"x-request-id": "r-1"})
            assert status == 200 and decision(headers)["attempt"] == "2"
            assert seen == ["r-1"], "the failed attempt carried the request's id"
            deadline = time.monotonic() + 5
            while metric(text := page(p), "smetric_proxy_instance_ejected", instance=bad.url) != 1:
                assert time.monotonic() < deadline, "the suspect was never charged"
                time.sleep(0.02)
            assert metric(text, "smetric_proxy_retries_total", cause="http_500") == 1
        finally:
            p.stop()
    with Stub(_stub_answering(500)) as a, Stub(_stub_answering(500)) as b:
        p = compiled([a.url, b.url], policy="round_robin", eject_after=1, probe_interval_s=60)
        try:
            status, _, raw = request(p.url, "/v1/completions", body)
            assert status == 500
            error = json.loads(raw)["error"]
            assert error["type"] == "InternalServerError" and "HTTP 500 on 2 instances" in error["message"]
            status, _, _ = request(p.url, "/v1/completions", body)
            assert status == 500, "neither instance was charged, so neither is ejected"
            text = page(p)
            assert metric(text, "smetric_proxy_instance_ejected", instance=a.url) == 0
            assert metric(text, "smetric_proxy_instance_ejected", instance=b.url) == 0
            assert metric(text, "smetric_proxy_native_requests_total", api="completions") == 2
        finally:
            p.stop()


def test_when_every_instance_fails_the_answer_names_them_in_the_apis_shape() -> None:
    with Stub(_stub_answering(502)) as a, Stub(_stub_answering(503)) as b:
        p = compiled([a.url, b.url], policy="round_robin", eject_after=100)
        try:
            msgs = [{"role": "user", "content": "x"}]
            status, _, raw = request(p.url, "/v1/messages", {"model": "m", "messages": msgs, "max_tokens": 2})
            assert status == 529, "the proxy's 503 as Anthropic spells it (overloaded)"
            answer = json.loads(raw)
            assert answer["type"] == "error" and answer["error"]["type"] == "overloaded_error"
            assert "no instance could serve the request (2 attempts" in answer["error"]["message"]
            assert a.url in answer["error"]["message"] and b.url in answer["error"]["message"]
            assert metric(page(p), "smetric_proxy_native_requests_total", api="messages") == 1
        finally:
            p.stop()


def _chunk(text: str) -> bytes:
    delta = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(delta, separators=(",", ":")).encode() + b"\n\n"


ROLE = b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'


def _anthropic_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def test_a_cut_messages_stream_is_continued_natively_over_chat_as_the_app_builds_it() -> None:
    """A Messages stream cut inside its text block is continued by the gateway over the engine's
    chat endpoint: the body is the app's ``_chat_body`` (compared field for field on a request
    with tools, a named tool choice, thinking, effort, stop sequences and sampling), and the
    chat chunks reach the client as the open block's deltas, one ``message_delta`` and one
    ``message_stop``."""
    from smetric.anthropic import to_chat
    from smetric.serve.apis.messages import _chat_body

    opening = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m"}
    opening |= {"stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 0}}
    head = [
        _anthropic_event("message_start", {"type": "message_start", "message": opening}),
        _anthropic_event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _anthropic_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hel"}},
        ),
    ]

    async def cuts(request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/messages":
            return web.json_response({"object": "list", "data": []})
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"".join(head))
        assert request.transport is not None
        request.transport.abort()  # the engine dies mid-stream
        return resp

    continued: list[tuple[str, dict[str, Any]]] = []

    async def finishes(request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":
            return web.json_response({"object": "list", "data": []})
        continued.append((request.path, await request.json()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(ROLE + _chunk("lo") + _chunk(" world"))
        await resp.write(b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
        await resp.write(b'data: {"id":"c1","choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n')
        return resp

    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"properties": {}}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "output_config": {"effort": "high"},
        "temperature": 0.5,
        "stop_sequences": ["END"],
        "chat_template_kwargs": {"custom": 1},
    }
    with Stub(cuts) as a, Stub(finishes) as b:
        p = compiled([a.url, b.url], policy="round_robin", eject_after=100)
        try:
            client = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=30)
            extra = {k: body[k] for k in ("output_config", "chat_template_kwargs", "temperature", "stop_sequences")}
            with client.messages.stream(
                model="m",
                max_tokens=9,
                system="Be brief.",
                messages=body["messages"],
                tools=body["tools"],
                tool_choice=body["tool_choice"],
                thinking=body["thinking"],
                extra_body=extra,
            ) as stream:
                message = stream.get_final_message()
            client.close()
            assert [block.type for block in message.content] == ["text"]
            assert message.content[0].text == "hello world" and message.stop_reason == "end_turn"  # type: ignore[union-attr]
            assert message.usage.output_tokens == 3, "one delta before the cut, two after"
            ((path, chat),) = continued
            assert path == "/v1/chat/completions"
            conversion = to_chat(body)
            assistant = {"role": "assistant", "content": "hel"}
            assert chat == _chat_body(body, conversion, [*conversion.messages, assistant], 1)
            text = page(p)
            assert metric(text, "smetric_proxy_resumed_streams_total") == 1
            assert metric(text, "smetric_proxy_native_requests_total", api="messages") == 1, "continued natively"
        finally:
            p.stop()


def test_a_stream_cut_after_its_first_event_is_continued_natively() -> None:
    """The gateway builds chat's continuation itself (the text so far as the final assistant
    message, the budget reduced), relays it under the first attempt's id without its opening
    role chunk, and counts the cut as the instance's failure and the stream as resumed."""

    async def cuts(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(ROLE + _chunk("hello "))
        assert request.transport is not None
        request.transport.abort()  # the engine dies mid-stream
        return resp

    continued: list[dict[str, Any]] = []

    async def finishes(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        continued.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        last = b'data: {"id":"c2","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        await resp.write(ROLE.replace(b"c1", b"c2") + _chunk("world").replace(b"c1", b"c2") + last)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    with Stub(cuts) as a, Stub(finishes) as b:
        p = compiled([a.url, b.url], policy="round_robin", eject_after=100)
        try:
            msgs = [{"role": "user", "content": "x"}]
            status, _, body = request(p.url, CHAT, {"messages": msgs, "stream": True, "max_tokens": 9})
            assert status == 200
            assert chat_text(body) == "hello world"
            got = events(body)
            roles = [e for e in got if isinstance(e, dict) and "role" in e["choices"][0]["delta"]]
            assert len(roles) == 1 and got.count("[DONE]") == 1, "one stream, one opening, one end"
            assert {e["id"] for e in got if isinstance(e, dict)} == {"c1"}, "one stream, one id"
            assert continued[0]["messages"] == [*msgs, {"role": "assistant", "content": "hello "}]
            assert continued[0]["continue_final_message"] is True and continued[0]["max_tokens"] == 8
            text = page(p)
            assert metric(text, "smetric_proxy_resumed_streams_total") == 1
            assert metric(text, "smetric_proxy_retries_total", cause="ClientPayloadError") == 1, text
            assert metric(text, "smetric_proxy_native_requests_total", api="chat") == 1, "continued natively"
        finally:
            p.stop()


def test_a_hinted_completions_turn_is_counted_once_whatever_its_attempts(tmp_path: Path) -> None:
    """Completions without messages take their turn from the session table, natively, once per
    request: an attempt that fails at the first instance is retried with the turn already
    counted, so the session's turns stay 1, 2, 3, 4 (counted per attempt, they would skip)."""

    failed: list[bytes] = []

    async def fails(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        if request.method == "POST":
            failed.append(await request.read())
        return web.json_response({"error": {"message": "engine fault"}}, status=500)

    async def answers(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        await request.read()
        choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
        return web.json_response({"id": "c", "choices": [choice], "usage": {"completion_tokens": 1}})

    log = tmp_path / "decisions.jsonl"
    with Stub(fails) as bad, Stub(answers) as good:
        # The failing instance is ejected by its first failure: the later requests are native.
        p = compiled([bad.url, good.url], policy="round_robin", eject_after=1, decision_log=str(log))
        try:
            for i in range(4):
                body = {"prompt": f"turn {i} " * 20, "max_tokens": 1}
                status, _, raw = request(p.url, "/v1/completions", body, headers={"x-session-id": "s"})
                assert status == 200, raw
            text = page(p)
        finally:
            p.stop()
    lines = log_lines(log, 4)
    assert [line["turn"] for line in lines] == [1, 2, 3, 4]
    assert [line["session"] for line in lines] == ["s"] * 4
    assert metric(text, "smetric_proxy_native_requests_total", api="completions") == 4, "failed over natively"
    assert len(failed) == 1 and b"turn 0" in failed[0], "the first request's first attempt failed, then none"


def test_native_requests_take_their_slots_at_the_door(engines: list[FakeEngine]) -> None:
    release = threading.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        await request.read()
        while not release.is_set():
            await asyncio_sleep(0.01)
        message = {"role": "assistant", "content": "ok"}
        return web.json_response({"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    with Stub(held) as stub:
        p = compiled([stub.url], max_in_flight_per_instance=1, queue_size=1, retry_after_s=3)
        try:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            result: list[int] = []
            waiting = [threading.Thread(target=lambda: result.append(request(p.url, CHAT, body)[0])) for _ in range(2)]
            assert p.proxy is not None
            admission = p.proxy.admitting
            assert admission is not None
            deadline = time.monotonic() + 10
            waiting[0].start()
            while admission.admitted < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            waiting[1].start()
            while admission.queued < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            status, headers, raw = request(p.url, CHAT, body)
            assert status == 429 and headers["retry-after"] == "3"
            assert json.loads(raw)["error"]["type"] == "RateLimitError"
            release.set()
            for thread in waiting:
                thread.join(10)
            assert result == [200, 200]
            text = page(p)
            assert metric(text, "smetric_proxy_admission_rejections_total", reason="queue_full") == 1
            assert metric(text, "smetric_proxy_admission_in_flight") == 0
            assert metric(text, "smetric_proxy_admission_wait_seconds_count") == 2
            assert metric(text, "smetric_proxy_native_requests_total", api="chat") == 2
        finally:
            release.set()
            p.stop()


async def asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def test_the_start_up_log_names_what_the_gateway_serves_natively() -> None:
    class Armed:
        def __init__(self) -> None:
            self.apis = ["chat", "messages"]

    assert plane_summary(Armed()) == "compiled (native: chat, messages)"  # type: ignore[arg-type]


def test_the_gateway_serves_every_token_mode_natively(engines: list[FakeEngine]) -> None:
    urls = [{"url": e.url, "kv_events": "off"} for e in engines]
    tokenizer = str(Path(__file__).resolve().parents[1] / "data" / "serve" / "tokenizer.json")
    chat = (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    ids = ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1})
    for tokens, (path, body) in (
        ({"mode": "approximate"}, chat),
        ({"mode": "tokenizer", "tokenizer": tokenizer}, chat),
        # A chat template in approximate mode: the gateway renders it too.
        ({"mode": "approximate", "chat_template": "{{ messages[0].content }}"}, chat),
        # Ids mode routes completions' token ids alone (the rest is refused).
        ({"mode": "ids"}, ids),
        # Approximate ids in chunks other than 4 bytes (the CRC-32 of each).
        ({"mode": "approximate", "approx_chunk_bytes": 8}, chat),
    ):
        p = proxy_for(urls, tokens=tokens)
        try:
            status, _, _ = request(p.url, path, body)
            assert status == 200
            api = "completions" if path != CHAT else "chat"
            assert metric(page(p), "smetric_proxy_native_requests_total", api=api) == 1, tokens
        finally:
            p.stop()


IDS_MODE_REFUSALS: list[tuple[str, Any]] = [
    ("/v1/completions", {"prompt": "text, not ids", "max_tokens": 2}),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/messages", {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    # A conversation ChatML would refuse: in ids mode nothing is rendered, the ids refusal it is.
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "add_generation_prompt": True,
            "continue_final_message": True,
        },
    ),
    # The model check comes first.
    (CHAT, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "nope", "prompt": "text"}),
]


def test_ids_mode_routes_token_ids_and_refuses_the_rest_natively_as_the_app_does(engines: list[FakeEngine]) -> None:
    """In ids mode the gateway routes completions' token ids and refuses every other request
    itself, with the app's answer to the same request handed to it (the model's 404 first)."""
    instances = [{"url": e.url, "kv_events": "off"} for e in engines]
    p = proxy_for(instances, tokens={"mode": "ids"})
    try:
        status, headers, _ = request(p.url, "/v1/completions", {"prompt": list(range(100)), "max_tokens": 2})
        assert status == 200 and decision(headers)["tokens"] == "ids"
        cases: list[Case] = [("POST", path, body, {}) for path, body in IDS_MODE_REFUSALS]
        native = answered(p, "compiled", cases)
        assert native == answered(p, "app", cases)
        assert [status for status, _ in native] == [400] * 5 + [404] * 2
        chat_error = native[1][1]["error"]
        assert chat_error["param"] == "messages" and "token ids" in chat_error["message"]
        assert native[0][1]["error"]["param"] == "prompt"
        assert native[2][1]["type"] == "error", "Anthropic's shape"
        text = page(p)
        native = {
            api: metric(text, "smetric_proxy_native_requests_total", api=api)
            for api in ("completions", "chat", "messages", "responses")
        }
        assert native == {"completions": 3, "chat": 3, "messages": 1, "responses": 1}, native
    finally:
        p.stop()


END_HEADER_CASES: list[tuple[str, dict[str, str], Any]] = [
    # An end header neither true nor false: the app's 400 before anything else of the body.
    (CHAT, {"x-session-end": "yes", "x-session-id": "s"}, {"model": "nope", "messages": "not a list"}),
    ("/v1/messages", {"x-dynamo-session-final": "maybe"}, {"model": "m", "max_tokens": 1, "messages": []}),
    ("/v1/completions", {"x-session-end": "0", "x-dynamo-session-final": "later"}, {"prompt": "p"}),
    # An end that names no session: its own 400, after the model's 404.
    (CHAT, {"x-session-end": "true"}, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/v1/responses", {"x-session-end": "1"}, {"input": "hi", "max_output_tokens": 1}),
    (CHAT, {"x-session-end": "true"}, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
]


def test_end_headers_the_app_refuses_are_refused_natively_as_the_app_does(engines: list[FakeEngine]) -> None:
    """An end header that is neither true nor false, or one on a request that names no session:
    the gateway's answer is the app's to the same request handed to it, each counted once as the
    app counts it (the bad value as a ``session_end_header`` client error)."""
    instances = [{"url": e.url, "kv_events": "off"} for e in engines]
    p = proxy_for(instances, tokens={"mode": "approximate"})
    try:
        cases: list[Case] = [("POST", path, body, headers) for path, headers, body in END_HEADER_CASES]
        native = answered(p, "compiled", cases)
        text = page(p)
        apis = ("chat", "completions", "messages", "responses")
        served = sum(metric(text, "smetric_proxy_native_requests_total", api=a) for a in apis)
        assert served == len(cases), "answered by the gateway, not the app"
        assert metric(text, "smetric_proxy_client_errors_total", kind="session_end_header") == 3
        assert native == answered(p, "app", cases)
        assert [status for status, _ in native] == [400] * 5 + [404]
        assert native[0][1]["error"]["code"] == "invalid_session_end"
        assert native[2][1]["error"]["message"] == "x-dynamo-session-final must be true or false"
        assert native[3][1]["error"]["code"] == "session_end_without_session"
    finally:
        p.stop()


@pytest.mark.parametrize("policy", ["consistent_hash", "rendezvous_hash"])
def test_vllm_routers_hash_policies_key_on_the_session_header_natively_as_the_app_does(
    engines: list[FakeEngine], policy: str
) -> None:
    """The gateway hashes the header session hint as the app does, and the prompt without one:
    the same requests land on the same instances through the gateway and handed to the app (two
    proxies, so that neither's state sees the other's requests)."""
    instances = [{"url": e.url, "kv_events": "off"} for e in engines]
    picks: dict[str, list[str]] = {}
    for plane in ("app", "auto"):
        p = proxy_for(instances, tokens={"mode": "approximate"}, policy=policy)
        send = sender(p, "compiled" if plane == "auto" else "app")
        try:
            picks[plane] = []
            for n in range(24):
                headers = {"x-session-id": f"agent-session-{n % 8}"} if n % 4 else {}
                body = {"messages": [{"role": "user", "content": f"step {n} " * (n + 1)}], "max_tokens": 1}
                status, answer_headers, raw = send(p.url, CHAT, body, headers=headers)
                assert status == 200, raw[:200]
                picks[plane].append(decision(answer_headers)["instance"])
            natives = metric(page(p), "smetric_proxy_native_requests_total", api="chat")
            assert natives == (24 if plane == "auto" else 0)
        finally:
            p.stop()
    assert picks["auto"] == picks["app"]
    by_session: dict[int, set[str]] = {}
    for n, instance in enumerate(picks["auto"]):
        if n % 4:
            by_session.setdefault(n % 8, set()).add(instance)
    assert all(len(s) == 1 for s in by_session.values()), "a session's requests share an instance"
    assert len(set(picks["auto"])) == 2, "sessions and prompts spread over both instances"


def test_llm_ds_session_cookie_is_read_and_set_natively_as_the_app_does(engines: list[FakeEngine]) -> None:
    """``llmd_session_affinity`` on the gateway: the request's cookie names the previous instance,
    the answer sets the cookie when it names another; the same requests get the same instances
    and the same ``Set-Cookie`` through the gateway and handed to the app (two proxies)."""
    instances = [{"url": e.url, "kv_events": "off"} for e in engines]
    seen: dict[str, list[tuple[str, str | None]]] = {}
    for plane in ("app", "auto"):
        p = proxy_for(instances, tokens={"mode": "approximate"}, policy="llmd_session_affinity")
        send = sender(p, "compiled" if plane == "auto" else "app")
        try:
            seen[plane] = []
            cookie: str | None = None
            for n in range(12):
                if n in (4, 5):  # not base64 of text; an instance not in the fleet
                    cookie = "llm-d-session=!!" if n == 4 else "llm-d-session=aHR0cDovL25vd2hlcmU6MQ=="
                if n == 8:  # the other instance, named by the client
                    other = next(e.url for e in engines if e.url != seen[plane][-1][0])
                    cookie = "llm-d-session=" + base64.b64encode(other.encode()).decode()
                headers = {"Cookie": f"theme=dark; {cookie}"} if cookie else {}
                body = {"messages": [{"role": "user", "content": f"turn {n} " * (n + 2)}], "max_tokens": 1}
                status, answer_headers, raw = send(p.url, CHAT, body, headers=headers)
                assert status == 200, raw[:200]
                set_cookie = answer_headers.get("set-cookie")
                seen[plane].append((decision(answer_headers)["instance"], set_cookie))
                if set_cookie is not None:
                    cookie = set_cookie.split(";")[0]
            natives = metric(page(p), "smetric_proxy_native_requests_total", api="chat")
            assert natives == (12 if plane == "auto" else 0)
        finally:
            p.stop()
    assert seen["auto"] == seen["app"]
    assert seen["auto"][0][1] is not None and seen["auto"][1][1] is None, "set once, then carried"


def test_a_model_the_fleet_does_not_serve_is_answered_natively_in_each_apis_shape() -> None:
    """vLLM's 404 naming the model (cut at the echo limit), from the gateway on every API: the
    OpenAI SDK's and the Anthropic SDK's NotFoundError, no decision, no engine reached."""
    engine = FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=1000).start()
    p = compiled([engine.url])
    try:
        oa = openai.OpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0, timeout=30)
        an = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=30)
        msgs: Any = [{"role": "user", "content": "x"}]
        calls = {
            "chat": lambda: oa.chat.completions.create(model="nope", messages=msgs, max_tokens=2),
            "completions": lambda: oa.completions.create(model="nope", prompt="x", max_tokens=2),
            "responses": lambda: oa.responses.create(model="nope", input="x", max_output_tokens=2),
        }
        for api, call in calls.items():
            with pytest.raises(openai.NotFoundError) as nf:
                call()
            assert nf.value.body == {
                "message": "The model `nope` does not exist.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }, api
        with pytest.raises(anthropic.NotFoundError) as anf:
            an.messages.create(model="nope", max_tokens=2, messages=msgs)
        assert anf.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": "The model `nope` does not exist."},
        }
        status, _, raw = request(p.url, CHAT, {"model": "é" * 300, "messages": msgs})
        message = json.loads(raw)["error"]["message"]
        assert status == 404 and message == f"The model `{'é' * 256}…` does not exist.", "cut at 256 characters"
        text = page(p)
        for api in ("chat", "completions", "responses", "messages"):
            assert metric(text, "smetric_proxy_native_requests_total", api=api) == 1 + (api == "chat"), api
        assert metric(text, "smetric_proxy_responses_total", code="404") == 5
        assert metric(text, "smetric_routed_total") == 0, "no decision"
        oa.close()
        an.close()
    finally:
        p.stop()
        engine.stop()


USER = b'"messages": [{"role": "user", "content": "x"}]'
"""A valid Messages conversation, for the bodies whose fault is elsewhere."""

BAD_OPENAI_BODIES = [
    (CHAT, b"{"),
    (CHAT, b"[]"),
    (CHAT, b'{"messages": 3}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "cache_salt": ""}'),
    ("/v1/completions", b'{"prompt": 5}'),
    ("/v1/completions", b'{"max_tokens": 2}'),
    # The app's own shape checks after the parser (`request._messages`, the tools check).
    (CHAT, b'{"messages": [3]}'),
    (CHAT, b'{"messages": [{"content": "x"}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": 3}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": [1]}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "tools": [1]}'),
    # The app's plain ChatML rendering (`chat.render_chat`), after the model check.
    (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": [{"text": null}]}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": ["x"]}]}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}'),
    (CHAT, b'{"model": "nope", "messages": [{"role": "user", "content": [{"text": 3}]}]}'),
    # Anthropic's: `to_chat`'s first checks, in Anthropic's error shape.
    ("/v1/messages", b"[]"),
    ("/v1/messages", b'{"model": 3, "max_tokens": "x", "messages": []}'),
    ("/v1/messages", b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/messages", b'{"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/messages", b'{"model": "m", "max_tokens": 2, "stream": "yes", "messages": [{"role": "user"}]}'),
    ("/v1/messages", b'{"model": "m", "max_tokens": 2, "messages": []}'),
    # `to_chat`'s deeper checks, each the first fault of its body.
    *(
        ("/v1/messages", b'{"model": "m", "max_tokens": 2, ' + rest)
        for rest in (
            b'"messages": [3]}',
            b'"messages": [{"role": "tool", "content": "x"}]}',
            b'"messages": [{"role": "user"}]}',
            b'"messages": [{"role": "user", "content": [{"type": 1}]}]}',
            b'"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}',
            b'"messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": []}]}]}',
            USER + b', "system": 5}',
            USER + b', "tools": {}}',
            USER + b', "tools": [{"name": "f"}]}',
            USER + b', "tool_choice": {"type": "tool"}}',
            USER + b', "thinking": {"type": "enabled", "budget_tokens": 100}}',
            USER + b', "output_config": {"effort": 1}}',
            USER + b', "chat_template_kwargs": []}',
            USER + b', "cache_salt": ""}',
        )
    ),
    ("/v1/messages/count_tokens", b'{"model": "m", "messages": [{"role": "user", "content": 3}]}'),
    ("/v1/messages/count_tokens", b"{"),
    # The Responses adapter's parse, then its conversion of the input items.
    *(
        ("/v1/responses", body)
        for body in (
            b'{"model": 3, "input": "x"}',
            b'{"input": "x", "user": ["u"]}',
            b'{"input": "x", "store": "no"}',
            b'{"input": "x", "max_output_tokens": 0}',
            b'{"input": "x", "max_output_tokens": 2.5}',
            b'{"input": 7}',
            b'{"input": ["x"]}',
            b'{"input": "x", "tools": [1]}',
            b'{"input": [{"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"}]}',
            b'{"input": [{"type": "reasoning", "encrypted_content": "gAAA"}]}',
            b'{"input": [{"type": "mystery"}]}',
            b'{"input": [{"content": "x"}]}',
            # The adapter opens the id before it converts: the unissued id's 404 is the answer.
            b'{"input": [{"type": "mystery"}], "previous_response_id": "resp_never"}',
        )
    ),
    # Not JSON, on the APIs whose bodies CPython decodes: the parser's words on both planes.
    ("/v1/messages", b"{"),
    ("/v1/messages", b'{"model": "m",}'),
    ("/v1/messages", b"\xff"),
    ("/v1/responses", b"[1[1[1"),
    ("/v1/responses", b'{"model": "m"} x'),
]


def test_a_body_the_app_refuses_first_is_answered_natively_as_the_app_answers_it(
    engines: list[FakeEngine],
) -> None:
    """The app refuses these bodies with the error of the parser both planes share
    (``smetric_vllm::parse_openai_body``) or of its own shape checks after it: the gateway
    answers them itself, byte for byte the app's status and body, and counts each as a native
    request."""
    urls = [{"url": e.url, "kv_events": "off"} for e in engines]
    answers: dict[str, list[tuple[int, Any]]] = {}
    p = proxy_for(urls, tokens={"mode": "approximate"})
    try:
        for plane in ("compiled", "app"):
            send = sender(p, plane)
            got = []
            for n, (path, raw) in enumerate(BAD_OPENAI_BODIES):
                status, headers, body = send(p.url, path, raw=raw, headers={"X-Request-Id": f"bad-{n}"})
                assert headers["x-request-id"] == f"bad-{n}", "a refused request has its id too"
                got.append((status, json.loads(body)))
            answers[plane] = got
            if plane == "compiled":
                text = page(p)
                apis = ("chat", "completions", "messages", "responses")
                native = sum(metric(text, "smetric_proxy_native_requests_total", api=a) for a in apis)
                assert native == len(BAD_OPENAI_BODIES), "answered by the gateway, not the app"
                assert metric(text, "smetric_routed_total") == 0
    finally:
        p.stop()
    assert answers["compiled"] == answers["app"]
    statuses = [status for status, _ in answers["compiled"]]
    not_found = [i for i, (_, raw) in enumerate(BAD_OPENAI_BODIES) if b'"nope"' in raw or b"resp_never" in raw]
    assert [statuses[i] for i in not_found] == [404, 404], "the model and the stored id come first"
    assert all(status == 400 for i, status in enumerate(statuses) if i not in not_found)
    assert answers["compiled"][2][1]["error"]["param"] == "messages"


def test_the_gateways_route_table_is_the_apps() -> None:
    """``SHARED_ROUTES`` (what the gateway answers a wrong method and an unknown path by) is the
    app's routes table, method for method: a route added to one and not the other fails here."""
    engine = FakeEngine(port=0, speedup=1000).start()
    p = proxy_for([engine.url])
    try:
        assert p.proxy is not None
        app = p.proxy.app()
        routes = [r for r in app.router.routes() if r.resource is not None]
        table = {(r.method, r.resource.canonical) for r in routes if r.resource is not None}
        assert ("*", "/{path}") in table, "the catch-all, which the gateway's no-route answer stands for"
        # aiohttp's canonical form drops a variable's own pattern: compared apart, below.
        shared = {(method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", pattern)) for method, pattern in SHARED_ROUTES}
        assert table - {("*", "/{path}")} == shared
        assert len(SHARED_ROUTES) == len(shared)
        any_text = {pattern for _, pattern in SHARED_ROUTES if r"[\s\S]+" in pattern}
        for route in routes:
            info = route.resource.get_info() if route.resource is not None else {}
            if "pattern" in info and route.method != "*":
                takes_any = r"[\s\S]+" in info["pattern"].pattern
                assert takes_any == any(route.resource.canonical == re.sub(r":[^}]*", "", p) for p in any_text)
    finally:
        p.stop()
        engine.stop()


DOOR_CASES: list[tuple[str, str, Any]] = [
    # A wrong method on a path served with others: the 405 with `Allow`, in the path's shape.
    ("GET", CHAT, None),
    ("PUT", "/v1/messages", b"{}"),
    ("DELETE", "/v1/completions", b"{}"),
    ("PATCH", "/v1/responses", b"{}"),
    ("PUT", "/v1/responses/resp_x", b"{}"),
    ("POST", "/v1/models", b"{}"),
    ("GET", "/v1/sessions/s-1/end", None),
    ("PUT", "/health", b""),
    # A path no route serves: the pass-through 404 naming it.
    ("GET", "/v1/nothing", None),
    ("POST", "/v1/chat/completions/", b"{}"),
    ("DELETE", "/v1/models/a/b", None),
    ("POST", "/v1/messages/x/y", b"{}"),
    # A stored response's id the proxy never issued: the Responses adapter's 404.
    ("GET", "/v1/responses/resp_never-issued", None),
    ("DELETE", "/v1/responses/resp_never-issued", None),
    ("POST", "/v1/responses/resp_never-issued/cancel", b""),
    ("POST", "/v1/responses", {"model": "m", "input": "x", "previous_response_id": "resp_nope"}),
    # The id is opened while the body is parsed: before the model is checked.
    ("POST", "/v1/responses", {"model": "nope", "input": "x", "previous_response_id": "resp_nope"}),
]


def test_wrong_methods_unknown_paths_and_unissued_ids_are_answered_at_the_door_as_the_app_answers_them(
    storing_engines: list[FakeEngine],
) -> None:
    """Each case's status, ``Allow`` and body are the app's (the same request handed to it
    compared); through the gateway none of them reaches the app: the 405s are the door's own
    tally (the app's stays 0) and the 404s native requests, and ``/metrics`` counts them as the
    app's own answers would be counted."""
    urls = [{"url": e.url, "kv_events": "off"} for e in storing_engines]
    answers: dict[str, list[tuple[int, str | None, Any]]] = {}
    p = proxy_for(urls, tokens={"mode": "approximate"})
    try:
        for plane in ("compiled", "app"):
            send = sender(p, plane)
            got = []
            for n, (method, path, body) in enumerate(DOOR_CASES):
                sent = {"raw": body} if isinstance(body, bytes) else {"body": body} if body else {}
                status, headers, raw = send(p.url, path, method=method, headers={"X-Request-Id": f"door-{n}"}, **sent)
                got.append((status, headers.get("allow"), json.loads(raw)))
            answers[plane] = got
            if plane == "compiled":
                assert p.proxy is not None
                assert p.proxy.telemetry.client_errors["http_405"] == 0, "no 405 reached the app"
                text = page(p)
                assert metric(text, "smetric_proxy_native_requests_total", api="passthrough") == 4
                assert metric(text, "smetric_proxy_native_requests_total", api="responses") == 5
                assert metric(text, "smetric_routed_total") == 0
                assert metric(text, "smetric_proxy_responses_total", code="405") == 8
                assert metric(text, "smetric_proxy_client_errors_total", kind="http_405") == 8
                assert metric(text, "smetric_proxy_responses_total", code="404") == 9
    finally:
        p.stop()
    assert answers["compiled"] == answers["app"]
    statuses = [status for status, _, _ in answers["compiled"]]
    assert statuses == [405] * 8 + [404] * 9
    assert [allow for _, allow, _ in answers["compiled"][:8]] == [
        "POST",
        "POST",
        "POST",
        "POST",
        "DELETE,GET",
        "GET,HEAD",
        "POST",
        "GET,HEAD",
    ]
    assert answers["compiled"][1][2]["type"] == "error", "Anthropic's shape under /v1/messages"
    assert answers["compiled"][8][2]["error"]["message"] == "no such route: /v1/nothing"
    assert answers["compiled"][12][2]["error"]["param"] == "response_id"


END_IDS = [
    "/v1/sessions/a%2Fb%20c/end",
    "/v1/sessions/%C3%A9%25/end",
    "/v1/sessions/%252F/end",
    "/v1/sessions/%2525%2f/end",
    "/v1/sessions/x%3By%23/end",
    "/v1/sessions/%E2%82%AC/end",
    "/finish_session?session%5Fid=%E2%82%AC",
    "/finish_session?a=%FF&session_id=b%26c",
    "/finish_session?session_id=%3D%25&session_id=later",
]


def test_escaped_session_end_ids_are_decoded_natively_as_the_app_decodes_them(engines: list[FakeEngine]) -> None:
    """Each escaped id's answer is the app's (the same request handed to it compared), and
    through the gateway every one is a native request."""
    p = proxy_for([{"url": e.url, "kv_events": "off"} for e in engines], tokens={"mode": "approximate"})
    cases: list[Case] = [("POST", path, None, {}) for path in END_IDS]
    try:
        native = answered(p, "compiled", cases)
        served = metric(page(p), "smetric_proxy_native_requests_total", api="session_end")
        assert served == len(END_IDS), "decoded by the gateway, not handed to the app"
        assert native == answered(p, "app", cases)
    finally:
        p.stop()
    assert [body["id"] for _, body in native][:2] == ["a/b c", "é%"]


IMPOSSIBLE_END_IDS = [
    "/finish_session",
    "/finish_session?session_id=",
    "/finish_session?other=1",
    "/v1/sessions/a%0Ab/end",
    "/v1/sessions/tab%09/end",
    "/v1/sessions/" + "s" * 257 + "/end",
    "/v1/sessions/" + "%C3%A9" * 200 + "/end",
    "/finish_session?session_id=" + "x" * 300,
]


def test_session_end_ids_no_session_can_have_are_refused_natively_as_the_app_does(engines: list[FakeEngine]) -> None:
    """Empty, too long or holding a control character once decoded: the gateway's 400 is the
    app's to the same request handed to it, counted as its ``session_id`` client error."""
    p = proxy_for([{"url": e.url, "kv_events": "off"} for e in engines], tokens={"mode": "approximate"})
    cases: list[Case] = [("POST", path, None, {}) for path in IMPOSSIBLE_END_IDS]
    try:
        native = answered(p, "compiled", cases)
        assert p.proxy is not None
        assert p.proxy.telemetry.client_errors["session_id"] == 0, "none reached the app"
        assert metric(page(p), "smetric_proxy_client_errors_total", kind="session_id") == len(cases)
        assert native == answered(p, "app", cases)
        assert all(status == 400 for status, _ in native)
        assert {body["error"]["code"] for _, body in native} == {"invalid_session_id"}
        assert "400 bytes" in native[6][1]["error"]["message"], "UTF-8 bytes, once decoded"
    finally:
        p.stop()


def test_the_app_answers_its_gateway_alone(engines: list[FakeEngine]) -> None:
    """A request that reaches the app's loopback port without the gateway's secret (another
    process on the host) is a 403 in the path's API shape, whatever the path: nothing skips the
    door's keys, admission and limits. The same request with the gateway's fields is served."""
    p = compiled([e.url for e in engines])
    try:
        assert p.proxy is not None and p.proxy.compiled is not None
        app = f"http://127.0.0.1:{p.proxy.compiled.app_port}"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        status, _, raw = request(app, CHAT, body)
        assert status == 403 and json.loads(raw)["error"]["message"] == NOT_FROM_GATEWAY, raw
        status, _, raw = request(app, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": []})
        assert status == 403 and json.loads(raw)["type"] == "error", "Anthropic's shape"
        wrong = {**p.proxy.compiled.delegation_headers(), GATEWAY_HEADER: "not-the-secret"}
        assert request(app, "/metrics", method="GET", headers=wrong)[0] == 403
        assert request(app, "/health", method="GET")[0] == 403
        assert app_request(p, CHAT, body)[0] == 200
        assert app_request(p, "/health", method="GET")[0] == 200
    finally:
        p.stop()
