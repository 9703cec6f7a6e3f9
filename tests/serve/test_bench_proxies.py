"""The framework-free bench proxy (``benches/protocol_proxy.py``) still relays what the proxy
benches send: a measuring instrument that broke would measure nothing. Each mode in front of two
fake engines: a chat request whole and streamed, and (the minimal mode) a completions request
whose token ids it routes. Bounded: loopback, a few requests, every process stopped."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_util import free_port, request

from smetric.fake_engine import FakeEngine

SCRIPT = Path(__file__).resolve().parents[2] / "benches" / "protocol_proxy.py"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


@pytest.fixture(params=[False, True], ids=["minimal", "adapters"])
def bench_proxy(request: pytest.FixtureRequest, fleet: list[FakeEngine]) -> Iterator[tuple[str, bool]]:
    port = free_port()
    cmd = [sys.executable, str(SCRIPT), *(["--adapters"] if request.param else []), str(port), *(e.url for e in fleet)]
    proc = subprocess.Popen(cmd, cwd=SCRIPT.parent, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline, "the bench proxy did not come up"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", request.param
    finally:
        proc.kill()
        proc.communicate(timeout=10)  # reaps it and closes its pipe


def test_the_bench_proxy_relays_whole_and_streamed_answers(bench_proxy: tuple[str, bool]) -> None:
    url, adapters = bench_proxy
    status, headers, body = request(url, "/v1/chat/completions", CHAT)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]
    assert ("x-smetric-decision" in headers) is adapters
    status, headers, body = request(url, "/v1/chat/completions", {**CHAT, "stream": True})
    events = [e for e in body.split(b"\n\n") if e]
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert events[-1] == b"data: [DONE]" and len(events) > 2
    if not adapters:  # token ids: routed by the core
        status, _, body = request(url, "/v1/completions", {"model": "fake-model", "prompt": [1, 2, 3], "max_tokens": 2})
        assert status == 200 and json.loads(body)["choices"][0]["text"] is not None
