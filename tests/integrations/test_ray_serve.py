"""Ray Serve: ``SMetricRequestRouter`` on a local Ray cluster (4 logical CPUs, no dashboard).

* The documented example (``examples/ray_serve_agents.py``) replays the Weka agent sessions
  over 4 replicas with smetric's router and with Ray Serve's default one; from what the replicas
  recorded: first turns spread (the busiest replica takes at most 1.5× its fair share, every
  replica takes some) and follow-ups that extend their previous turn stay where it was (≥ 90%),
  far above the default router on the same replay.
* With ``index_mode="exact"`` the replicas are fake vLLM engines that publish KV events, found by
  the router through ``record_routing_stats``; chat sessions (approximate tokens from the
  messages, which are the fake engine's own token ids) stick because the events fill the index
  (60/60 follow-ups; 12/60 when the replicas report no event sources, which fails the bound).
* Two routers (two handles) subscribed to the same engines hold the same index (no Ray needed).

Bounded: 622 + 72 requests through Ray, 24 straight to the engines; everything on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("zmq", reason="the KV-event tests need the events extra (pyzmq)")
pytest.importorskip("aiohttp", reason="the KV-event tests need the fake-engine extra (aiohttp)")

from smetric import Router, RouterConfig
from smetric.events import KvEventSubscriber, discover_sources
from smetric.fake_engine import FakeEngine
from smetric.integrations._prompt import approximate_tokens

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fake-model"
SYSTEM = "You are a careful coding agent. Read the repository's rules before you change a file. " * 6


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("ray_serve_agents", ROOT / "examples" / "ray_serve_agents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def chat(base: str, messages: list[dict[str, str]], max_tokens: int = 8) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def session_messages(session: int, turn: int) -> list[dict[str, str]]:
    """Turn ``turn`` (1-based) of a synthetic agent session: the history plus one tool result."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {session}: fix bug {session}."},
    ]
    for t in range(1, turn):
        messages.append({"role": "assistant", "content": f"Calling tool {t} of session {session}."})
        messages.append({"role": "tool", "content": f"Result {t} of session {session}: " + "ok " * (40 + 7 * t)})
    return messages


# -- two handles, one view -----------------------------------------------------------------------


def test_two_routers_on_the_same_events_hold_the_same_index() -> None:
    with (
        FakeEngine(speedup=1000.0, kv_events_port=0, kv_replay_port=0) as a,
        FakeEngine(speedup=1000.0, kv_events_port=0, kv_replay_port=0) as b,
    ):
        engines = {a.url: a, b.url: b}
        routers = [Router(list(engines), config=RouterConfig(index_mode="exact")) for _ in range(2)]
        subscribers = [
            KvEventSubscriber(r, [s for url in engines for s in discover_sources(url)]).start() for r in routers
        ]
        lags: list[float] = []
        try:
            # Both SUB sockets join each engine before the first event (a late joiner would replay).
            deadline = time.monotonic() + 10
            while any(e.call(lambda e=e: e.stack.publisher.subscriptions) < 2 for e in (a, b)):
                assert time.monotonic() < deadline, "the subscribers did not join within 10 s"
                time.sleep(0.01)
            prompts = []
            for s in range(6):
                url = list(engines)[s % 2]
                for turn in range(1, 5):
                    messages = session_messages(s, turn)
                    tokens = approximate_tokens(messages)
                    chat(url, messages)
                    prompts.append((url, tokens))
                    done = time.monotonic()
                    full = (len(tokens) - 1) // 16 * 16
                    # How stale: from the response to both indexes holding the prompt's blocks.
                    while any(r.query(tokens).local[url] < full for r in routers):
                        assert time.monotonic() - done < 2.0, "an event did not reach the index within 2 s"
                        time.sleep(0.001)
                    lags.append(time.monotonic() - done)
            views = [[(url, r.query(tokens).local) for url, tokens in prompts] for r in routers]
        finally:
            for sub in subscribers:
                sub.stop()
    assert views[0] == views[1]
    assert all(local[url] > 0 for url, local in views[0])
    print(f"index lag after the response: max {max(lags) * 1e3:.1f} ms over {len(lags)} requests")


# -- choose_replicas without a cluster ----------------------------------------------------------


class StatsReplica:
    """What ``choose_replicas`` reads of a ``RunningReplica``: its id and its routing stats."""

    def __init__(self, replica_id: Any, routing_stats: dict[str, Any]) -> None:
        self.replica_id = replica_id
        self.routing_stats = routing_stats
        self.multiplexed_model_ids: set[str] = set()
        self.node_id = self.availability_zone = ""

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def test_an_out_of_range_kv_usage_does_not_fail_choose_replicas() -> None:
    pytest.importorskip("ray.serve.request_router", reason="needs ray[serve] >= 2.60 (ray.serve.request_router)")
    import asyncio

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest, ReplicaID

    from smetric.integrations.ray_serve import SMetricRequestRouter

    deployment = DeploymentID(name="engines", app_name="app")
    # vLLM can report a usage a hair above 1 (or a broken exporter anything): 1.7 and -0.2 here.
    stats = [
        {"num_requests_running": 2, "num_requests_waiting": -1, "kv_cache_usage_perc": 1.7},
        {"num_requests_running": 1, "num_requests_waiting": 0, "kv_cache_usage_perc": -0.2},
    ]
    replicas = [StatsReplica(ReplicaID(f"r{i}", deployment), s) for i, s in enumerate(stats)]

    async def main() -> tuple[SMetricRequestRouter, list[list[Any]]]:
        rr = SMetricRequestRouter(deployment, DeploymentHandleSource.UNKNOWN)
        rr.initialize_state()
        rr.update_replicas(replicas)  # type: ignore[arg-type]
        body = {"messages": session_messages(0, 1)}
        pending = PendingRequest(args=[body], kwargs={}, metadata=RequestMetadata("req", "internal-req"))
        ranks = await rr.choose_replicas(replicas, pending)  # type: ignore[arg-type]
        return rr, ranks

    rr, ranks = asyncio.run(main())
    assert rr.router is not None and rr.unrouted == 0
    assert len(ranks) == 2 and len(ranks[0]) == 1  # routed by smetric: [[chosen], [the other]]
    loads = [rr.router.load(f"r{i}") for i in range(2)]
    assert [load["kv_usage"] for load in loads] == [1.0, 0.0]
    assert [load["engine_waiting"] for load in loads] == [0, 0]


