"""vLLM production-stack: ``SMetricRouting`` and its registration as a ``RoutingInterface``.

The real-package tests need production-stack's own ``vllm_router`` (with ``vllm_router.routers``).
It is not on PyPI: the name ``vllm-router`` there is a different project (the Rust router of
vllm-project/router, releases 0.1.9–0.1.17, which has no ``vllm_router.routers``), and
production-stack ships its router as a container image and from its repository only. So on a
machine that reaches only package registries (this one, CI) they skip, with that reason; they
run wherever production-stack is installed from its repository (``pip install -e .`` of a clone).

The decision itself (:class:`SMetricRouting`) needs none of production-stack's types: it reads
``EngineStats`` fields by name, so its tests below hand it this file's own small ``Load`` record
and plain dicts for bodies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import time
from dataclasses import dataclass
from typing import Any

import pytest

from smetric.integrations.production_stack import ROUTING_LOGIC, SMetricRouting, register

URLS = ["http://gpu-0:8000", "http://gpu-1:8000", "http://gpu-2:8000", "http://gpu-3:8000"]
CAPACITY = 65_536
"""The endpoints' KV capacity, declared: these hosts are names only, so nothing reads their /metrics."""
SYSTEM = "You are a careful coding agent. Read the repository's rules before you change a file. " * 6


@dataclass
class Load:
    """The three fields of an ``EngineStats`` the router reads (not production-stack's class)."""

    num_running_requests: int = 0
    num_queuing_requests: int = 0
    gpu_cache_usage_perc: float = 0.0


def routing_(**kwargs: Any) -> SMetricRouting:
    return SMetricRouting(kv_capacity_tokens=CAPACITY, **kwargs)


def turn_body(session: int, turn: int) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {session}: fix bug {session}."},
    ]
    for t in range(1, turn):
        messages.append({"role": "assistant", "content": f"Calling tool {t} of session {session}."})
        messages.append({"role": "tool", "content": f"Result {t} of session {session}: " + "ok " * (40 + 7 * t)})
    return {"model": "m", "messages": messages}


def replay(routing: SMetricRouting, sessions: int, turns: int, urls: list[str]) -> dict[tuple[int, int], str]:
    """Routes ``sessions`` agent sessions in waves: every session's turn is in flight at once, then
    all complete (production-stack's lifecycle calls), then the next turn."""
    where = {}
    for turn in range(1, turns + 1):
        for s in range(sessions):
            url = routing.route(urls, {}, turn_body(s, turn))
            routing.on_new_request(url, f"req-{s}-{turn}")
            where[(s, turn)] = url
        for s in range(sessions):
            url, rid = where[(s, turn)], f"req-{s}-{turn}"
            routing.on_request_response(url, rid)
            routing.on_request_complete(url, rid)
    return where


def test_sessions_spread_then_stick() -> None:
    routing = routing_()
    where = replay(routing, sessions=8, turns=5, urls=URLS)
    first = [where[(s, 1)] for s in range(8)]
    # Every endpoint takes first turns, none more than 1.5x its share (the score weighs queued tokens:
    # the very first prompt pays the system prompt the later ones find in the global tier).
    assert all(1 <= first.count(u) <= 3 for u in URLS), first
    assert all(where[(s, t)] == where[(s, 1)] for s in range(8) for t in range(2, 6))
    assert routing.router is not None
    assert all(routing.router.load(u)["batch_size"] == 0 for u in URLS)  # every request finished
    assert routing.router.stats()["unknown_request_events"] == 0


def test_engine_stats_steer_first_turns_away_from_a_busy_engine() -> None:
    routing = routing_()
    busy = {URLS[0]: Load(num_running_requests=40, num_queuing_requests=10, gpu_cache_usage_perc=0.9)}
    placed = [routing.route(URLS, busy, turn_body(s, 1)) for s in range(6)]
    assert URLS[0] not in placed
    assert routing.router is not None and routing.router.load(URLS[0])["engine_running"] == 40


def test_lifecycle_pairs_by_request_id_or_oldest_first() -> None:
    routing = routing_()
    url = routing.route(URLS, {}, turn_body(0, 1), request_id="client-id")
    other = routing.route([url], {}, turn_body(1, 1))  # a second request in flight to the same URL
    assert other == url
    assert routing.router is not None and routing.router.load(url)["batch_size"] == 2
    routing.on_new_request(url, "uuid-of-the-second")  # no header: paired with the oldest unpaired
    routing.on_new_request(url, "client-id")  # the header's id: paired with its own decision
    routing.on_request_complete(url, "client-id")
    assert routing.router.load(url)["batch_size"] == 1
    routing.on_request_complete(url, "uuid-of-the-second")
    assert routing.router.load(url)["batch_size"] == 0
    routing.on_request_complete(url, "never-routed")  # unknown: ignored
    assert routing.router.stats()["unknown_request_events"] == 0


