"""``smetric serve`` on loopback: the OpenAI surface, decisions, the lifecycle, failover and
safety. Upstreams are fake engines (``smetric fake-engine`` in process) or aiohttp stubs that
misbehave on purpose; every test is bounded in requests and time."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from proxy_util import ReservedPort, Stub, chat_text, colocated_router, events, free_port, metric, proxy_for, request

from smetric.fake_engine import FakeEngine
from smetric.serve.proxy import ProxyServer
from smetric.serve.upstream import forwardable

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


def decision(headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for part in headers["x-smetric-decision"].split("; "):
        key, _, value = part.partition("=")
        out[key] = value.strip('"')
    return out


def settled(p: ProxyServer) -> None:
    """Every instance's load counters are back to zero and no lifecycle call was unknown."""
    assert p.proxy is not None
    router = colocated_router(p)
    deadline = time.monotonic() + 5
    while router.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    for url in router.instances:
        load = router.load(url)
        assert (load["batch_size"], load["waiting"], load["queued"], load["active"]) == (0, 0, 0, 0), (url, load)
    assert router.stats()["unknown_request_events"] == 0, "a lifecycle call came twice or for a stranger"


def test_chat_and_completions_through_the_proxy_match_the_engine(fleet: list[FakeEngine]) -> None:
    p = proxy_for([e.url for e in fleet])
    try:
        assert p.proxy is not None
        config = colocated_router(p).config
        assert config.local_capacity_blocks == 4096, "sized from the engines' vllm:cache_config_info"
        assert config.global_capacity_blocks == 0, "no global tier unless one is declared"
        chat = {"model": "fake-model", "messages": [SYSTEM, {"role": "user", "content": "hi"}], "max_tokens": 6}
        status, headers, body = request(p.url, "/v1/chat/completions", chat)
        assert status == 200
        answer = json.loads(body)
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 6
        d = decision(headers)
        assert d["instance"] in [e.url for e in fleet] and d["reason"] == "first-turn" and d["first_turn"] == "1"
        direct = json.loads(request(d["instance"], "/v1/chat/completions", chat)[2])
        assert answer["choices"][0]["message"] == direct["choices"][0]["message"]

        status, headers, body = request(p.url, "/v1/chat/completions", {**chat, "stream": True})
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert chat_text(body) == direct["choices"][0]["message"]["content"] and events(body)[-1] == "[DONE]"

        comp = {"model": "fake-model", "prompt": list(range(1, 300)), "max_tokens": 4}
        status, headers, body = request(p.url, "/v1/completions", comp)
        assert status == 200 and json.loads(body)["usage"]["prompt_tokens"] == 299
        assert decision(headers)["tokens"] == "ids"
        settled(p)
    finally:
        p.stop()


