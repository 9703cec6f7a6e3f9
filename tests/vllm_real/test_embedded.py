"""The embedded path on real engines: ``Router`` + ``KvEventSubscriber`` + ``EngineLoadScraper``.

* **Sizing** from the engine's own ``vllm:cache_config_info`` (``kv_capacity_tokens``) equals the
  KV space the engine was given (``VLLM_CPU_KVCACHE_SPACE``), in blocks of the engine's size.
* **Replay after a late subscription**: prompts served before the router exists reach its index
  through vLLM's replay ROUTER once the first live batch shows the gap; then for every prompt the
  router's predicted local hit equals the engine's ``cached_tokens`` when the prompt is sent again.
* **Load** from the real ``/metrics``: while long streams run on one engine the router's board
  shows them (``engine_running``, ``kv_usage``), and 0 once they are done.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from real_util import Fleet, fleet, http_json, wait_until

from smetric import Router, RouterConfig
from smetric.deployment import deployed_fields
from smetric.engine_load import EngineLoadScraper, kv_capacity_tokens
from smetric.events import KvEventSubscriber, discover_sources

pytestmark = pytest.mark.vllm_real

BS = fleet.BLOCK_SIZE


def _prompt(i: int) -> str:
    return f"embedded {i} {time.time_ns()} " + " ".join(f"w{(i * 7919 + k) % 1000}" for k in range(150 + 13 * i))


def _complete(url: str, prompt: str, **extra: object) -> dict[str, object]:
    _, doc = http_json(url + "/v1/completions", {"model": fleet.MODEL_NAME, "prompt": prompt, "max_tokens": 2, **extra})
    return doc


def _cached(doc: dict[str, object]) -> int:
    usage = doc["usage"]
    assert isinstance(usage, dict)
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_late_subscriber_replays_and_predicts_the_engines_hits(vllm_fleet: Fleet) -> None:
    e0, e1 = vllm_fleet.engines
    with urllib.request.urlopen(e0.url + "/metrics", timeout=30) as r:
        capacity = kv_capacity_tokens(r.read().decode())
    model = json.loads((vllm_fleet.model / "config.json").read_text())
    # K and V, bf16, per layer and KV head: the bytes one token takes in the engine's KV space.
    per_token = model["num_hidden_layers"] * model["num_key_value_heads"] * model["head_dim"] * 2 * 2
    assert capacity == e0.kv_space_gib * 2**30 // per_token
    config = RouterConfig(**deployed_fields({"index_mode": "exact"}, block_size=BS, kv_capacity_tokens=capacity))
    assert config.local_capacity_blocks == capacity // BS

    prompts = [_prompt(i) for i in range(6)]
    for p in prompts[:4]:  # served before the router subscribes
        _complete(e0.url, p)
    router = Router([e0.url, e1.url], block_size=BS, config=config)
    sources = [s for e in (e0, e1) for s in discover_sources(e.url)]
    assert [s.endpoint for s in sources] == [e0.endpoint, e1.endpoint] and not any(s.bind for s in sources)
    with KvEventSubscriber(router, sources) as sub:
        for p in prompts[4:]:  # live: the first batch shows the gap, the replay fills it
            _complete(e0.url, p)
        # A SUB socket joins a few ms to seconds after it connects (ZMQ's slow joiner; longer on a
        # loaded machine): batches published before that are never delivered, so nothing shows the
        # gap. Keep serving fresh prompts, a bounded number, until one live batch has arrived.
        for extra in range(10):
            if wait_until(lambda: sub.stats()["sources"][0]["batches"] > 0, timeout=3):
                break
            prompts.append(_prompt(6 + extra))
            _complete(e0.url, prompts[-1])
        assert sub.stats()["sources"][0]["batches"] > 0, sub.stats()
        ids = [http_json(e0.url + "/tokenize", {"model": fleet.MODEL_NAME, "prompt": p})[1]["tokens"] for p in prompts]

        def full(tokens: list[int]) -> bool:
            # Every block stored: the hit is the whole blocks within the first n − 1 tokens.
            return router.query(tokens).local[e0.url] == (len(tokens) - 1) // BS * BS

        assert wait_until(lambda: all(full(t) for t in ids), timeout=30), [router.query(t).local for t in ids]
        for p, tokens in zip(prompts, ids, strict=True):
            # The router counts a hit as vLLM does (a whole-block prompt: one block less).
            predicted = router.query(tokens).local[e0.url]
            assert _cached(_complete(e0.url, p)) == predicted
            assert router.query(tokens).local[e1.url] == 0
        stats = sub.stats()
    e0_stats = stats["sources"][0]
    assert e0_stats["replays"] >= 1 and e0_stats["replay_failures"] == 0 and e0_stats["resets"] == 0, e0_stats
    assert stats["decode_errors"] == 0 and stats["unmapped_hashes"] == 0 and stats["loop_errors"] == 0, stats


def test_load_comes_from_the_real_metrics(vllm_fleet: Fleet) -> None:
    e0, e1 = vllm_fleet.engines
    router = Router([e0.url, e1.url], block_size=BS, config=RouterConfig(index_mode="exact"))
    streams = 4
    with EngineLoadScraper(router, [e0.url, e1.url], period_s=0.1) as scraper:
        workers = [
            threading.Thread(
                target=_complete,
                args=(e1.url, f"load {i} " + _prompt(i)),
                kwargs={"max_tokens": 600, "ignore_eos": True},
            )
            for i in range(streams)
        ]
        for w in workers:
            w.start()
        try:
            seen = wait_until(lambda: router.load(e1.url)["engine_running"] >= 1, timeout=30)
            busy = router.load(e1.url)
            idle_peer = router.load(e0.url)
        finally:
            for w in workers:
                w.join(120)
        assert seen, router.load(e1.url)
        assert busy["kv_usage"] > 0 and idle_peer["engine_running"] == 0, (busy, idle_peer)
        assert wait_until(lambda: router.load(e1.url)["engine_running"] == 0, timeout=30), router.load(e1.url)
        per_instance = scraper.stats()["instances"][e1.url]
        assert per_instance["ok"] > 0 and per_instance["errors"] == 0, per_instance