# -- on a local Ray cluster ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'smetric-router[ray]'")
    pytest.importorskip("ray.serve.request_router", reason="needs ray[serve] >= 2.60 (ray.serve.request_router)")
    from ray import cloudpickle, serve

    # The replicas' classes live in this file and in the example, which Ray's workers cannot
    # import: ship them by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False)
    try:
        yield serve
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow  # ≈35 s with the cluster's start
@pytest.mark.timeout(180)
def test_replayed_agent_trace_spreads_first_turns_and_keeps_follow_ups(ray_cluster: Any) -> None:
    example = load_example()
    # The module's first deployment also pays Ray's cold start (worker processes spawned, their
    # imports), which is not the router's to measure: a short replay on replicas deleted after it
    # warms the cluster first, and its report is not read. (Without it this test failed in four
    # fresh-clone CI runs in a row, 2026-12-02, and passed in every rerun on a warm machine.)
    example.run("smetric", replicas=4, max_turns=1, max_sessions=4)
    smetric = example.run("smetric", replicas=4, max_turns=12)
    baseline = example.run("ray", replicas=4, max_turns=12)
    for report in (smetric, baseline):
        print(json.dumps(report.to_dict()))
    assert smetric.requests == baseline.requests == 311 and smetric.sessions == 27
    first = smetric.first_turns_per_replica
    assert len(first) == 4 and min(first.values()) >= 1, first
    assert smetric.max_first_turn_share <= 1.5 / 4, first
    assert smetric.stickiness >= 0.9, (smetric.extending_sticky, smetric.extending)
    assert smetric.stickiness >= baseline.stickiness + 0.3
    assert smetric.hit_ratio > baseline.hit_ratio


@pytest.mark.slow  # ≈11 s
@pytest.mark.timeout(180)
def test_exact_mode_follows_the_replicas_kv_events(ray_cluster: Any) -> None:
    serve = ray_cluster
    import asyncio
    import gc

    from ray.serve.config import RequestRouterConfig

    from smetric.integrations.ray_serve import SMetricRequestRouter

    @serve.deployment(
        num_replicas=4,
        max_ongoing_requests=32,
        ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(
            request_router_class=SMetricRequestRouter,
            request_router_kwargs={"index_mode": "exact"},
            request_routing_stats_period_s=0.5,
        ),
    )
    class EngineReplica:
        def __init__(self) -> None:
            self.name = serve.get_replica_context().replica_id.unique_id
            self.engine = FakeEngine(speedup=200.0, kv_events_port=0, kv_replay_port=0).start()

        def record_routing_stats(self) -> dict[str, Any]:
            from smetric.integrations.ray_serve import kv_event_sources_stats

            return kv_event_sources_stats(self.engine.url)

        async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
            if body.get("probe"):  # routed like a request, never sent to the engine
                return {"replica": self.name}
            doc = await asyncio.to_thread(chat, self.engine.url, body["messages"])
            usage = doc["usage"]
            return {"replica": self.name, "cached": usage["prompt_tokens_details"]["cached_tokens"], **body["tag"]}

    handle = serve.run(EngineReplica.bind(), name="engines", route_prefix=None)

    def subscribed() -> int:
        # The handle's request router lives in this process; it subscribes to a replica's KV
        # events when it routes a request after that replica's routing stats reached the handle.
        routers = [o for o in gc.get_objects() if isinstance(o, SMetricRequestRouter)]
        return max((len(r.subscribed_replicas) for r in routers), default=0)

    # Probe requests (a throwaway session each, never sent to an engine) until the router has
    # every replica's KV events: the stats arrive every 0.5 s, so this is a few probes.
    deadline = time.monotonic() + 60
    probe = 0
    while subscribed() < 4:
        assert time.monotonic() < deadline, "the replicas' KV-event sources did not reach the handle in 60 s"
        probe += 1
        messages = [{"role": "user", "content": f"probe {probe}"}]
        handle.remote({"messages": messages, "tag": {}, "probe": True}).result(timeout_s=30)

    async def replay() -> list[dict[str, Any]]:
        async def one(s: int) -> list[dict[str, Any]]:
            return [
                await handle.remote({"messages": session_messages(s, t), "tag": {"session": s, "turn": t}})
                for t in range(1, 7)
            ]

        return [r for rs in await asyncio.gather(*(one(s) for s in range(12))) for r in rs]

    try:
        served = asyncio.run(replay())
    finally:
        serve.delete("engines")
    where = {(r["session"], r["turn"]): r["replica"] for r in served}
    first = {where[(s, 1)] for s in range(12)}
    sticky = sum(where[(s, t)] == where[(s, t - 1)] for s in range(12) for t in range(2, 7))
    cached = sum(r["cached"] for r in served if r["turn"] > 1)
    print(f"exact mode: {len(first)} replicas took first turns, {sticky}/60 follow-ups sticky, {cached} cached tokens")
    assert len(served) == 72 and len(first) >= 3
    assert sticky >= 54
    assert cached > 0
