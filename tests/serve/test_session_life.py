"""Session life through ``smetric serve`` (issue 35 item 3; ``docs/serve.md``, "Session life"):
the session-end signal (``POST /v1/sessions/{id}/end``, vllm-router's ``POST /finish_session``,
the ``x-session-end`` / ``x-dynamo-session-final`` header) releases the session's state at once,
and a sub-agent's first request starts at its parent's instance when that instance is within
``parent_affinity_margin`` requests of the least busy one — sent by the official ``openai`` and
``anthropic`` SDKs (``extra_headers``) to a proxy in front of fake engines (the gateway serves
them natively; its session table is the app's). Each behaviour has its negative control: another
session keeps its state, an unknown parent or an overloaded one is placed as any first request. Bounded: a few dozen
requests per test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from proxy_util import colocated_router, metric, proxy_for, request

from smetric._core import SessionTable
from smetric.errors import InvalidConfigError
from smetric.fake_engine import FakeEngine
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer
from smetric.serve.session import (
    MAX_SESSION_ID_BYTES,
    parent_key,
    session_end,
    session_id_problem,
)

MODEL = "fake-model"
MARGIN = 2
"""The parent rule's margin in these tests (requests in flight)."""


@pytest.fixture
def proxy() -> Iterator[tuple[ProxyServer, list[FakeEngine]]]:
    """Two fake engines behind a proxy (approximate ids)."""
    engines = [FakeEngine(port=0, speedup=1000).start() for _ in range(2)]
    instances = [{"url": e.url, "kv_events": "off"} for e in engines]
    p = proxy_for(
        instances,
        tokens={"mode": "approximate"},
        parent_affinity_margin=MARGIN,
    )
    yield p, engines
    p.stop()
    for e in engines:
        e.stop()


def decision(headers: Any) -> dict[str, str]:
    return {k: v.strip('"') for k, _, v in (f.partition("=") for f in headers["x-smetric-decision"].split("; "))}


def page(p: ProxyServer) -> str:
    return request(p.url, "/metrics", method="GET")[2].decode()


