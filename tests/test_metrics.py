"""Prometheus metrics: the exporter renders exactly the counters smetric keeps, in a format that
parses back (with the same parser that reads vLLM's ``/metrics``), and serves them over HTTP."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from smetric import Router
from smetric.engine_load import parse_prometheus
from smetric.events import KvEventSource, KvEventSubscriber
from smetric.metrics import CONTENT_TYPE, MetricsExporter

sys.path.insert(0, str(Path(__file__).parent))
from kv_truth import exact_router, frames, load


def value(metrics: dict[str, Any], name: str, **labels: str) -> float:
    matches = [v for lab, v in metrics[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(matches) == 1, (name, labels, metrics.get(name))
    return float(matches[0])


def test_router_counters_render_and_parse_back() -> None:
    router = Router(["gpu-0", "gpu-1"], policy="smetric")
    for i in range(5):
        router.route(tokens=list(range(100 + i, 400 + i)), request_id=i)
    router.on_finished(0, 10)
    stats = router.stats()
    m = parse_prometheus(MetricsExporter(router).render())
    assert value(m, "smetric_routed_total") == stats["routed"] == 5
    assert value(m, "smetric_in_flight") == stats["in_flight"] == 4
    # One thread's decisions never find another's commit in between.
    assert value(m, "smetric_decision_retries_total") == stats["decision_retries"] == 0
    for reason, n in stats["reasons"].items():
        assert value(m, "smetric_decisions_total", reason=reason) == n
    for name, n in stats["index_local_blocks"].items():
        assert value(m, "smetric_index_blocks", instance=name) == n
    assert value(m, "smetric_index_entries") == stats["index_entries"] > 0
    assert value(m, "smetric_index_bytes") == stats["index_bytes"]


def test_learned_drain_rate_and_fetch_cost_per_instance() -> None:
    """The rate and the store fetch's cost the router learns from first tokens, per instance: absent
    until learned, then the router's own figures (``Router.load``)."""
    from smetric import RouterConfig
    from smetric.reference.load import prefill_work

    config = RouterConfig(smetric_learn_fetch_cost=True, smetric_drain_rate=20_000.0)
    router = Router(["gpu-0", "gpu-1"], policy="smetric", block_size=16, config=config)
    m = parse_prometheus(MetricsExporter(router).render())
    assert "smetric_instance_drain_rate" not in m and "smetric_instance_fetch_cost" not in m
    for s in range(10):
        t = 10.0 * s
        history = [s * 100_000 + k for k in range(8_192)]
        first = router.route(tokens=history, turn=1, now=t, exclude=["gpu-1"])
        router.on_prefilled(first.request_id, now=t + 0.5)
        router.on_finished(first.request_id, 1, now=t + 0.6)
        follow_up = router.route(tokens=[*history, *range(1_024)], turn=2, now=t + 1.0, exclude=["gpu-0"])
        assert (follow_up.instance, follow_up.global_hit_tokens) == ("gpu-1", 8_192)
        # 1,024 new tokens computed after 8,192 loaded at 0.25 work a token, at 20,000 work a second.
        computed = prefill_work(1_024, 9_216, config.smetric_l_eq_tokens)
        router.on_prefilled(follow_up.request_id, now=t + 1.0 + (computed + 0.25 * 8_192) / 20_000.0)
        router.on_finished(follow_up.request_id, 1, now=t + 2.0)
    m = parse_prometheus(MetricsExporter(router).render())
    learned = router.load("gpu-1")["fetch_cost"]
    assert learned is not None and abs(learned - 0.25) < 0.01, learned
    assert value(m, "smetric_instance_fetch_cost", instance="gpu-1") == pytest.approx(learned)
    assert [lab for lab, _ in m["smetric_instance_fetch_cost"]] == [{"instance": "gpu-1"}]
    for name in ("gpu-0", "gpu-1"):
        assert value(m, "smetric_instance_drain_rate", instance=name) == pytest.approx(router.load(name)["drain_rate"])


def test_kv_event_counters_per_source() -> None:
    stream = load("captured_stream.json")
    router = exact_router(["a", "b"])
    sources = [KvEventSource("a", "tcp://127.0.0.1:5557"), KvEventSource("b", "tcp://127.0.0.1:5558")]
    sub = KvEventSubscriber(router, sources)  # not started: fed by hand below
    for message in stream["messages"]:
        sub.ingestor.on_message(sub.source_ids[0], frames(message))
    sub.ingestor.on_message(sub.source_ids[1], [b"", (0).to_bytes(8, "big"), b"\xc1"])  # undecodable
    text = MetricsExporter(router, events=sub).render()
    m = parse_prometheus(text)
    a = {"instance": "a", "endpoint": "tcp://127.0.0.1:5557"}
    stats = sub.ingestor.stats(sub.source_ids[0])
    assert value(m, "smetric_kv_events_batches_total", **a) == stats["batches"] == stream["truth"]["messages"]
    assert value(m, "smetric_kv_events_removed_blocks_total", **a) == stats["removed_blocks"] > 0
    assert value(m, "smetric_kv_events_mapped_blocks", **a) == stats["mapped_blocks"]
    assert value(m, "smetric_kv_events_decode_errors_total", instance="b") == 1
    assert sum(v for _, v in m["smetric_kv_events_decode_errors_by_kind_total"]) == 1
    assert value(m, "smetric_kv_events_running") == 0
    assert value(m, "smetric_index_blocks", instance="a") == stream["truth"]["cached_blocks_total"]
    assert "# TYPE smetric_kv_events_mapped_blocks gauge" in text
    assert "# TYPE smetric_kv_events_gaps_total counter" in text


class FakeScraper:
    def stats(self) -> dict[str, Any]:
        return {
            "rounds": 7,
            "instances": {
                'gpu "0"': {"url": "http://x", "ok": 6, "errors": 1, "slow": 0, "last_error": "boom",
                            "prefix_cache_hit_rate": 0.25, "external_prefix_cache_hit_rate": None},
            },
        }  # fmt: skip


def test_engine_load_counters_escape_labels() -> None:
    m = parse_prometheus(MetricsExporter(Router(["a"]), load=FakeScraper()).render())
    assert value(m, "smetric_engine_scrape_rounds_total") == 7
    assert value(m, "smetric_engine_scrapes_total", instance='gpu "0"', outcome="error") == 1
    assert value(m, "smetric_engine_prefix_cache_hit_rate", instance='gpu "0"') == 0.25
    assert "smetric_engine_external_prefix_cache_hit_rate" not in m


def test_served_over_http_and_bad_prefix() -> None:
    router = Router(["a"])
    router.route(tokens=list(range(64)))
    with MetricsExporter(router, prefix="edge_router").serve() as server:
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            m = parse_prometheus(response.read().decode())
        assert value(m, "edge_router_routed_total") == 1
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=5)
        assert err.value.code == 404
        err.value.close()
    for bad in ("", "9x", "a-b"):
        with pytest.raises(ValueError, match="prefix"):
            MetricsExporter(router, prefix=bad)
