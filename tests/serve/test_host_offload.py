"""``smetric serve`` in front of engines that offload KV to their own host memory (docs/
routing-semantics.md §2.8): the offload is read from what each engine announces on ``/metrics``
(vLLM's ``--kv-offloading-size``), its CPU-medium KV events credit that instance's host pool only,
and a declared ``kv_offload`` wins over the announcement. Fake engines in process; bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

from proxy_util import colocated_router, proxy_for, request

from smetric.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "tests" / "data" / "serve" / "tokenizer.json")
HOST_BLOCKS = 512
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


def _engines(offloading: list[int]) -> list[FakeEngine]:
    return [
        FakeEngine(
            port=0, kv_events_port=0, kv_replay_port=0, speedup=1000, tokenizer=TOKENIZER, kv_offloading_blocks=blocks
        ).start()
        for blocks in offloading
    ]


def test_an_announced_offload_is_credited_to_its_engine_only() -> None:
    engines = _engines([HOST_BLOCKS, 0])
    offloading, plain = engines[0].url, engines[1].url
    p = proxy_for([offloading, plain], tokens={"mode": "tokenizer", "tokenizer": TOKENIZER})
    try:
        router = colocated_router(p)
        assert router.config.index_mode == "exact"
        assert router.config.host_capacity_blocks == HOST_BLOCKS, "sized from the engine's announced offload"
        routed = ""
        for k in range(20):  # distinct first turns, balanced over two idle engines, until one lands there
            msgs = [SYSTEM, {"role": "user", "content": f"task {k}: refactor the parser " * 60}]
            status, headers, raw = request(p.url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
            assert status == 200
            routed = headers["x-smetric-decision"]
            if offloading in routed:
                break
        assert offloading in routed, routed
        prompt_tokens = json.loads(raw)["usage"]["prompt_tokens"]
        deadline = time.monotonic() + 10
        stats = router.stats()
        while stats["index_host_blocks"].get(offloading, 0) < prompt_tokens // 16:
            assert time.monotonic() < deadline, f"the CPU-medium events never reached the host pool: {stats}"
            time.sleep(0.01)
            stats = router.stats()
        assert stats["index_host_blocks"][plain] == 0, "another engine's offload is not credited here"
        assert stats["index_global_blocks"] == 0, "nothing is credited fleet-wide"
    finally:
        p.stop()
        for e in engines:
            e.stop()


def test_a_declared_shared_offload_overrides_the_announcement() -> None:
    """Negative control: the same engine declared ``kv_offload = "shared"`` gets no host pool."""
    (engine,) = _engines([HOST_BLOCKS])
    p = proxy_for([{"url": engine.url, "kv_offload": "shared"}], tokens={"mode": "tokenizer", "tokenizer": TOKENIZER})
    try:
        router = colocated_router(p)
        assert router.config.host_capacity_blocks == 0
        status, _, _ = request(p.url, "/v1/chat/completions", {"messages": [SYSTEM], "max_tokens": 2})
        assert status == 200
        time.sleep(0.3)  # the events had time to arrive; none may reach a host pool
        assert router.stats()["index_host_blocks"] == {engine.url: 0}
    finally:
        p.stop()
        engine.stop()
