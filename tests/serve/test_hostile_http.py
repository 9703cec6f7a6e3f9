"""Hostile HTTP over raw sockets (issue 21 items 5, 6, 7): slow heads and bodies time out, idle
connections close, open connections are bounded, framing attacks are refused in the JSON shape,
disconnects lose nothing. Loopback only; every wait is a socket timeout or a polled deadline."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator

import pytest
from hostile_util import SOCKET_TIMEOUT_S, assert_healthy, error_of, hostile_proxy, parse_raw, raw_exchange, wait_for
from proxy_util import colocated_router, request

from smetric.fake_engine import FakeEngine
from smetric.serve.proxy import ProxyServer

BODY = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine(port=0, speedup=1000).start()
    yield e
    e.stop()


@pytest.fixture
def proxy(engine: FakeEngine) -> Iterator[ProxyServer]:
    p = hostile_proxy([engine.url], head_timeout_s=0.5, body_timeout_s=0.5, keepalive_timeout_s=1.0, max_connections=16)
    yield p
    p.stop()


def closed_by_server(s: socket.socket) -> bytes:
    """Everything the server sends until it closes ``s`` (fails after :data:`SOCKET_TIMEOUT_S`)."""
    s.settimeout(SOCKET_TIMEOUT_S)
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError("the server kept a stalled connection open") from None
    return b"".join(chunks)


def test_a_head_that_stalls_is_closed_after_the_head_timeout(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert proxy.port is not None
    sockets = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(12)]
    try:
        for i, s in enumerate(sockets):
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * i)  # never finished
        for s in sockets:
            assert closed_by_server(s) == b""
    finally:
        for s in sockets:
            s.close()
    assert proxy.proxy is not None and proxy.proxy.telemetry.client_error_counts()["head_timeout"] == 12
    assert_healthy(proxy, caplog)


def test_a_body_that_stalls_gets_a_408_and_is_never_routed(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert proxy.port is not None
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + BODY[:10])
        status, headers, body = parse_raw(closed_by_server(s))
    assert status == 408 and headers["content-type"].startswith("application/json")
    error_of(status, body)
    assert colocated_router(proxy).stats()["routed"] == 0
    assert_healthy(proxy, caplog)


def test_an_idle_connection_is_closed_after_the_keepalive_timeout(proxy: ProxyServer) -> None:
    assert proxy.port is not None
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        assert closed_by_server(s) == b""


def test_open_connections_are_bounded(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    assert proxy.port is not None
    held = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(16)]
    try:
        # Each holds a slot once the server has accepted it: a request on each proves it.
        for s in held:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(SOCKET_TIMEOUT_S)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", proxy.port)) as extra:
            status, headers, body = parse_raw(closed_by_server(extra))
        assert status == 503 and error_of(status, body)["code"] == 503 and "retry-after" in headers
    finally:
        for s in held:
            s.close()
    wait_for(lambda: request(proxy.url, "/health", method="GET")[0] == 200, what="a free slot")
    assert_healthy(proxy, caplog)


FRAMING_ATTACKS = [
    # (case, bytes) — each must be refused as a whole: 400 or 431, JSON, connection closed
    (
        "CL and TE together",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /admin/instances HTTP/1.1\r\n\r\n",
    ),
    ("TE not chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
    ("TE obfuscated", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n"),
    ("negative CL", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
    ("CL with sign", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello"),
    (
        "bad chunk size",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "obs-fold header",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\nContent-Length: 2\r\n\r\n{}",
    ),
    ("NUL in a header", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}"),
    ("space before colon", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length : 2\r\n\r\n{}"),
    ("bare LF", b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ("unknown version", b"POST /v1/completions HTTP/7.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"),
    ("too many headers", b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n"),
    ("a huge request line", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
]


@pytest.mark.parametrize(("case", "raw"), FRAMING_ATTACKS, ids=[c for c, _ in FRAMING_ATTACKS])
def test_framing_attacks_are_refused_in_the_json_shape(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture, case: str, raw: bytes
) -> None:
    assert proxy.port is not None
    answer = raw_exchange(proxy.port, raw)
    status, headers, body = parse_raw(answer)
    assert status in (400, 405, 413, 431, 501, 505), (case, answer[:300])
    assert status < 500 or status in (501, 505)
    assert len(re.findall(rb"HTTP/1\.[01] \d{3} ", answer)) == 1, "one answer: nothing smuggled behind the first"
    assert headers["content-type"].startswith("application/json") and headers["server"] == "smetric", answer[:300]
    error_of(status, body)
    assert colocated_router(proxy).stats()["routed"] == 0
    assert_healthy(proxy, caplog)


def test_pipelined_requests_are_each_answered(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    assert proxy.port is not None
    one = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    last = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = raw_exchange(proxy.port, one + one + last)
    assert answer.count(b"HTTP/1.1 200") == 3, answer[:500]
    assert_healthy(proxy, caplog)


def test_clients_that_leave_mid_body_or_before_the_answer_lose_nothing(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert proxy.port is not None
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:  # leaves mid-body
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + BODY[:5])
    stream = json.dumps({"prompt": "hello " * 50, "max_tokens": 50, "stream": True}).encode()
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:  # leaves before the answer
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(stream), stream)
            )
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    # A reset client's whole request may still be routed after the boards first read idle.
    assert_healthy(proxy, caplog, quiet_s=1.0)
