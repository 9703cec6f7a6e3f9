"""Admission control through the proxy (the gateway's door; its slot and queue arithmetic on its
own is tested in ``rust/smetric-gateway/src/admission.rs``) against a stub upstream that holds its
answers until the test releases them, and :func:`smetric.serve.admission.skip_full`. Bounded: a
handful of requests, waits on conditions with deadlines."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from proxy_util import Stub, metric, request

from smetric.serve.admission import skip_full
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

DEADLINE_S = 10.0


class HeldUpstream:
    """A stub engine whose chat answers wait until :meth:`release`."""

    def __init__(self) -> None:
        self.arrived = 0
        self._gate = threading.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.path != "/v1/chat/completions":
            return web.Response(status=404)
        await request.read()
        self.arrived += 1
        await asyncio.get_running_loop().run_in_executor(None, self._gate.wait, DEADLINE_S)
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        message = {"role": "assistant", "content": "ok"}
        body = {"id": "x", "object": "chat.completion", "model": "m", "usage": usage}
        body["choices"] = [{"index": 0, "message": message, "finish_reason": "stop"}]
        return web.json_response(body)

    def release(self) -> None:
        self._gate.set()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_a_full_proxy_answers_429_with_retry_after_in_the_apis_shape_and_serves_the_admitted() -> None:
    held = HeldUpstream()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with Stub(held.handle) as stub:
        config = load_config(
            instances=[stub.url],
            port=0,
            engine_load=False,
            max_in_flight_per_instance=1,
            queue_size=1,
            queue_timeout_s=DEADLINE_S,
            retry_after_s=2,
        )
        with ProxyServer(config) as p, ThreadPoolExecutor(2) as pool:
            assert p.proxy is not None
            admission = p.proxy.admitting
            assert admission is not None
            first = pool.submit(request, p.url, "/v1/chat/completions", body)
            wait_for(lambda: held.arrived == 1, "the first request at the engine")
            second = pool.submit(request, p.url, "/v1/chat/completions", body)
            wait_for(lambda: admission.queued == 1, "the second request in the queue")
            status, headers, raw = request(p.url, "/v1/chat/completions", body)
            assert status == 429 and headers["retry-after"] == "2"
            error = json.loads(raw)["error"]
            assert error["type"] == "RateLimitError" and error["code"] == 429 and "capacity" in error["message"]
            text = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(text, "smetric_proxy_admission_queue_depth") == 1
            assert metric(text, "smetric_proxy_admission_in_flight") == 1
            held.release()
            assert first.result(DEADLINE_S)[0] == 200 and second.result(DEADLINE_S)[0] == 200
            wait_for(lambda: admission.admitted == 0, "every slot back")
            text = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(text, "smetric_proxy_admission_rejections_total", reason="queue_full") == 1
            assert metric(text, "smetric_proxy_admission_wait_seconds_count") == 2
            assert metric(text, "smetric_proxy_responses_total", code="429") == 1


def test_a_full_instance_is_skipped_while_its_pool_has_room_and_never_the_last() -> None:
    load = {"a": 2, "b": 1, "c": 2}
    assert sorted(skip_full([], load, 2, None)) == ["a", "c"]
    assert skip_full(["b"], load, 2, None) == ["b"], "every candidate full: none is skipped"
    assert skip_full([], load, 3, None) == []
    pools = [frozenset({"a", "b"}), frozenset({"c", "d"})]
    assert skip_full([], {**load, "d": 5}, 2, pools) == ["a"], "the second pool is full throughout"
