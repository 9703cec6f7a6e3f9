"""Retries and ejection a request cannot weaponize (issue 21 item 2): an instance is charged only
for its own failures (no answer, a timeout, 502–504) — another 5xx only once another instance
served the same request; a request two instances failed the same way is answered, not retried
fleet-wide; re-admission clears the index only of an instance that was out of reach. Plus the two
triggers found: a gzip body and 100k-deep nesting in an unknown field. Loopback, bounded."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from aiohttp import web
from hostile_util import assert_healthy, error_of, hostile_proxy, wait_for
from proxy_util import Stub, colocated_router, free_port, metric, request

from smetric.fake_engine import FakeEngine
from smetric.serve.proxy import ProxyServer

COMPLETIONS = "/v1/completions"


def engine_stub(fail: Callable[[bytes], int | None], posts: list[str], name: str) -> Any:
    """An engine double: ``fail(body)`` gives a 5xx status to answer with, or None for a 200."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.method != "POST":
            return web.json_response({}, status=200 if request.path == "/health" else 404)
        body = await request.read()
        posts.append(name)
        status = fail(body)
        if status is not None:
            return web.json_response(
                {"error": {"message": "engine failed", "type": "InternalServerError"}}, status=status
            )
        return web.json_response(
            {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
        )

    return handler


def ejections(p: ProxyServer) -> int:
    assert p.proxy is not None
    return sum(p.proxy.telemetry.ejections.values())


def poison(body: bytes) -> int | None:
    return 500 if b"poison" in body else None


def test_a_request_every_engine_fails_is_answered_after_two_and_ejects_nobody(
    caplog: pytest.LogCaptureFixture,
) -> None:
    posts: list[str] = []
    with ExitStack() as stack:
        stubs = [stack.enter_context(Stub(engine_stub(poison, posts, f"e{i}"))) for i in range(3)]
        p = hostile_proxy([s.url for s in stubs], eject_after=2, policy="round_robin")
        stack.callback(p.stop)
        for i in range(6):
            posts.clear()
            status, _, body = request(p.url, COMPLETIONS, {"prompt": f"poison {i}", "max_tokens": 1})
            assert status == 500, body
            err = error_of(status, body)
            assert "not retried" in err["message"]
            assert len(posts) == 2, "answered after the same failure on two instances, not retried fleet-wide"
        assert ejections(p) == 0, "a request's own failure ejects no instance"
        for i in range(3):
            assert request(p.url, COMPLETIONS, {"prompt": f"fine {i}", "max_tokens": 1})[0] == 200
        assert_healthy(p, caplog)


def test_a_500_of_one_instance_is_charged_once_another_serves_the_request(caplog: pytest.LogCaptureFixture) -> None:
    posts: list[str] = []
    with Stub(engine_stub(lambda _: 500, posts, "bad")) as bad, Stub(engine_stub(lambda _: None, posts, "ok")) as ok:
        p = hostile_proxy([bad.url, ok.url], eject_after=2, policy="round_robin")
        try:
            for i in range(6):
                assert request(p.url, COMPLETIONS, {"prompt": f"q{i}", "max_tokens": 1})[0] == 200
            # The app's view of an ejection the gateway made lags it by one drain of its records.
            wait_for(lambda: p.proxy is not None and p.proxy.fleet.ejected(bad.url), what="its 500s charged: ejected")
            assert ejections(p) == 1
            assert_healthy(p, caplog)
        finally:
            p.stop()


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateway_status_is_the_instances_own_failure_charged_at_once(
    caplog: pytest.LogCaptureFixture, status: int
) -> None:
    posts: list[str] = []
    with (
        Stub(engine_stub(lambda _: status, posts, "bad")) as bad,
        Stub(engine_stub(lambda _: None, posts, "ok")) as ok,
    ):
        p = hostile_proxy([bad.url, ok.url], eject_after=2, policy="round_robin")
        try:
            for i in range(4):
                assert request(p.url, COMPLETIONS, {"prompt": f"q{i}", "max_tokens": 1})[0] == 200
            page = request(p.url, "/metrics", method="GET")[2].decode()
            assert metric(page, "smetric_proxy_instance_ejected", instance=bad.url) == 1
            assert_healthy(p, caplog)
        finally:
            p.stop()


def _index_blocks(p: ProxyServer, url: str) -> int:
    return int(colocated_router(p).stats()["index_local_blocks"].get(url, 0))


def test_readmission_keeps_the_index_of_an_instance_that_kept_answering(caplog: pytest.LogCaptureFixture) -> None:
    """Ejected on 503s while reachable (its cache intact): re-admitted with its index."""
    state = {"status": None}
    posts: list[str] = []
    with (
        Stub(engine_stub(lambda _: state["status"], posts, "a")) as a,
        Stub(engine_stub(lambda _: None, posts, "b")) as b,
    ):
        p = hostile_proxy([a.url, b.url], eject_after=2, policy="round_robin")
        try:
            prompt = "the shared system prompt of a long agent session " * 20
            for i in range(4):
                assert request(p.url, COMPLETIONS, {"prompt": prompt + str(i), "max_tokens": 1})[0] == 200
            before = _index_blocks(p, a.url)
            assert before > 0
            state["status"] = 503
            for i in range(4):
                assert request(p.url, COMPLETIONS, {"prompt": f"q{i}", "max_tokens": 1})[0] == 200
            wait_for(lambda: p.proxy is not None and p.proxy.fleet.ejected(a.url), what="the ejection")
            state["status"] = None
            wait_for(lambda: p.proxy is not None and not p.proxy.fleet.ejected(a.url), what="re-admission")
            assert _index_blocks(p, a.url) >= before, "the index of an instance that never lost its cache is kept"
            assert_healthy(p, caplog)
        finally:
            p.stop()


def test_readmission_clears_the_index_of_an_instance_that_was_out_of_reach(caplog: pytest.LogCaptureFixture) -> None:
    posts: list[str] = []
    port = free_port()
    with Stub(engine_stub(lambda _: None, posts, "b")) as b:
        a = Stub(engine_stub(lambda _: None, posts, "a"), port=port).start()
        p = hostile_proxy([a.url, b.url], eject_after=2, policy="round_robin")
        try:
            prompt = "the shared system prompt of a long agent session " * 20
            for i in range(4):
                assert request(p.url, COMPLETIONS, {"prompt": prompt + str(i), "max_tokens": 1})[0] == 200
            assert _index_blocks(p, a.url) > 0
            a.stop()  # the engine goes away (it restarts empty)
            for i in range(4):
                assert request(p.url, COMPLETIONS, {"prompt": f"q{i}", "max_tokens": 1})[0] == 200
            wait_for(lambda: p.proxy is not None and p.proxy.fleet.ejected(a.url), what="the ejection")
            a = Stub(engine_stub(lambda _: None, posts, "a"), port=port).start()
            wait_for(lambda: p.proxy is not None and not p.proxy.fleet.ejected(a.url), what="re-admission")
            assert _index_blocks(p, a.url) == 0, "an instance that was out of reach may have restarted empty"
            assert_healthy(p, caplog)
        finally:
            p.stop()
            a.stop()


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    started = [FakeEngine(port=0, speedup=1000).start() for _ in range(3)]
    yield started
    for e in started:
        e.stop()


def test_the_two_triggers_found_eject_nothing(engines: list[FakeEngine], caplog: pytest.LogCaptureFixture) -> None:
    """A gzip body (inflated by the proxy and forwarded still labelled gzip: each engine 500'd) and
    100k-deep nesting in a field the proxy does not read (the engine's parser gives up): three of
    either ejected the whole fleet."""
    p = hostile_proxy([e.url for e in engines], policy="round_robin")
    try:
        plain = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()
        deep = b'{"prompt": "hello", "max_tokens": 1, "unknown": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        for _ in range(4):
            status, _, body = request(
                p.url, COMPLETIONS, raw=gzip.compress(plain), headers={"Content-Encoding": "gzip"}
            )
            assert status == 415, body[:200]
            status, _, body = request(p.url, COMPLETIONS, raw=deep)
            assert status == 400, (status, body[:200])  # refused before any engine sees it
            assert "deeper than" in error_of(status, body)["message"]
        assert ejections(p) == 0
        assert request(p.url, COMPLETIONS, raw=plain)[0] == 200
        assert_healthy(p, caplog)
    finally:
        p.stop()