def test_models_are_aggregated_and_requests_go_only_where_the_model_is() -> None:
    a = FakeEngine(port=0, model="model-a", speedup=1000).start()
    b = FakeEngine(port=0, model="model-b", speedup=1000).start()
    p = proxy_for([a.url, b.url])
    try:
        status, _, body = request(p.url, "/v1/models", method="GET")
        assert status == 200 and sorted(m["id"] for m in json.loads(body)["data"]) == ["model-a", "model-b"]
        for _ in range(6):
            msg = {"model": "model-b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
            status, headers, _ = request(p.url, "/v1/chat/completions", msg)
            assert status == 200 and decision(headers)["instance"] == b.url
        assert request(p.url, "/health", method="GET")[0] == 200
    finally:
        p.stop()
        a.stop()
        b.stop()


def test_first_turns_spread_and_follow_ups_go_home(fleet: list[FakeEngine]) -> None:
    p = proxy_for([e.url for e in fleet])
    try:
        homes: dict[int, str] = {}
        for s in range(6):
            msgs = [SYSTEM, {"role": "user", "content": f"session {s}: " + "task " * 100}]
            _, h, _ = request(p.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
            homes[s] = decision(h)["instance"]
        assert set(homes.values()) == {e.url for e in fleet}, "first turns use every instance"
        time.sleep(0.3)  # the KV events of the first turns reach the index
        for s in range(6):
            msgs = [
                SYSTEM,
                {"role": "user", "content": f"session {s}: " + "task " * 100},
                {"role": "assistant", "content": "lorem ipsum"},
                {"role": "tool", "content": "output " * 50},
            ]
            _, h, _ = request(p.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
            d = decision(h)
            assert d["first_turn"] == "0" and d["instance"] == homes[s] and d["reason"] == "sticky"
            assert int(d["local_hit_tokens"]) > 100
        page = request(p.url, "/metrics", method="GET")[2].decode()
        assert metric(page, "smetric_proxy_decisions_total", policy="smetric", reason="sticky", first_turn="false") == 6
        assert metric(page, "smetric_first_turns_total") == 6
        assert metric(page, "smetric_proxy_hit_tokens_total", tier="local") > 600
        assert "smetric_proxy_decision_seconds_bucket" in page and "smetric_proxy_upstream_first_byte_seconds" in page
        settled(p)
    finally:
        p.stop()


def _chunk(text: str, finish: str | None = None) -> bytes:
    """One vLLM chat chunk event."""
    event = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _role_chunk() -> bytes:
    """vLLM's opening chat chunk: the role and no text."""
    event = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _stream_stub(release: threading.Event, received: list[dict[str, Any]]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        received.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_role_chunk() + _chunk("hello "))
        # Waits until the test has read the first chunk through the proxy (or gives up): a proxy
        # that buffered the stream would never let it.
        await asyncio_wait(release)
        await resp.write(_chunk("world", finish="stop") + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return handler


async def asyncio_wait(event: threading.Event, timeout: float = 10.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not event.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def _open_stream(base: str, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def test_streams_are_relayed_as_they_arrive_and_the_lifecycle_follows() -> None:
    release = threading.Event()
    received: list[dict[str, Any]] = []
    with Stub(_stream_stub(release, received)) as stub:
        p = proxy_for([stub.url])
        try:
            assert p.proxy is not None
            conn, resp = _open_stream(p.url, {"messages": [{"role": "user", "content": "x"}], "stream": True})
            first = resp.read1()
            assert b"hello" in first, "the first chunk arrives before the upstream finished"
            load = colocated_router(p).load(stub.url)
            assert (load["batch_size"], load["waiting"]) == (1, 0), "prefilled at the first byte, still running"
            release.set()
            rest = resp.read()
            conn.close()
            assert chat_text(first + rest) == "hello world"
            settled(p)
        finally:
            p.stop()


def test_a_client_that_leaves_mid_stream_aborts_its_attempt_once() -> None:
    release = threading.Event()
    with Stub(_stream_stub(release, [])) as stub:
        p = proxy_for([stub.url])
        try:
            assert p.proxy is not None
            conn, resp = _open_stream(p.url, {"messages": [{"role": "user", "content": "x"}], "stream": True})
            assert b"hello" in resp.read1()
            resp.close()  # the client goes away mid-stream
            conn.close()
            release.set()
            settled(p)
            assert colocated_router(p).stats()["routed"] == 1
        finally:
            p.stop()


def test_connection_errors_are_retried_the_dead_instance_ejected_and_readmitted(fleet: list[FakeEngine]) -> None:
    reserved = ReservedPort()
    dead_port = reserved.port
    dead = f"http://127.0.0.1:{dead_port}"
    p = proxy_for([dead, fleet[0].url], eject_after=2, policy="round_robin")
    try:
        for i in range(8):
            status, headers, _ = request(
                p.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 2}
            )
            assert status == 200 and decision(headers)["instance"] == fleet[0].url
        page = request(p.url, "/metrics", method="GET")[2].decode()
        assert metric(page, "smetric_proxy_ejections_total", instance=dead) == 1
        assert metric(page, "smetric_proxy_instance_ejected", instance=dead) == 1
        assert sum(metric(page, "smetric_proxy_retries_total", cause=c) for c in ("ClientConnectorError",)) == 2
        settled(p)

        async def healthy(request: web.Request) -> web.StreamResponse:
            return web.json_response({})

        reserved.release()  # the engine comes back on its port
        with Stub(healthy, port=dead_port):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                page = request(p.url, "/metrics", method="GET")[2].decode()
                if metric(page, "smetric_proxy_readmissions_total", instance=dead) == 1:
                    break
                time.sleep(0.05)
            assert metric(page, "smetric_proxy_instance_ejected", instance=dead) == 0
    finally:
        reserved.release()
        p.stop()


def test_a_5xx_before_the_first_byte_is_retried_elsewhere(fleet: list[FakeEngine]) -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "engine dead"}}, status=500)

    with Stub(broken) as stub:
        p = proxy_for([stub.url, fleet[0].url], policy="round_robin", eject_after=100)
        try:
            attempts = []
            for i in range(4):
                body = {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 2, "stream": i % 2 == 1}
                status, headers, _ = request(p.url, "/v1/chat/completions", body)
                d = decision(headers)
                assert status == 200 and d["instance"] == fleet[0].url
                attempts.append(int(d["attempt"]))
            assert 2 in attempts and len(
                [s for s in stub.seen if s["path"] == "/v1/chat/completions"]
            ) == attempts.count(2)
            settled(p)
        finally:
            p.stop()


def test_a_stream_cut_after_its_first_chunk_continues_on_another_instance() -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_role_chunk() + _chunk("hello "))
        assert request.transport is not None
        request.transport.abort()  # the engine dies mid-stream
        return resp

    release = threading.Event()
    release.set()
    received: list[dict[str, Any]] = []
    with Stub(cut) as a, Stub(_stream_stub(release, received)) as b:
        p = proxy_for([a.url, b.url], policy="round_robin", eject_after=100)
        try:
            msgs = [{"role": "user", "content": "x"}]
            status, _, body = request(
                p.url, "/v1/chat/completions", {"messages": msgs, "stream": True, "max_tokens": 9}
            )
            assert status == 200
            assert chat_text(body) == "hello hello world", "the continuation's text follows the cut stream's"
            roles = [e for e in events(body) if isinstance(e, dict) and "role" in e["choices"][0]["delta"]]
            assert len(roles) == 1 and events(body).count("[DONE]") == 1
            cont = received[-1]
            assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
            assert cont["messages"] == [*msgs, {"role": "assistant", "content": "hello "}]
            assert cont["max_tokens"] == 8
            # /metrics takes the gateway's records first (the app's counters lag them by a drain).
            page = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_resumed_streams_total") == 1
            settled(p)
        finally:
            p.stop()


def test_bad_input_gets_openai_errors_and_loses_nothing(fleet: list[FakeEngine]) -> None:
    p = proxy_for([fleet[0].url], max_body_bytes=4096)
    try:
        cases: list[tuple[bytes, int]] = [
            (b"{not json", 400),
            (b"[1, 2]", 400),
            (json.dumps({"messages": "hello"}).encode(), 400),
            (json.dumps({"messages": [{"role": "user", "content": "x"}], "model": "nope"}).encode(), 404),
            (json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode(), 413),
        ]
        for raw, want in cases:
            status, _, body = request(p.url, "/v1/chat/completions", raw=raw)
            assert status == want, (raw[:40], status, body)
            err = json.loads(body)["error"]
            assert isinstance(err["message"], str) and err["message"] and "type" in err, body
        status, _, _ = request(p.url, "/v1/completions", {"prompt": [1, -5]})
        assert status == 400
        huge = {"x-padding": "a" * 20_000}  # over max_header_bytes (8190 B): refused before it is forwarded
        assert request(p.url, "/v1/chat/completions", {"messages": []}, headers=huge)[0] == 431
        ok = request(p.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        assert ok[0] == 200
        assert colocated_router(p).stats()["routed"] == 1, "bad requests are never routed"
        settled(p)
    finally:
        p.stop()


def test_hop_by_hop_headers_are_dropped_and_the_rest_forwarded() -> None:
    assert forwardable({"Connection": "keep-alive, X-Drop", "X-Drop": "1", "TE": "trailers", "X-Keep": "2"}) == {
        "X-Keep": "2"
    }
    received: list[dict[str, Any]] = []
    release = threading.Event()
    release.set()
    with Stub(_stream_stub(release, received)) as stub:
        p = proxy_for([stub.url])
        try:
            host, port = p.url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=15)
            headers = {
                "Content-Type": "application/json",
                "Connection": "keep-alive, X-Drop-Me",
                "X-Drop-Me": "1",
                "Proxy-Authorization": "Basic c2VjcmV0",
                "Authorization": "Bearer engine-key",
                "x-session-id": "abc",
            }
            conn.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}), headers)
            assert conn.getresponse().read()
            conn.close()
            seen = {k.lower(): v for k, v in stub.seen[-1]["headers"].items()}
            assert seen["authorization"] == "Bearer engine-key" and seen["x-session-id"] == "abc"
            assert "x-drop-me" not in seen and "proxy-authorization" not in seen
        finally:
            p.stop()