def openai_client(p: ProxyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def chat(client: openai.OpenAI, text: str, headers: dict[str, str]) -> dict[str, str]:
    """One chat turn (a prompt that shares no block with the others: its first words differ);
    the decision it got."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": text + " " + "context " * 40}, {"role": "user", "content": "go"}],
        max_tokens=3,
        extra_headers=headers,
    )
    assert raw.parse().choices[0].message.content
    return decision(raw.headers)


def busy(p: ProxyServer, instance: str, n: int) -> list[int]:
    """``n`` requests in flight on ``instance`` (routed there, never finished): its load."""
    router = colocated_router(p)
    others = [u for u in router.instances if u != instance]
    ids = []
    for i in range(n):
        d = router.route([90_000 + i] * 64, exclude=others)
        assert d.instance == instance
        ids.append(d.request_id)
    return ids


def idle(p: ProxyServer, ids: list[int]) -> None:
    router = colocated_router(p)
    for rid in ids:
        router.on_aborted(rid)


def native(p: ProxyServer) -> float:
    return sum(metric(page(p), "smetric_proxy_native_requests_total", api=a) for a in ("chat", "messages"))


# -- the parent rule -------------------------------------------------------------------------------


def test_a_sub_agent_starts_at_its_parents_instance_when_cheap_and_not_when_overloaded(
    proxy: tuple[ProxyServer, list[FakeEngine]],
) -> None:
    p, _ = proxy
    client = openai_client(p)
    try:
        home = chat(client, "Parent agent: plan the refactor.", {"x-session-id": "parent-1"})["instance"]
        other = next(u for u in colocated_router(p).instances if u != home)
        assert native(p) == 1, "the parent's turn was served by the native path"
        held = busy(p, home, 1)  # the parent's instance one request busier: within the margin
        try:
            # Control: a new session with no parent (or a parent nobody has seen) goes elsewhere.
            assert chat(client, "Lone agent: triage.", {"x-session-id": "lone-1"})["instance"] == other
            unknown = {"x-session-id": "orphan-1", "x-parent-session-id": "never-seen"}
            assert chat(client, "Orphan sub-agent: search.", unknown)["instance"] == other
            # The loads are even again after those two: skew the parent's instance by one more.
            held += busy(p, home, 1)
            child = {"x-session-id": "child-1", "x-parent-session-id": "parent-1"}
            assert chat(client, "Child agent one: read the tests.", child)["instance"] == home
            # Its next request is its own: the rule no longer applies (its own home is known), and
            # a prompt it has not sent before goes where the load says.
            assert chat(client, "Child agent one, another task.", child)["instance"] == other
            held += busy(p, home, MARGIN + 1)  # now past the margin: the parent's instance is the hot spot
            codex = {"thread-id": "child-2", "x-codex-parent-thread-id": "parent-1"}
            assert chat(client, "Child agent two: write the docs.", codex)["instance"] == other
        finally:
            idle(p, held)
        assert native(p) == 6, "every request, the sub-agents' first ones included (the table is shared)"
        text = page(p)
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent") == 1
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="overloaded") == 1
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent_unknown") == 1
    finally:
        client.close()


def _anthropic_turn(p: ProxyServer) -> tuple[anthropic.Anthropic, Callable[[str, dict[str, str]], str]]:
    """An official SDK client (the caller closes it) and a turn: one Messages request with
    ``headers``, answering the instance it went to."""
    client = anthropic.Anthropic(base_url=p.url, api_key="sk-test", max_retries=0, timeout=30)

    def turn(text: str, headers: dict[str, str]) -> str:
        raw = client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=3,
            system=text + " " + "context " * 40,
            messages=[{"role": "user", "content": "go"}],
            extra_headers=headers,
        )
        assert raw.parse().content
        return decision(raw.headers)["instance"]

    return client, turn


def test_claude_code_sub_agents_are_grouped_under_their_root_and_their_parent_agent(
    proxy: tuple[ProxyServer, list[FakeEngine]],
) -> None:
    p, _ = proxy
    client, turn = _anthropic_turn(p)

    try:
        root = {"x-claude-code-session-id": "cc-root"}
        home = turn("Root agent: plan.", root)
        held = busy(p, home, 1)
        try:
            agent = {**root, "x-claude-code-agent-id": "a1"}
            assert turn("Top-level sub-agent a1: explore.", agent) == home, "a top-level sub-agent's parent is the root"
            nested = {**root, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"}
            assert turn("Nested sub-agent a2: grep.", nested) == home, "a nested one's parent is its parent agent"
        finally:
            idle(p, held)
        assert metric(page(p), "smetric_proxy_parent_placements_total", outcome="parent") == 2
    finally:
        client.close()


# -- the end of a session --------------------------------------------------------------------------


def test_the_end_endpoint_releases_that_session_and_no_other(proxy: tuple[ProxyServer, list[FakeEngine]]) -> None:
    p, _ = proxy
    client = openai_client(p)
    try:
        home_a = chat(client, "Session A: first task.", {"x-session-id": "sess-a"})["instance"]
        home_b = chat(client, "Session B: first task.", {"x-session-id": "sess-b"})["instance"]
        sessions = metric(page(p), "smetric_proxy_sessions")
        assert sessions == 2
        ended = client.post("/sessions/sess-a/end", cast_to=httpx.Response)
        assert ended.status_code == 200
        assert ended.json() == {"object": "session.end", "id": "sess-a", "ended": True, "held": True}
        again = client.post("/sessions/sess-a/end", cast_to=httpx.Response)
        assert again.json()["held"] is False, "idempotent: nothing left to release"
        assert metric(page(p), "smetric_proxy_sessions") == sessions - 1
        # A's home is gone: its sub-agent is placed as any first request. B's is kept (the control).
        held = busy(p, home_a, 1) + ([] if home_a == home_b else busy(p, home_b, 1))
        try:
            chat(client, "Sub-agent of A.", {"x-session-id": "a-child", "x-parent-session-id": "sess-a"})
            chat(client, "Sub-agent of B.", {"x-session-id": "b-child", "x-parent-session-id": "sess-b"})
        finally:
            idle(p, held)
        text = page(p)
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent_unknown") == 1
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent") == 1
        assert metric(text, "smetric_proxy_session_ends_total", via="endpoint", held="true") == 1
        assert metric(text, "smetric_proxy_session_ends_total", via="endpoint", held="false") == 1
        # vllm-router's form of the same call.
        status, _, body = request(p.url, "/finish_session?session_id=sess-b", method="POST")
        assert status == 200 and json.loads(body)["held"] is True
    finally:
        client.close()


def test_the_end_header_releases_the_session_after_its_last_request(
    proxy: tuple[ProxyServer, list[FakeEngine]],
) -> None:
    """Completions count a hinted session's turns in the session table: the header's request is
    still a follow-up, the next request under the same id starts over; another session keeps
    counting. Dynamo's ``x-dynamo-session-final`` does the same."""
    p, _ = proxy
    client = openai_client(p)

    def turn(session: str, **extra: str) -> str:
        raw = client.completions.with_raw_response.create(
            model=MODEL,
            prompt=f"{session}: " + "the repository's history " * 30,
            max_tokens=2,
            extra_headers={"x-session-id": session, **extra},
        )
        assert raw.parse().choices[0].text
        return decision(raw.headers)["first_turn"]

    try:
        assert [turn("c-1"), turn("c-1"), turn("c-2")] == ["1", "0", "1"]
        assert turn("c-1", **{"x-session-end": "true"}) == "0", "the last request is a follow-up like any"
        assert turn("c-1") == "1", "ended: the id starts over"
        assert turn("c-2") == "0", "the control session keeps its turns"
        assert turn("c-2", **{"x-dynamo-session-final": "True"}) == "0"
        assert turn("c-2") == "1"
        assert turn("c-1", **{"x-session-end": "false"}) == "0", "false ends nothing"
        text = page(p)
        assert metric(text, "smetric_proxy_session_ends_total", via="header", held="true") == 2
        completions = metric(text, "smetric_proxy_native_requests_total", api="completions")
        assert completions == 9, "every hinted completion, its turn counted in the shared table"
    finally:
        client.close()


def test_the_anthropic_sdk_ends_a_session_by_header(proxy: tuple[ProxyServer, list[FakeEngine]]) -> None:
    p, _ = proxy
    client, turn = _anthropic_turn(p)

    try:
        turn("Agent X.", {"x-session-id": "x"})
        turn("Agent Y.", {"x-session-id": "y"})
        before = native(p)
        turn("Agent X, done.", {"x-session-id": "x", "x-session-end": "true"})
        assert native(p) == before + 1, "the session's last request is served natively too"
        turn("Sub-agent of X.", {"x-session-id": "x-child", "x-parent-session-id": "x"})
        turn("Sub-agent of Y.", {"x-session-id": "y-child", "x-parent-session-id": "y"})
        text = page(p)
        assert metric(text, "smetric_proxy_session_ends_total", via="header", held="true") == 1
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent_unknown") == 1, "x's home is gone"
        assert metric(text, "smetric_proxy_parent_placements_total", outcome="parent") == 1, "y's is kept"
    finally:
        client.close()


# -- bad input -------------------------------------------------------------------------------------


def test_bad_session_ids_and_end_headers_are_typed_400s_in_the_apis_shape(
    proxy: tuple[ProxyServer, list[FakeEngine]],
) -> None:
    p, _ = proxy
    client = openai_client(p)
    claude = anthropic.Anthropic(base_url=p.url, api_key="sk-test", max_retries=0, timeout=30)
    try:
        for path in (
            "/sessions/" + "s" * (MAX_SESSION_ID_BYTES + 1) + "/end",
            "/sessions/a%0D%0Ab/end",  # CR LF
            "/sessions/a%00b/end",
        ):
            with pytest.raises(openai.BadRequestError) as e:
                client.post(path, cast_to=httpx.Response)
            assert e.value.code == "invalid_session_id" and e.value.param == "session_id", path
        status, _, body = request(p.url, "/finish_session", method="POST")
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_session_id"
        # A session id at the limit, and one with a slash (a Claude Code sub-agent's key), are ids.
        longest = client.post("/sessions/" + "s" * MAX_SESSION_ID_BYTES + "/end", cast_to=httpx.Response)
        assert longest.status_code == 200
        assert client.post("/sessions/root/agent-1/end", cast_to=httpx.Response).json()["id"] == "root/agent-1"
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=2,
                extra_headers={"x-session-id": "s", "x-session-end": "maybe"},
            )
        assert e.value.code == "invalid_session_end"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2, extra_headers={"x-session-end": "1"}
            )
        assert e.value.code == "session_end_without_session"
        with pytest.raises(anthropic.BadRequestError) as a:
            claude.messages.create(
                model=MODEL,
                max_tokens=2,
                messages=messages,
                extra_headers={"x-session-id": "s", "x-dynamo-session-final": "yes"},
            )
        assert a.value.body["type"] == "error", "Anthropic's error shape"  # type: ignore[index]
        assert a.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "x-dynamo-session-final" in a.value.body["error"]["message"]  # type: ignore[index]
        assert metric(page(p), "smetric_proxy_session_ends_total", via="endpoint", held="false") == 2
    finally:
        client.close()
        claude.close()


