"""Admission control (:mod:`smetric.serve.admission`): the slot and queue arithmetic on its own
(asyncio, no HTTP), then through the proxy against a stub upstream that holds its answers until
the test releases them. Bounded: a handful of requests, waits on conditions with deadlines."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from proxy_util import Stub, metric, request

from smetric.serve.admission import Admission, skip_full
from smetric.serve.config import load_config
from smetric.serve.proxy import ProxyServer

DEADLINE_S = 10.0


def admission(live: int = 1, **overrides: Any) -> Admission:
    settings: dict[str, Any] = {
        "max_in_flight": 100,
        "max_in_flight_per_instance": 2,
        "queue_size": 2,
        "queue_timeout_s": 5.0,
        "retry_after_s": 3,
    }
    settings.update(overrides)
    return Admission(**settings, live_instances=lambda: live)


def test_capacity_is_the_smaller_of_the_fleet_cap_and_the_live_instances_slots() -> None:
    assert admission(live=3).capacity == 6
    assert admission(live=3, max_in_flight=4).capacity == 4
    assert admission(live=0).capacity == 2, "a fleet with every instance ejected still admits one instance's worth"


def test_slots_then_a_fifo_queue_then_429_and_slots_handed_to_the_oldest_waiter() -> None:
    async def main() -> None:
        a = admission()
        assert await a.enter() is None and await a.enter() is None
        first = asyncio.create_task(a.enter())
        second = asyncio.create_task(a.enter())
        await asyncio.sleep(0)  # both reach the queue
        assert a.queued == 2
        refused = await a.enter()
        assert refused is not None and refused.error.status == 429 and refused.reason == "queue_full"
        assert refused.retry_after_s == 3
        a.leave()
        assert await asyncio.wait_for(first, DEADLINE_S) is None, "the oldest waiter gets the freed slot"
        assert not second.done() and a.admitted == 2 and a.queued == 1
        a.leave()
        assert await asyncio.wait_for(second, DEADLINE_S) is None
        a.leave(), a.leave()
        assert a.admitted == 0 and a.queued == 0
        assert a.rejections["queue_full"] == 1 and a.wait_s.count == 4

    asyncio.run(main())


def test_a_wait_past_the_timeout_is_a_503_and_leaves_the_queue() -> None:
    async def main() -> None:
        a = admission(max_in_flight=1, queue_timeout_s=0.05)
        assert await a.enter() is None
        refused = await a.enter()
        assert refused is not None and refused.error.status == 503 and refused.reason == "queue_timeout"
        assert a.queued == 0 and a.admitted == 1
        a.leave()
        assert a.admitted == 0

    asyncio.run(main())


def test_a_waiter_cancelled_after_its_grant_gives_the_slot_on() -> None:
    async def main() -> None:
        a = admission(max_in_flight=1)
        assert await a.enter() is None
        waiter = asyncio.create_task(a.enter())
        later = asyncio.create_task(a.enter())
        await asyncio.sleep(0)
        a.leave()  # grants `waiter` ...
        waiter.cancel()  # ... whose client leaves before it runs again
        assert await asyncio.wait_for(later, DEADLINE_S) is None, "the slot went on to the next waiter"
        assert a.admitted == 1
        a.leave()
        assert a.admitted == 0

    asyncio.run(main())


def test_closing_refuses_the_queued_with_503_and_keeps_the_admitted() -> None:
    async def main() -> None:
        a = admission(max_in_flight=1)
        assert await a.enter() is None
        waiter = asyncio.create_task(a.enter())
        await asyncio.sleep(0)
        a.close()
        refused = await asyncio.wait_for(waiter, DEADLINE_S)
        assert refused is not None and refused.error.status == 503 and refused.reason == "draining"
        assert a.admitted == 1, "the admitted request keeps its slot through the drain"
        late = await a.enter()
        assert late is not None and late.reason == "draining"

    asyncio.run(main())


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
