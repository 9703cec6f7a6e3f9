"""``smetric.deployment``: the helper the proxy, Ray Serve and production-stack routers share.

* clamping: out-of-range engine values reach the router in range (the raw call raises: the
  negative control);
* expiry: decisions older than the bound are aborted on the router, in routing order, on an
  injected clock (no sleeps);
* membership: the router is built on the first membership, then follows it; a removed instance
  leaves the KV-event feed;
* sizing: declared or read from the engines' ``vllm:cache_config_info`` (a loopback HTTP server
  serving vLLM's page shape; a closed port and a page without the gauge are skipped); no global
  tier unless declared;
* feeds: one subscriber over every instance's sources, restarted on change; an engine in connect
  mode whose one slot is taken is logged once and served without its events.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from smetric import DEFAULT_BLOCK_SIZE, Router
from smetric.deployment import (
    DeployedRouter,
    EngineCache,
    FleetFeeds,
    InFlight,
    clamp_load,
    deployed_fields,
    fleet_caches,
    fleet_kv_capacity,
    smallest_kv_capacity,
)
from smetric.errors import InvalidArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "vllm_cpu"))
from fleet import free_port

PROMPT = list(range(1000, 1000 + 8 * DEFAULT_BLOCK_SIZE))


# -- clamping -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [
        ((3, 2, 0.5), (3, 2, 0.5)),
        ((-1, -5, -0.2), (0, 0, 0.0)),
        ((2.7, 1e12, 1.7), (2, 2**31 - 1, 1.0)),
        ((math.nan, None, math.nan), (None, None, None)),
        ((None, math.inf, math.inf), (None, 2**31 - 1, None)),
    ],
)
def test_clamp_load_puts_engine_values_in_the_cores_domain(
    raw: tuple[float | None, float | None, float | None], clamped: tuple[int | None, int | None, float | None]
) -> None:
    assert clamp_load(*raw) == clamped


def test_an_out_of_range_engine_value_reaches_the_router_clamped() -> None:
    deployed = DeployedRouter(kv_capacity_tokens=None)
    router = deployed.sync(["a", "b"])
    with pytest.raises(InvalidArgumentError):  # negative control: the core refuses it raw
        router.update_load("a", kv_usage=1.7)
    deployed.update_load("a", running=-3, waiting=4, kv_usage=1.7)
    deployed.update_load("b", running=math.nan, waiting=None, kv_usage=-0.5)
    a, b = router.load("a"), router.load("b")
    assert (a["engine_running"], a["engine_waiting"], a["kv_usage"]) == (0, 4, 1.0)
    assert b["kv_usage"] == 0.0


# -- expiry ---------------------------------------------------------------------------------------


def test_decisions_without_a_completion_expire_in_routing_order() -> None:
    now = [100.0]
    deployed = DeployedRouter(stale_after_s=10.0, kv_capacity_tokens=None, clock=lambda: now[0])
    router = deployed.sync(["a", "b"])
    for i in range(3):
        d = router.route(PROMPT[: (i + 2) * DEFAULT_BLOCK_SIZE], request_id=f"r{i}")
        deployed.routed(f"r{i}", d.instance)
        now[0] += 4.0  # r0 at 100, r1 at 104, r2 at 108
    assert deployed.finished("r1")
    assert not deployed.finished("r1")  # closed once
    now[0] = 110.0
    assert deployed.expire() == []  # r0 is exactly 10 s old: not older than the bound
    now[0] = 118.5
    assert deployed.expire() == ["r0", "r2"]
    assert deployed.expired == 2 and len(deployed.in_flight) == 0
    assert sum(router.load(i)["batch_size"] for i in ("a", "b")) == 0
    assert not deployed.aborted("r0")  # a late abort of an expired decision changes nothing
    assert router.stats()["unknown_request_events"] == 0


def test_in_flight_rejects_a_bound_that_expires_nothing_or_everything() -> None:
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="stale_after_s"):
            InFlight(bad)


# -- membership and sizing ------------------------------------------------------------------------


def test_the_router_follows_the_membership() -> None:
    deployed = DeployedRouter(kv_capacity_tokens=None)
    with pytest.raises(ValueError, match="no instance"):
        deployed.sync([])
    router = deployed.sync(["a", "b"])
    assert deployed.sync(["b", "c"]) is router
    assert sorted(router.instances) == ["b", "c"]
    deployed.remove("b")
    deployed.remove("never-there")
    assert router.instances == ["c"]


def test_sizing_declared_read_once_from_the_fleet_and_no_global_tier_by_default() -> None:
    asked: list[list[str]] = []

    def size(instances: Sequence[str]) -> int | None:
        asked.append(list(instances))
        return 1000 * DEFAULT_BLOCK_SIZE + 5

    deployed = DeployedRouter(size=size)
    deployed.sync(["a"])
    deployed.sync(["a", "b"])
    assert asked == [["a"]]  # once, when the router is built
    assert deployed.config.local_capacity_blocks == 1000 and deployed.config.global_capacity_blocks == 0
    declared = DeployedRouter(kv_capacity_tokens=64 * DEFAULT_BLOCK_SIZE, size=size)
    declared.sync(["a"])
    assert declared.config.local_capacity_blocks == 64 and len(asked) == 1
    # The caller's own fields win over the fleet's.
    assert deployed_fields({"global_capacity_blocks": 7}, block_size=16, kv_capacity_tokens=1600) == {
        "global_capacity_blocks": 7,
        "local_capacity_blocks": 100,
    }


def cache_config_page(num_gpu_blocks: int, block_size: int) -> bytes:
    return (
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{block_size}",engine="0",num_gpu_blocks="{num_gpu_blocks}"}} 1.0\n'
        "vllm:num_requests_running 0.0\n"
    ).encode()


pages: dict[str, bytes] = {}
"""What the metrics server serves, per path (reset by its fixture)."""
hits: list[str] = []
"""The paths the metrics server was asked for, in order."""


@pytest.fixture
def metrics_server() -> Iterator[str]:
    pages.clear()
    pages.update(
        {
            "/a/metrics": cache_config_page(4096, 16),
            "/b/metrics": cache_config_page(1024, 32),
            "/c/metrics": b"vllm:num_requests_running 0.0\n",
        }
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fleet_kv_capacity_is_the_smallest_engine_that_reports_it(metrics_server: str) -> None:
    down = f"http://127.0.0.1:{free_port()}/metrics"
    urls = [f"{metrics_server}/{n}/metrics" for n in ("a", "b", "c", "missing")]
    assert fleet_kv_capacity([*urls, down], timeout=2.0) == 1024 * 32
    assert fleet_kv_capacity([*urls[2:], down], timeout=2.0) is None


def test_one_scrape_of_each_page_reads_both_kv_caches(metrics_server: str) -> None:
    """Both readings of a page come from one GET (the proxy scraped each engine twice at start)."""
    # 1 GiB of host cache at 64 KiB per token (the GPU cache's bytes per token): 16,384 tokens.
    pages["/d/metrics"] = (
        b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="512",kv_offloading_size="1.0",'
        b'kv_cache_memory_bytes="536870912",kv_cache_size_tokens="8192"} 1.0\n'
    )
    hits.clear()
    down = f"http://127.0.0.1:{free_port()}/metrics"
    urls = {name: f"{metrics_server}/{name}/metrics" for name in ("a", "c", "d")}
    caches = fleet_caches({**urls, "gone": down})
    assert caches["a"] == EngineCache(4096 * 16, None)
    assert caches["c"] == EngineCache(None, None)
    assert caches["d"] == EngineCache(512 * 16, 16_384)
    assert caches["gone"] == EngineCache(None, None)
    assert hits == ["/a/metrics", "/c/metrics", "/d/metrics"]
    assert smallest_kv_capacity(caches.values()) == 512 * 16
    assert smallest_kv_capacity([EngineCache(None, 3)]) is None


def test_a_deployed_router_sized_from_its_engines_pages(metrics_server: str) -> None:
    deployed = DeployedRouter(size=lambda names: fleet_kv_capacity(f"{metrics_server}/{n}/metrics" for n in names))
    deployed.sync(["a", "b"])
    assert deployed.config.local_capacity_blocks == 1024 * 32 // DEFAULT_BLOCK_SIZE


# -- feeds ----------------------------------------------------------------------------------------


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def test_one_subscriber_follows_the_instances_sources() -> None:
    pytest.importorskip("zmq", reason="needs the events extra (pyzmq)")
    from smetric.events import KvEventSource

    deployed = DeployedRouter(index_mode="exact", kv_capacity_tokens=None)
    deployed.sync(["a", "b"])
    a, b = [KvEventSource("a", free_endpoint())], [KvEventSource("b", free_endpoint())]
    try:
        deployed.set_sources("a", a)
        first = deployed.feeds.subscriber if deployed.feeds else None
        assert deployed.subscribed == {"a"}
        deployed.set_sources("a", a)  # unchanged: no restart
        assert deployed.feeds is not None and deployed.feeds.subscriber is first
        deployed.set_sources("b", b)
        assert deployed.subscribed == {"a", "b"} and deployed.feeds.subscriber is not first
        deployed.sync(["b"])  # a replica goes: its sources leave the feed
        assert deployed.subscribed == {"b"} and "a" not in deployed.feeds.sources
    finally:
        deployed.close()
    assert deployed.feeds.subscriber is None
    assert first is not None and not first.running


def test_an_approximate_router_subscribes_to_nothing() -> None:
    deployed = DeployedRouter(kv_capacity_tokens=None)
    deployed.sync(["a"])
    deployed.set_sources("a", ["anything"])
    assert deployed.subscribed == frozenset()


def test_a_taken_connect_mode_endpoint_is_logged_once_and_the_rest_subscribed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("zmq", reason="needs the events extra (pyzmq)")
    from smetric.events import KvEventSource

    taken = KvEventSource("a", free_endpoint(), bind=True)  # the engine connects to one subscriber
    other = KvEventSource("b", free_endpoint())
    holder, second = FleetFeeds(Router(["a", "b"])), FleetFeeds(Router(["a", "b"]))
    try:
        holder.set_sources("a", [taken])
        holder.restart()
        assert holder.subscribed == {"a"}
        with caplog.at_level(logging.ERROR, logger="smetric.deployment"):
            second.set_sources("a", [taken])
            second.set_sources("b", [other])
            second.restart()
            assert second.subscribed == {"b"} and second.unsubscribable == {"a"}
            assert not second.set_sources("a", [taken])  # the same sources: no retry
            second.restart()  # another instance changed: still not retried
            assert second.subscribed == {"b"}
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "cannot bind" in errors[0].getMessage(), errors
    finally:
        holder.stop()
        second.stop()