def test_the_session_end_expires_llm_ds_session_cookie(fleet: list[FakeEngine]) -> None:
    cfg = load_config(instances=[e.url for e in fleet], port=0, engine_load=False, policy="llmd_session_affinity")
    with ProxyServer(cfg) as p:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, headers, _ = request(p.url, "/v1/chat/completions", body, headers={"x-session-id": "k"})
        assert (
            status == 200
            and headers["set-cookie"].startswith("llm-d-session=")
            and "Max-Age" not in headers["set-cookie"]
        )
        ends = {"x-session-id": "k", "x-session-end": "true", "Cookie": headers["set-cookie"].split(";")[0]}
        status, headers, _ = request(p.url, "/v1/chat/completions", body, headers=ends)
        assert (
            status == 200
            and headers["set-cookie"].startswith("llm-d-session=;")
            and "Max-Age=0" in headers["set-cookie"]
        )
        status, headers, _ = request(p.url, "/v1/sessions/k/end", method="POST")
        assert status == 200 and "Max-Age=0" in headers["set-cookie"]
        assert native(p) == 2, "both answers, the cleared cookie's included, were the gateway's"


def test_the_gateway_and_the_app_keep_one_session_table(fleet: list[FakeEngine]) -> None:
    """What the native path answers is in the app's table at once (no records drained), and an
    end header the native path served releases the app's entry."""
    cfg = load_config(instances=[e.url for e in fleet], port=0, engine_load=False)
    with ProxyServer(cfg) as p:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, headers, _ = request(p.url, "/v1/chat/completions", body, headers={"x-session-id": "shared"})
        assert status == 200
        served_by = decision(headers)["instance"]
        assert p.proxy is not None
        sessions = p.proxy.sessions
        assert sessions.home("shared") == served_by, "placed by the gateway, read by the app"
        assert native(p) == 1
        ends = {"x-session-id": "shared", "x-session-end": "1"}
        status, _, _ = request(p.url, "/v1/chat/completions", body, headers=ends)
        assert status == 200 and native(p) == 2
        assert sessions.home("shared") is None and len(sessions) == 0, "released by the gateway"
        assert metric(page(p), "smetric_proxy_session_ends_total", via="header", held="true") == 1


