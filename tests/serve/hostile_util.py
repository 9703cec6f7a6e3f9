"""Helpers of the hostile-input battery (``test_hostile_*.py``): a proxy in front of fake engines,
raw-socket HTTP, the error-shape check, and the end-of-case health check every case runs —
``/health`` 200, the load board at 0, no traceback logged for client input.

Everything is on loopback and bounded: sockets time out after :data:`SOCKET_TIMEOUT_S`, waits
poll a condition until a deadline."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from proxy_util import colocated_router, request

from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

SOCKET_TIMEOUT_S = 10.0


def hostile_proxy(urls: list[str], **overrides: Any) -> ProxyServer:
    """A co-located proxy for the battery (no load scraping; fast probes)."""
    overrides.setdefault("probe_interval_s", 0.1)
    overrides.setdefault("engine_load", False)
    return ProxyServer(load_config(instances=urls, port=0, **overrides)).start()


def error_of(status: int, body: bytes) -> dict[str, Any]:
    """The OpenAI error object of an answer, checked: JSON ``{"error": {message, type, ...}}``."""
    obj = json.loads(body)
    assert isinstance(obj, dict) and isinstance(obj.get("error"), dict), (status, body[:200])
    err = obj["error"]
    assert isinstance(err.get("message"), str) and err["message"], body[:200]
    assert isinstance(err.get("type"), str) and err["type"], body[:200]
    return err


def raw_exchange(port: int, data: bytes, *, read: bool = True) -> bytes:
    """Sends ``data`` on a fresh loopback connection and reads until the server closes it (or
    :data:`SOCKET_TIMEOUT_S`). No half-close: asyncio closes a connection at the client's EOF,
    before an answer; so ``data`` asks for ``Connection: close`` or is refused."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as s:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def parse_raw(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case) and body of the first HTTP/1.1 answer in ``answer``."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return status, headers, body


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition", hold_s: float = 0.0
) -> None:
    """Waits until ``condition`` holds, and has held for ``hold_s`` seconds on end (every check
    in that window true; a false one starts the window again)."""
    deadline = time.monotonic() + timeout_s
    since: float | None = None
    while True:
        now = time.monotonic()
        if condition():
            since = now if since is None else since
            if now - since >= hold_s:
                return
        else:
            since = None
        if now > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def rss_bytes() -> int:
    """This process's resident set (the proxy runs on a thread of it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def assert_healthy(p: ProxyServer, caplog: pytest.LogCaptureFixture | None = None, quiet_s: float = 0.0) -> None:
    """The end of every case: ``/health`` 200, the load board back at 0, nothing unknown told to
    the router, and no traceback logged (client input is counted, not logged). With ``quiet_s``
    the idle state must hold that long on end first: a client that reset its connection may have
    left a whole request in the door's socket, which the gateway can read and route after the
    boards first read idle (a request routed late, not one lost: it then runs and ends)."""
    assert p.proxy is not None
    router = colocated_router(p)

    # A client that reset its connection may still have its request on the way to the router when
    # the in-flight count first reads 0, so the boards are waited for too, then asserted.
    def settled() -> bool:
        boards = [router.load(url) for url in router.instances]
        idle = all((b["batch_size"], b["waiting"], b["queued"], b["active"]) == (0, 0, 0, 0) for b in boards)
        return router.stats()["in_flight"] == 0 and idle

    wait_for(settled, what="in-flight requests to end and the load boards to clear", hold_s=quiet_s)
    for url in router.instances:
        load = router.load(url)
        assert (load["batch_size"], load["waiting"], load["queued"], load["active"]) == (0, 0, 0, 0), (url, load)
    assert router.stats()["unknown_request_events"] == 0
    assert p.proxy.in_flight == 0
    status, _, body = request(p.url, "/health", method="GET")
    assert status == 200, body
    if caplog is not None:
        tracebacks = [
            r
            for r in caplog.records
            if (r.exc_info is not None or r.levelno >= logging.ERROR)
            and not r.name.startswith("smetric.fake_engine")  # the engines' logs are not the proxy's
        ]
        assert not tracebacks, [r.getMessage() for r in tracebacks]
