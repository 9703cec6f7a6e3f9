"""A KV-event publisher in connect mode has room for one subscriber: the second router must say so.

vLLM's ``ZmqEventPublisher`` binds only endpoints with ``*``/``::`` or ``ipc://``; any other
(``tcp://127.0.0.1:5557``) makes the engine *connect*, so the router binds that address, and a
second router replica on the same host cannot. These tests check that the second one gets a typed
error (:class:`smetric.errors.KvEventEndpointInUseError`) whose message says how to configure the
engine, and that ``smetric serve`` turns it into one log line and keeps serving that instance
without its events, instead of crashing with a traceback. A stub engine answers
``/kv_event_sources`` (what vLLM answers for such a config); no vLLM is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("aiohttp")

from smetric import Router
from smetric.errors import KvEventEndpointInUseError, SmetricError
from smetric.events import KvEventSource, KvEventSubscriber

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
from fleet import free_port  # noqa: E402  (the one loopback port picker)


def test_second_subscriber_on_a_connect_mode_endpoint_gets_a_typed_error() -> None:
    port = free_port()
    source = KvEventSource("http://e0:8000", f"tcp://127.0.0.1:{port}", bind=True)
    router = Router(["http://e0:8000"])
    with KvEventSubscriber(router, [source]), pytest.raises(KvEventEndpointInUseError) as caught:
        KvEventSubscriber(router, [source]).start()
    err = caught.value
    assert isinstance(err, SmetricError)
    assert err.instance == "http://e0:8000" and err.endpoint == source.endpoint
    assert f"tcp://*:{port}" in str(err) and "\n" not in str(err)


@pytest.fixture
def connect_mode_engine() -> Iterator[tuple[str, int]]:
    """A stub engine whose /kv_event_sources names a host, as vLLM does for a connect-mode publisher."""
    pub_port = free_port()
    sources = {"0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub_port}"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, status = {
                "/kv_event_sources": (json.dumps(sources).encode(), 200),
                "/health": (b"", 200),
                "/v1/models": (json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode(), 200),
            }.get(self.path, (b"not found", 404))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pub_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _serve(engine_url: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    argv = [sys.executable, "-m", "smetric", "serve", "--port", str(port), "--instance", engine_url]
    argv += ["--block-size", "32", "--no-engine-load"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.05)
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise AssertionError(f"smetric serve did not come up (exit {proc.returncode}):\n{err}")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err


def test_second_serve_replica_runs_that_source_without_events_and_says_so(connect_mode_engine: tuple[str, int]) -> None:
    url, pub_port = connect_mode_engine
    first, _ = _serve(url)
    try:
        second, _ = _serve(url)
        err_second = _stop(second)
    finally:
        err_first = _stop(first)
    assert second.returncode == 0 and first.returncode == 0
    for err in (err_first, err_second):
        assert "Traceback" not in err and "Unclosed" not in err, err
    said = [line for line in err_second.splitlines() if "cannot bind" in line]
    assert len(said) == 1, err_second
    assert f"tcp://*:{pub_port}" in said[0] and f"Serving {url} without its KV events" in said[0]
    assert "cannot bind" not in err_first