# -- the pieces ------------------------------------------------------------------------------------


def test_the_table_keeps_turns_and_homes_bounded_and_ends_an_entry_at_once() -> None:
    t = SessionTable(capacity=2, ttl_s=10)
    t.place("a", "http://i1", now=0)
    assert t.next_turn("a", now=1) == 1 and t.home("a", now=1) == "http://i1", "a placed entry has no turn yet"
    assert t.next_turn("a", now=2) == 2
    assert t.end("a") and t.home("a", now=2) is None and t.next_turn("a", now=3) == 1, "ended: starts over"
    assert not t.end("never"), "nothing held"
    t.place("b", "http://i2", now=4)
    assert t.home("b", now=15) is None, "idle past the ttl"
    t.place("c", "http://i1", now=16)
    t.place("d", "http://i2", now=17)
    assert len(t) == 2 and t.home("a", now=17) is None, "the least recently used entry was dropped"


def test_parent_keys_follow_each_agents_headers() -> None:
    assert parent_key({"x-codex-parent-thread-id": "t0", "thread-id": "t1"}) == "t0"
    assert parent_key({"x-parent-session-id": "s0"}) == "s0"
    assert parent_key({"x-dynamo-parent-session-id": "d0"}) == "d0"
    cc = {"x-claude-code-session-id": "r"}
    assert parent_key({**cc, "x-claude-code-agent-id": "a"}) == "r", "a top-level sub-agent: its root"
    nested = {**cc, "x-claude-code-agent-id": "b", "x-claude-code-parent-agent-id": "a"}
    assert parent_key(nested) == "r/a", "the key the parent agent's own requests have"
    assert parent_key({**cc, "x-claude-code-parent-agent-id": "a"}) is None, "the root's stray header is ignored"
    assert parent_key({"x-session-id": "s"}) is None


