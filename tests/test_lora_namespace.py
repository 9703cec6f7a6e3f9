"""LoRA adapters get their own index namespace, as vLLM keys adapter blocks.

vLLM 0.33 puts the adapter into every block's hash (``("lora", name, path)`` in the extra keys;
``tests/data/vllm/golden_hashes.json`` pins it), so a request for an adapter never hits blocks
the base model (or another adapter) computed, even on the same instance with the same tokens.
The router must not credit them either: a request routed under
``smetric.vllm.cache_namespace(adapter)`` sees the adapter's blocks and only them, whether the
index is fed by the engines' KV events (the ingestor roots an event's chain at its
``lora_name``) or by the router's own inserts on route.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("zmq")
pytest.importorskip("aiohttp")

from fake_engine_util import get, post
from kv_truth import exact_router, wait_for

from smetric import Router
from smetric.events import KvEventSubscriber, discover_sources
from smetric.fake_engine import FakeEngine, FakeEngineConfig
from smetric.vllm import block_hashes, cache_namespace, event_hash

PROMPT = list(range(5_000, 5_000 + 16 * 8 + 5))  # eight full blocks and a partial one
FULL = len(PROMPT) // 16 * 16
ADAPTER = ("sql-expert", "/adapters/sql-expert")


def local(router: Router, namespace: str | None) -> int:
    hit: int = router.query(PROMPT, namespace=namespace).local["fake-0"]
    return hit


def test_a_base_and_an_adapter_request_on_one_instance_are_indexed_apart() -> None:
    with FakeEngine(speedup=1000.0, kv_events_port=0, lora_modules=(f"{ADAPTER[0]}={ADAPTER[1]}",)) as fe:
        models = json.loads(get(fe.url, "/v1/models")[1])["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("fake-model", None), (ADAPTER[0], "fake-model")]
        router = exact_router(["fake-0"])
        with KvEventSubscriber(router, discover_sources("fake-0", fe.url)):
            assert wait_for(lambda: fe.stack is not None and fe.stack.publisher is not None
                            and fe.stack.publisher.subscriptions == 1)  # fmt: skip
            # The base model's request: its blocks are the base namespace's only.
            base = json.loads(post(fe.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})[1])
            assert base["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert wait_for(lambda: local(router, None) == FULL)
            assert local(router, cache_namespace(ADAPTER[0])) == 0, "the adapter is not credited the base's blocks"
            # The adapter's request, same tokens, same instance: vLLM computes it all again...
            body = {"model": ADAPTER[0], "prompt": PROMPT, "max_tokens": 1}
            adapted = json.loads(post(fe.url, "/v1/completions", body)[1])
            assert adapted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            # ...and the index holds the two chains apart.
            assert wait_for(lambda: local(router, cache_namespace(ADAPTER[0])) == FULL)
            assert local(router, None) == FULL
            assert local(router, cache_namespace("another-adapter")) == 0
            # A second adapter request hits its own blocks, in the engine as in the index.
            again = json.loads(post(fe.url, "/v1/completions", body)[1])
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == FULL
        held = fe.call(lambda: fe.stack.engine.cache.cached_blocks if fe.stack else -1)
        assert held == 2 * FULL // 16, "the engine caches both chains"
        assert router.stats()["index_local_blocks"]["fake-0"] == held


def test_an_approximate_index_keeps_adapters_apart_too() -> None:
    router = Router(["a"])
    base = router.route(PROMPT)
    router.on_finished(base.request_id)
    adapted = router.route(PROMPT, namespace=cache_namespace(ADAPTER[0]))
    assert adapted.local_hit_tokens == 0, "routed under the adapter, the base's inserted chain does not count"
    router.on_finished(adapted.request_id)
    assert router.route(PROMPT, namespace=cache_namespace(ADAPTER[0])).local_hit_tokens == FULL
    assert router.route(PROMPT).local_hit_tokens == FULL


def test_the_namespace_rule() -> None:
    assert cache_namespace() is None
    assert cache_namespace(ADAPTER[0]) == ADAPTER[0], "what the ingestor roots an adapter's events at"
    assert cache_namespace(None, "salt") == "salt"
    both = cache_namespace(ADAPTER[0], "salt")
    assert both not in (ADAPTER[0], "salt", None)
    with pytest.raises(ValueError, match="non-empty"):
        cache_namespace("", None)
    assert FakeEngineConfig(lora_modules=("a=/x", "b")).adapters() == {"a": "/x", "b": "/fake-lora/b"}
    with pytest.raises(ValueError, match="once"):
        FakeEngineConfig(lora_modules=("a=/x", "a=/y")).adapters()
    # The engine hashes an adapter's blocks as vLLM does: no block in common with the base's.
    base = {event_hash(d) for d in block_hashes(PROMPT)}
    adapter = {event_hash(d) for d in block_hashes(PROMPT, lora=ADAPTER)}
    assert len(base) == len(adapter) == FULL // 16 and not base & adapter