def test_admin_endpoints_are_off_without_a_token_and_guarded_with_one(fleet: list[FakeEngine]) -> None:
    p = proxy_for([fleet[0].url])
    try:
        assert request(p.url, "/admin/instances", {"url": fleet[1].url})[0] == 404
    finally:
        p.stop()
    p = proxy_for([fleet[0].url], admin_token="s3cret")
    try:
        assert (
            request(p.url, "/admin/instances", {"url": fleet[1].url}, headers={"Authorization": "Bearer no"})[0] == 401
        )
        status, _, body = request(
            p.url, "/admin/instances", {"url": fleet[1].url}, headers={"Authorization": "Bearer s3cret"}
        )
        assert status == 200 and json.loads(body)["instances"] == [fleet[0].url, fleet[1].url]
        assert colocated_router(p).instances == [fleet[0].url, fleet[1].url]
        status, _, _ = request(
            p.url, f"/admin/instances?url={fleet[0].url}", method="DELETE", headers={"Authorization": "Bearer s3cret"}
        )
        assert status == 200 and colocated_router(p).instances == [fleet[1].url]
        ok = request(p.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        assert ok[0] == 200 and decision(ok[1])["instance"] == fleet[1].url
    finally:
        p.stop()


def test_sigterm_drains_in_flight_requests_then_exits() -> None:
    engine = FakeEngine(port=0, speedup=2).start()  # slow: a 40-token answer takes a while
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "smetric", "serve", "--port", str(port), "--instance", engine.url, "--kv-events", "off"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if request(base, "/health", method="GET")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        conn, resp = _open_stream(
            base, {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 40}
        )
        first = resp.read1()
        assert first
        proc.send_signal(signal.SIGTERM)
        rest = resp.read()
        conn.close()
        body = first + rest
        finish = [e["choices"][0]["finish_reason"] for e in events(body) if isinstance(e, dict) and e["choices"]]
        assert events(body)[-1] == "[DONE]" and finish[-1] in ("stop", "length"), "the in-flight stream finished"
        assert proc.wait(timeout=30) == 0
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection("127.0.0.1", port, timeout=5).connect()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        engine.stop()


def test_a_local_tokenizer_routes_on_the_engines_own_ids_with_an_exact_index() -> None:
    # The gateway serves chat natively: its own tokenizer and template.
    tokenizer = str(ROOT / "tests" / "data" / "serve" / "tokenizer.json")
    engines = [
        FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=1000, tokenizer=tokenizer).start()
        for _ in range(2)
    ]
    p = proxy_for([e.url for e in engines], tokens={"mode": "tokenizer", "tokenizer": tokenizer})
    try:
        assert colocated_router(p).config.index_mode == "exact", "events are the index's truth"
        msgs = [SYSTEM, {"role": "user", "content": "refactor the parser " * 60}]
        status, h, body = request(p.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        assert status == 200 and decision(h)["tokens"] == "tokenizer"
        home = decision(h)["instance"]
        prompt_tokens = json.loads(body)["usage"]["prompt_tokens"]
        # Wait until the engine's KV events have reached the index: it holds the prompt's blocks.
        deadline = time.monotonic() + 10
        while colocated_router(p).stats()["index_local_blocks"].get(home, 0) < prompt_tokens // 16:
            assert time.monotonic() < deadline, "the first turn's KV events never reached the index"
            time.sleep(0.01)
        follow = [*msgs, {"role": "assistant", "content": "done"}, {"role": "user", "content": "now test it " * 30}]
        status, h, body = request(p.url, "/v1/chat/completions", {"messages": follow, "max_tokens": 2})
        d = decision(h)
        cached = json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert d["instance"] == home and d["reason"] == "sticky"
        assert int(d["local_hit_tokens"]) == cached > prompt_tokens // 2, "the router's hit is the engine's"
        settled(p)
        page = request(p.url, "/metrics", method="GET")[2].decode()
        native = metric(page, "smetric_proxy_native_requests_total", api="chat")
        assert native == 2, native
    finally:
        p.stop()
        for e in engines:
            e.stop()


def test_a_request_over_its_time_limit_ends_its_stream_with_an_error_event() -> None:
    async def stalls(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_role_chunk() + _chunk("partial "))
        await asyncio_wait(threading.Event(), timeout=2.5)  # then nothing, for longer than the limit
        return resp

    with Stub(stalls) as stub:
        p = proxy_for([stub.url], client_timeout_s=1.0)
        try:
            status, _, body = request(p.url, "/v1/chat/completions", {"messages": [{"role": "user"}], "stream": True})
            assert status == 200 and chat_text(body) == "partial "
            errors = [e for e in events(body) if isinstance(e, dict) and "error" in e]
            assert errors and "timed out" in errors[0]["error"]["message"] and events(body)[-1] == "[DONE]"
            settled(p)
        finally:
            p.stop()