def test_end_headers_and_ids_are_checked() -> None:
    assert session_end({"x-session-end": " TRUE "}) and session_end({"x-dynamo-session-final": "1"})
    assert not session_end({}) and not session_end({"x-session-end": "false"})
    with pytest.raises(ValueError, match="x-session-end"):
        session_end({"x-session-end": "yes"})
    assert session_id_problem("0f8e-sub/agent") is None
    for bad in ("", "a\r\nb", "a\x00", "x" * (MAX_SESSION_ID_BYTES + 1), "é" * (MAX_SESSION_ID_BYTES // 2 + 1)):
        assert session_id_problem(bad) is not None, repr(bad)


def test_the_parent_rules_settings_are_checked() -> None:
    assert load_config(instances=["http://h:1"], parent_affinity_margin=0).parent_affinity_margin == 0
    for bad in ({"parent_affinity_margin": -1}, {"parent_affinity_margin": True}, {"parent_affinity": "yes"}):
        with pytest.raises(InvalidConfigError) as e:
            load_config(instances=["http://h:1"], **bad)
        assert e.value.field == next(iter(bad)), bad


def test_an_end_header_ends_a_session_its_body_names(proxy: tuple[ProxyServer, list[FakeEngine]]) -> None:
    """A completions session known only by its body's ``prompt_cache_key`` is ended by the end
    header on its last request (served natively on the compiled plane); another such session
    keeps its state."""
    p, _ = proxy
    assert p.proxy is not None
    for key in ("kept", "ended"):
        body = {"model": MODEL, "prompt": f"{key} " * 30, "max_tokens": 1, "prompt_cache_key": key}
        assert request(p.url, "/v1/completions", body)[0] == 200
    assert len(p.proxy.sessions) == 2
    last = {"model": MODEL, "prompt": "ended " * 31, "max_tokens": 1, "prompt_cache_key": "ended"}
    status, _, raw = request(p.url, "/v1/completions", last, headers={"x-session-end": "true"})
    assert status == 200, raw
    page_text = page(p)  # the gateway's records taken
    assert len(p.proxy.sessions) == 1, "the body's session released, the other kept"
    assert metric(page_text, "smetric_proxy_session_ends_total", via="header", held="true") == 1
    assert metric(page_text, "smetric_proxy_native_requests_total", api="completions") == 3


def _post_raw_header(url: str, path: str, body: dict[str, Any], name: str, value: bytes) -> int:
    """POSTs ``body`` with one header sent as these bytes (http.client would encode a str as
    Latin-1)."""
    import http.client
    from urllib.parse import urlsplit

    split = urlsplit(url)
    conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port, timeout=30)
    try:
        raw = json.dumps(body).encode()
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json", name: value})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_utf8_session_header_keys_the_same_session_for_the_gateway_and_the_app(
    proxy: tuple[ProxyServer, list[FakeEngine]],
) -> None:
    """A non-ASCII session id sent as UTF-8 is the same key to the gateway (native) and the app:
    the home the answer placed is found under the app's decoded string. Bytes that are not UTF-8
    are still served (by the app, which escapes them)."""
    p, _ = proxy
    assert p.proxy is not None
    body = {"model": MODEL, "prompt": "p " * 30, "max_tokens": 1}
    for _ in range(2):
        assert _post_raw_header(p.url, "/v1/completions", body, "x-session-id", "sessão-1".encode()) == 200
    text = page(p)
    assert p.proxy.sessions.home("sessão-1") is not None, "one key on both sides of the table"
    assert len(p.proxy.sessions) == 1
    assert _post_raw_header(p.url, "/v1/completions", body, "x-session-id", "sessão-2".encode("latin-1")) == 200
    assert metric(text, "smetric_proxy_native_requests_total", api="completions") == 2