def test_a_request_without_completion_expires() -> None:
    now = [0.0]
    routing = routing_(stale_after_s=60.0, clock=lambda: now[0])
    url = routing.route(URLS, {}, turn_body(0, 1))
    routing.on_new_request(url, "r")  # sent, then failed: production-stack reports no completion
    now[0] = 60.0  # not yet older than the bound
    routing.route(URLS, {}, turn_body(1, 1))
    assert routing.expired == 0
    now[0] = 60.5
    routing.route(URLS, {}, turn_body(2, 1))
    assert routing.expired == 1  # the failed one; the second is 0.5 s old
    assert routing.router is not None
    assert sum(routing.router.load(u)["batch_size"] for u in URLS) == 2  # the second and the third
    routing.on_request_complete(url, "r")  # a late completion of an expired decision: ignored
    assert routing.router.stats()["unknown_request_events"] == 0


def test_endpoints_come_and_go() -> None:
    routing = routing_()
    replay(routing, sessions=2, turns=2, urls=URLS[:2])
    where = replay(routing, sessions=4, turns=1, urls=URLS[1:])
    assert routing.router is not None and sorted(routing.router.instances) == sorted(URLS[1:])
    assert set(where.values()) <= set(URLS[1:])


def test_a_body_without_a_prompt_goes_to_the_least_busy_endpoint() -> None:
    routing = routing_()
    stats = {URLS[0]: Load(5, 5), URLS[1]: Load(1, 0), URLS[2]: Load(3, 0), URLS[3]: Load(2, 2)}
    assert routing.route(URLS, stats, {"model": "m"}) == URLS[1]
    assert routing.unrouted == 1


def installed() -> bool:
    """Whether production-stack's ``vllm_router`` is importable (PyPI's has no ``routers``)."""
    return (
        importlib.util.find_spec("vllm_router") is not None
        and importlib.util.find_spec("vllm_router.routers") is not None
    )


def test_register_names_the_missing_package() -> None:
    if installed():
        pytest.skip("production-stack's vllm_router is installed: the real-package tests cover register()")
    with pytest.raises(ImportError, match="not on PyPI") as e:
        register()
    assert e.value.name is not None and e.value.name.startswith("vllm_router")


# -- against production-stack's own types --------------------------------------------------------


def production_stack() -> Any:
    reason = (
        "production-stack's vllm_router (vllm_router.routers) is not installed: it is not on PyPI "
        "(PyPI's vllm-router is vllm-project/router's Rust router); install it from a clone of "
        "vllm-project/production-stack to run this test"
    )
    if not installed():
        pytest.skip(reason)
    from vllm_router.routers import routing_logic

    return routing_logic


def test_registered_router_routes_with_production_stacks_types() -> None:
    rl = production_stack()
    from starlette.requests import Request
    from vllm_router.service_discovery import EndpointInfo
    from vllm_router.stats.engine_stats import EngineStats

    cls = register()
    assert register() is cls
    router = rl.initialize_routing_logic(ROUTING_LOGIC, session_key="x-session-id")
    assert isinstance(router, cls) and isinstance(router, rl.SessionRouter) and rl.get_routing_logic() is router

    def endpoint(i: int, url: str) -> Any:
        # EndpointInfo's fields changed across production-stack versions (model_name -> model_names,
        # Id, sleep, ...): fill those this version has; a new required field fails the test.
        values = {"url": url, "model_names": ["m"], "model_name": "m", "Id": str(i), "added_timestamp": time.time()}
        values |= {"model_label": "default", "sleep": False}
        return EndpointInfo(**{f.name: values[f.name] for f in dataclasses.fields(EndpointInfo) if f.name in values})

    endpoints = [endpoint(i, u) for i, u in enumerate(URLS)]
    stats = {u: EngineStats(num_running_requests=0, num_queuing_requests=0) for u in URLS}

    def request() -> Any:
        return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []})

    async def run() -> dict[tuple[int, int], str]:
        where = {}
        for turn in (1, 2, 3):
            for s in range(4):
                where[(s, turn)] = await router.route_request(endpoints, stats, {}, request(), turn_body(s, turn))
        return where

    where = asyncio.run(run())
    assert sorted(where[(s, 1)] for s in range(4)) == sorted(URLS)
    assert all(where[(s, t)] == where[(s, 1)] for s in range(4) for t in (2, 3))
    rl.cleanup_routing_logic()
