"""Client-controlled state is bounded (issue 21 item 1): session hints are kept as fixed-size
digests in a table bounded in entries (so in bytes), and a stream of distinct multi-MiB hints
leaves the proxy's memory flat. Loopback, bounded in requests and time."""

from __future__ import annotations

import http.client
import inspect
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from aiohttp import web
from hostile_util import assert_healthy, hostile_proxy, rss_bytes
from proxy_util import Stub

from smetric._core import SessionTable, session_digest
from smetric.serve.session import ENTRY_BYTES

HINTS = 2048
"""Distinct hints sent through the proxy."""
HINT_BYTES = 2 << 20
"""Each hint's size: 2 MiB (the table kept them whole: ≈ 4 GiB for this test)."""
RSS_GROWTH_BOUND = 96 << 20
"""Allowed growth of the process's RSS over the run (buffers, allocator slack); the hints total
4 GiB, so a table that kept them would exceed it forty times over."""


def test_the_table_keeps_a_fixed_size_digest_of_any_key() -> None:
    table = SessionTable(capacity=100)
    keys = [f"{i}".encode().hex() * 50_000 for i in range(300)] + ["\ud800lone", "x"]
    for key in keys:
        assert table.next_turn(key) == 1
    assert table.next_turn("x") == 2, "a key is still recognised by its digest"
    assert table.next_turn("\ud800lone") == 2, "a lone surrogate's key too"
    assert len(table) == 100
    assert len(session_digest("x")) == 16
    assert session_digest("\ud800lone") != session_digest("lone")
    assert session_digest("\ud800lone") != session_digest("\ud801lone"), "surrogates are not replaced"
    # The keys total 100 MB; the table holds its entries' structures alone.
    assert table.heap_bytes() < 100 * ENTRY_BYTES + 4096, "the documented bound per entry holds"


def test_the_tables_signature_states_its_real_defaults() -> None:
    """The signature's defaults are written out for Python (stubtest reads them): they must be
    the core's."""
    parameters = inspect.signature(SessionTable).parameters
    default = SessionTable()
    assert parameters["capacity"].default == default.capacity
    assert parameters["ttl_s"].default == default.ttl_s


def _swallow() -> object:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        if request.method != "POST":
            return web.json_response({}, status=200 if request.path == "/health" else 404)
        async for _ in request.content.iter_chunked(1 << 20):  # past the stub app's 1 MiB read limit
            pass
        return web.json_response(
            {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
        )

    return handler


@pytest.mark.slow
# aiohttp's client warns on any body over 1 MiB sent as bytes (a ResourceWarning, ignored outside
# tests); the proxy forwards bodies as the bytes it received, which the transport buffers.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
def test_thousands_of_distinct_multi_mib_hints_leave_rss_flat(caplog: pytest.LogCaptureFixture) -> None:
    with Stub(_swallow()) as stub:  # type: ignore[arg-type]
        p = hostile_proxy([stub.url], max_body_bytes=4 << 20)
        try:
            assert p.port is not None
            port = p.port

            def send(i: int) -> int:
                hint = (f"{i:08d}" * (HINT_BYTES // 8))[:HINT_BYTES]
                body = json.dumps({"prompt": "hi", "max_tokens": 1, "user": hint}).encode()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    return resp.status
                finally:
                    conn.close()

            warm = [send(i) for i in range(16)]  # buffers and pools at their working size
            assert warm == [200] * 16
            before = rss_bytes()
            with ThreadPoolExecutor(4) as pool:
                statuses = list(pool.map(send, range(16, 16 + HINTS)))
            assert statuses == [200] * HINTS
            growth = rss_bytes() - before
            assert p.proxy is not None and len(p.proxy.sessions) == 16 + HINTS
            print(f"RSS growth over {HINTS} distinct {HINT_BYTES >> 20} MiB hints: {growth / 2**20:.1f} MiB")
            assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth / 2**20:.0f} MiB"
            assert_healthy(p, caplog)
        finally:
            p.stop()
