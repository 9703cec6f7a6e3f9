"""Hostile input, case by case (issue 21 items 3, 4, 6): every client mistake is a 4xx in the API's
error shape, aiohttp's own answers included, with no traceback logged and nothing lost; bodies
are never inflated nor forwarded under a header that no longer describes them; a client's
``kv_transfer_params`` never reaches a co-located engine; no version banner. Loopback only,
bounded in requests and time."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hostile_util import assert_healthy, error_of, hostile_proxy, parse_raw, raw_exchange
from proxy_util import Stub, colocated_router, request

from smetric.fake_engine import FakeEngine
from smetric.serve.proxy import ProxyServer
from smetric.serve.request import MAX_JSON_NESTING

CHAT = "/v1/chat/completions"


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int) -> str:
    """``depth`` nested lists as JSON text (built as text: json.dumps would hit the recursion limit)."""
    return "[" * depth + "1" + "]" * depth


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine(port=0, speedup=1000).start()
    yield e
    e.stop()


@pytest.fixture
def proxy(engine: FakeEngine) -> Iterator[ProxyServer]:
    p = hostile_proxy([engine.url], admin_token="secret", max_body_bytes=1 << 20)
    yield p
    p.stop()


def _raw_chat(fragment: str) -> bytes:
    return ('{"max_tokens": 1, ' + fragment + "}").encode()


CLIENT_MISTAKES: list[tuple[str, str, bytes, int, str | None]] = [
    # (case, path, body, status, param)
    (
        "messages 3000 deep",
        CHAT,
        _raw_chat(f'"messages": [{{"role": "user", "content": {deep_json(3000)}}}]'),
        400,
        None,
    ),
    (
        "tools 3000 deep",
        CHAT,
        _raw_chat(f'"messages": [{{"role": "user", "content": "x"}}], "tools": [{{"a": {deep_json(3000)}}}]'),
        400,
        None,
    ),
    (
        "chat_template_kwargs 3000 deep",
        CHAT,
        _raw_chat(
            f'"messages": [{{"role": "user", "content": "x"}}], "chat_template_kwargs": {{"a": {deep_json(3000)}}}'
        ),
        400,
        None,
    ),
    (
        "an unknown field 300 deep",
        CHAT,
        _raw_chat(f'"messages": [{{"role": "user", "content": "x"}}], "x": {deep_json(300)}'),
        400,
        None,
    ),
    (
        "an unknown field 100k deep",
        "/v1/completions",
        f'{{"prompt": "x", "x": {deep_json(100_000)}}}'.encode(),
        400,
        None,
    ),
    (
        "lone surrogate in content",
        CHAT,
        _raw_chat('"messages": [{"role": "user", "content": "\\ud800"}]'),
        400,
        "messages",
    ),
    ("lone surrogate in role", CHAT, _raw_chat('"messages": [{"role": "\\udfff", "content": "x"}]'), 400, "messages"),
    (
        "lone surrogate in a tool",
        CHAT,
        _raw_chat('"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "\\ud83d"}]'),
        400,
        "tools",
    ),
    (
        "lone surrogate in user",
        CHAT,
        _raw_chat('"messages": [{"role": "user", "content": "x"}], "user": "\\ud800"'),
        400,
        "user",
    ),
    ("lone surrogate in a text prompt", "/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 1}', 400, "prompt"),
    (
        "an integer of 5000 digits",
        CHAT,
        _raw_chat('"messages": [{"role": "user", "content": "x", "n": ' + "9" * 5000 + "}]"),
        400,
        "messages",
    ),
    ("not JSON", CHAT, b"{nope", 400, None),
    ("invalid UTF-8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
]


@pytest.mark.parametrize(
    ("case", "path", "body", "status", "param"), CLIENT_MISTAKES, ids=[c[0] for c in CLIENT_MISTAKES]
)
def test_a_client_mistake_is_a_4xx_in_the_api_shape_and_never_routed(
    proxy: ProxyServer,
    caplog: pytest.LogCaptureFixture,
    case: str,
    path: str,
    body: bytes,
    status: int,
    param: str | None,
) -> None:
    got, headers, answer = request(proxy.url, path, raw=body)
    assert got == status, (case, got, answer[:300])
    err = error_of(got, answer)
    if param is not None:
        assert err["param"] == param, (case, err)
    assert "int_max_str_digits" not in err["message"] and "got a string" not in err["message"], err
    assert headers["content-type"].startswith("application/json")
    assert colocated_router(proxy).stats()["routed"] == 0, "a refused request is never routed"
    assert_healthy(proxy, caplog)


@pytest.mark.parametrize(
    ("path", "head"),
    [
        ("/v1/messages", '{"model": "fake-model", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]'),
        ("/v1/responses", '{"model": "fake-model", "max_output_tokens": 1, "input": "x"'),
    ],
    ids=["messages", "responses"],
)
def test_messages_and_responses_bodies_have_the_chat_nesting_limit(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture, path: str, head: str
) -> None:
    """Python's ``json`` takes these bodies to about 950 levels; chat's Rust parse stops at
    :data:`MAX_JSON_NESTING`. Every API now refuses the same bodies with the same message, and
    forwards one at the limit."""
    at_limit = f'{head}, "x": {deep_json(MAX_JSON_NESTING - 1)}}}'.encode()  # the object is a level
    status, _, answer = request(proxy.url, path, raw=at_limit)
    assert status == 200, (status, answer[:300])
    over = f'{head}, "x": {deep_json(MAX_JSON_NESTING)}}}'.encode()
    status, headers, answer = request(proxy.url, path, raw=over)
    assert status == 400, (status, answer[:300])
    assert headers["content-type"].startswith("application/json")
    err = error_of(status, answer)
    assert err["message"] == f"the body nests arrays and objects deeper than {MAX_JSON_NESTING} levels", err
    assert (json.loads(answer).get("type") == "error") == (path == "/v1/messages"), "each API's own error shape"
    assert colocated_router(proxy).stats()["routed"] == 1, "only the body at the limit is routed"
    assert_healthy(proxy, caplog)


def test_an_unknown_model_is_named_but_not_echoed_whole(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    status, _, body = request(proxy.url, "/v1/completions", {"prompt": "x", "model": "m" * 100_000})
    assert status == 404 and len(body) < 1000, len(body)
    assert error_of(status, body)["param"] == "model"
    assert_healthy(proxy, caplog)


def test_an_empty_prompt_is_routed_like_an_empty_list(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    """``""`` reached the binding as an empty ``array('I')``, which it refused (BufferError: 500)."""
    for prompt in ("", [], [[]]):
        got, _, answer = request(proxy.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert got < 500, (prompt, got, answer[:300])
    assert_healthy(proxy, caplog)


def test_admin_requests_with_hostile_values_get_4xx(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    port = proxy.port
    assert port is not None
    # A non-UTF-8 Authorization header: unauthenticated, so a 401 (not a 500).
    raw = (
        b"POST /admin/instances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xfd\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    status, _, body = parse_raw(raw_exchange(port, raw))
    assert status == 401, body
    error_of(status, body)
    auth = {"Authorization": "Bearer secret"}
    # aiohttp's own 413 (raised by request.json()) goes through the app's error hook: JSON.
    status, headers, body = request(proxy.url, "/admin/instances", raw=b'"' + b"x" * (2 << 20) + b'"', headers=auth)
    assert status == 413 and headers["content-type"].startswith("application/json")
    error_of(status, body)
    for payload in (
        b'{"url": 5}',
        b'{"url": "http://127.0.0.1:1", "kv_events": 7}',
        b'{"url": ["x"]}',
        deep_json(50_000).encode(),
        b'{"url": "http://127.0.0.1:1", "nope": 1}',
        b"\xff",
    ):
        status, _, body = request(proxy.url, "/admin/instances", raw=payload, headers=auth)
        assert status == 400, (payload[:40], status, body)
        error_of(status, body)
    assert_healthy(proxy, caplog)


def test_aiohttps_own_answers_are_in_the_json_shape_without_the_clients_bytes(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = proxy.port
    assert port is not None
    marker = "ZZmarkerZZ"
    # An unknown path is the pass-through adapter's 404 (its catch-all route), in its JSON shape.
    status, headers, body = request(proxy.url, f"/v1/{marker}", {"x": 1})
    assert status == 404
    error_of(status, body)
    assert headers["server"] == "smetric", "no Python or aiohttp version banner"
    status, headers, body = request(proxy.url, CHAT, method="GET")  # a 405 naming the path's methods
    assert status == 405 and headers["allow"] == "POST"
    error_of(status, body)
    status, _, body = request(proxy.url, CHAT, raw=b'{"messages": "' + b"x" * (2 << 20) + b'"}')
    assert status == 413
    error_of(status, body)
    # Parser errors: a malformed request line, a bad header, an oversized header — 400 or 431,
    # JSON, and never the bytes that were sent.
    for raw in (
        f"GET /{marker} HTTP/1.1 EXTRA\r\nHost: x\r\n\r\n".encode(),
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nBad Header{marker}: 1\r\n\r\n".encode(),
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nX-Big: {marker}{'a' * 9000}\r\n\r\n".encode(),
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{marker}".encode(),
        f"{marker} / HTTP/1.1\r\n\r\n".encode(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + marker.encode() + b"\r\n\r\n",
    ):
        answer = raw_exchange(port, raw)
        status, headers, body = parse_raw(answer)
        assert status in (400, 431), (raw[:60], answer[:300])
        assert marker.encode() not in answer, answer[:300]
        assert headers["content-type"].startswith("application/json") and headers["server"] == "smetric"
        error_of(status, body)
    assert proxy.proxy is not None and proxy.proxy.telemetry.client_errors, "client garbage is counted"
    assert_healthy(proxy, caplog)


def test_a_hint_header_longer_than_engines_take_is_refused_before_forwarding(
    proxy: ProxyServer, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"prompt": "hello", "max_tokens": 1}
    status, _, answer = request(proxy.url, "/v1/completions", body, headers={"x-session-id": "s" * 9000})
    assert status == 431, answer[:200]
    error_of(status, answer)
    ok = request(proxy.url, "/v1/completions", body, headers={"x-session-id": "s" * 8000})
    assert ok[0] == 200, ok[2][:300]
    assert_healthy(proxy, caplog)


def _recording_stub(seen: list[bytes]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.method != "POST":  # /health, discovery, /metrics
            return web.json_response({}, status=200 if request.path == "/health" else 404)
        seen.append(await request.read())
        return web.json_response(
            {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
        )

    return handler


def test_a_compressed_body_is_refused_not_inflated_nor_forwarded(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []
    with Stub(_recording_stub(seen)) as stub:
        p = hostile_proxy([stub.url])
        try:
            plain = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()
            bomb = gzip.compress(b"{" + b" " * (8 << 20) + b"}")  # 8 MiB of inflation from ≈8 KiB
            for encoding, body in (("gzip", gzip.compress(plain)), ("gzip", bomb), ("br", plain), ("deflate", plain)):
                status, _, answer = request(p.url, "/v1/completions", raw=body, headers={"Content-Encoding": encoding})
                assert status == 415, (encoding, status, answer[:200])
                assert error_of(status, answer)["code"] == "unsupported_content_encoding"
            assert seen == [], "nothing reached the engine"
            status, _, _ = request(p.url, "/v1/completions", raw=plain, headers={"Content-Encoding": "identity"})
            assert status == 200 and seen == [plain]
            assert_healthy(p, caplog)
        finally:
            p.stop()


def test_a_clients_kv_transfer_params_never_reach_a_colocated_engine(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []
    with Stub(_recording_stub(seen)) as stub:
        p = hostile_proxy([stub.url])
        try:
            hostile = {"remote_host": "10.0.0.66", "remote_port": 1, "do_remote_prefill": True}
            body = {"prompt": "hello", "max_tokens": 1, "kv_transfer_params": hostile, "user": "u"}
            assert request(p.url, "/v1/completions", body)[0] == 200
            forwarded = json.loads(seen[-1])
            assert "kv_transfer_params" not in forwarded and forwarded["user"] == "u"
            # The same bytes inside a string are not a field: the body goes as it was.
            plain = json.dumps({"prompt": '"kv_transfer_params"', "max_tokens": 1}).encode()
            assert request(p.url, "/v1/completions", raw=plain)[0] == 200 and seen[-1] == plain
            # Every API: each adapter tells the backend whether its parse found the field.
            messages = [{"role": "user", "content": "hi"}]
            for path, fields in (
                ("/v1/chat/completions", {"messages": messages}),
                ("/v1/messages", {"messages": messages}),
                ("/v1/responses", {"input": "hi"}),
            ):
                body = {"model": "m", "max_tokens": 1, **fields, "kv_transfer_params": hostile, "user": "u"}
                assert request(p.url, path, body)[0] < 500, path
                forwarded = json.loads(seen[-1])
                assert "kv_transfer_params" not in forwarded and forwarded["user"] == "u", path
            assert_healthy(p, caplog)
        finally:
            p.stop()


def test_an_engine_whose_models_endpoint_answers_garbage_does_not_crash_the_proxy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``/v1/models`` as text/html (or not JSON at all) raised out of the start: a traceback and
    an unclosed client session."""
    seen: list[bytes] = []
    answer = _recording_stub(seen)

    async def garbage_models(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.Response(text="<html>not json</html>", content_type="text/html")
        return await answer(request)

    with Stub(garbage_models) as stub:
        p = hostile_proxy([stub.url])
        try:
            assert p.proxy is not None and p.proxy.fleet.models == {}
            assert request(p.url, "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200
            assert_healthy(p, caplog)
        finally:
            p.stop()
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]


def test_the_error_hook_lets_each_api_adapter_render_its_own_errors(proxy: ProxyServer) -> None:
    """aiohttp's own answers take the shape of the adapter whose path they are on (Anthropic's
    differs from OpenAI's), and OpenAI's shape on a path no adapter owns."""
    from smetric.serve.errors import ProxyError
    from smetric.serve.request import RequestError

    assert proxy.proxy is not None
    for api in proxy.proxy.apis:
        for path in (api.path, api.path + "/some-id"):
            got = proxy.proxy.error_response(path, 413, "too large")
            want = api.reject(RequestError("too large", status=413))
            assert isinstance(got, web.Response) and isinstance(want, web.Response)
            assert (got.status, got.body) == (want.status, want.body), (api.name, path)
        got = proxy.proxy.error_response(api.path, 500, "broken")
        want = api.fail(ProxyError(500, "broken", "InternalServerError"))
        assert isinstance(got, web.Response) and isinstance(want, web.Response) and got.body == want.body
    other = proxy.proxy.error_response(None, 431, "request header fields too large")  # no path: OpenAI's
    assert isinstance(other, web.Response) and other.body is not None and other.status == 431
    assert json.loads(bytes(other.body))["error"]["message"] == "request header fields too large"


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]
)
def test_a_lone_surrogate_is_a_400_on_every_api(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """``/v1/messages/count_tokens`` forwarded it, and the engine's 500 came back as a 529."""
    field = {"/v1/completions": b'"prompt": "\\ud800"', "/v1/responses": b'"input": "\\udc00"'}.get(
        path, b'"messages": [{"role": "user", "content": "\\ud800 \\ud83d\\ud83d"}]'
    )
    status, _, answer = request(proxy.url, path, raw=b'{"model": "fake-model", "max_tokens": 4, ' + field + b"}")
    assert status == 400 and answer.startswith(b"{") and b"surrogate" in answer, (path, status, answer[:200])
    fine = (
        b'{"model": "fake-model", "max_tokens": 4, '
        b'"messages": [{"role": "user", "content": "\\ud83d\\ude00 \\\\ud800"}]}'
    )
    status, _, answer = request(proxy.url, path, raw=fine)
    assert status != 400 or b"surrogate" not in answer, "an escaped pair, and an escaped backslash, are text"
    assert_healthy(proxy, caplog)
