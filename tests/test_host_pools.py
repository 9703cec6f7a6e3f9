"""Host pools through the Python surface (docs/routing-semantics.md §2.8): a prefix offloaded to
an instance's own host memory is credited to that instance only, a named pool to its members,
and ``smetric serve`` declares each instance's offload."""

from __future__ import annotations

import pytest

import smetric
from smetric import Router, RouterConfig
from smetric._core import KvEventIngestor, encode_kv_batch
from smetric.serve.config import HOST_POOL_GPU_MULTIPLE, InstanceConfig, ServeConfig

NAMES = ["a", "b", "c"]


def _router(**fields: object) -> Router:
    return Router(NAMES, block_size=4, config=RouterConfig(host_capacity_blocks=256, **fields))  # type: ignore[arg-type]


def test_a_host_copy_credits_its_instance_and_a_global_copy_everyone() -> None:
    r = _router()
    chain = r.hash_tokens(list(range(41)))
    r.store_blocks("b", chain, tier="host")
    hits = r.query(hashes=chain, num_tokens=41)
    assert hits.host == {"a": 0, "b": 40, "c": 0}
    assert hits.global_hit_tokens == 0
    # Negative control: the same blocks in the shared store credit every instance.
    shared = _router()
    shared.store_blocks(None, chain, tier="global")
    hits = shared.query(hashes=chain, num_tokens=41)
    assert (hits.host, hits.global_hit_tokens) == ({"a": 0, "b": 0, "c": 0}, 40)
    assert r.stats()["index_host_blocks"] == {"a": 0, "b": 10, "c": 0}


def test_a_follow_up_goes_where_its_host_copy_is() -> None:
    r = _router(global_capacity_blocks=0)
    turn = list(range(41))
    r.store_blocks("c", r.hash_tokens(turn), tier="host")
    d = r.route(turn, turn=2, now=0.0)
    assert (d.instance, d.host_hit_tokens, d.prefill_tokens, d.reason) == ("c", 40, 1, "follow-up: sticky")


def test_named_pools_and_their_errors() -> None:
    r = _router()
    r.set_host_pool("a", "node-0")
    r.set_host_pool("b", "node-0")
    assert (r.host_pool("a"), r.host_pool("c")) == ("node-0", None)
    chain = r.hash_tokens(list(range(9)))
    r.store_blocks("a", chain, tier="host")
    assert r.query(hashes=chain, num_tokens=9).host == {"a": 8, "b": 8, "c": 0}
    with pytest.raises(smetric.InvalidArgumentError, match="empty"):
        r.set_host_pool("a", "")
    with pytest.raises(smetric.UnknownInstanceError):
        r.set_host_pool("zzz", "node-0")
    with pytest.raises(smetric.InvalidArgumentError, match="needs an instance"):
        r.store_blocks(None, chain, tier="host")
    with pytest.raises(smetric.InvalidArgumentError, match="host"):
        r.store_blocks("a", chain, tier="disk")  # type: ignore[arg-type]


def test_host_pools_are_off_by_default() -> None:
    r = Router(NAMES, block_size=4)
    assert r.config.host_capacity_blocks == 0
    chain = r.hash_tokens(list(range(9)))
    r.store_blocks("a", chain, tier="host")
    assert r.query(hashes=chain, num_tokens=9).host == {"a": 0, "b": 0, "c": 0}
    assert r.host_pool("a") is None
    with pytest.raises(smetric.InvalidConfigError):
        RouterConfig(host_fetch_cost=float("nan"))


def test_serve_declares_each_instances_offload() -> None:
    host = InstanceConfig(url="http://a:8000", kv_offload="host", host_pool="node-0")
    config = ServeConfig(instances=(host, InstanceConfig(url="http://b:8000")))
    router = config.router_config(exact_index=True, kv_capacity_tokens=16_000)
    assert router.host_capacity_blocks == HOST_POOL_GPU_MULTIPLE * router.local_capacity_blocks
    plain = ServeConfig(instances=(InstanceConfig(url="http://b:8000"),))
    assert plain.router_config(exact_index=True).host_capacity_blocks == 0
    with pytest.raises(smetric.InvalidConfigError, match="kv_offload"):
        InstanceConfig(url="http://a:8000", kv_offload="disk")
    with pytest.raises(smetric.InvalidConfigError, match="host_pool"):
        InstanceConfig(url="http://a:8000", host_pool="node-0")  # a pool only with kv_offload = "host"


def test_host_local_events_reach_the_host_pool_only() -> None:
    """A CPU-medium BlockStored from a source declared host-local lands in its instance's pool."""
    router = Router(NAMES, block_size=4, config=RouterConfig(index_mode="exact", host_capacity_blocks=64))
    ingestor = KvEventIngestor(router)
    src = ingestor.add_source("b", offload="host")
    tokens = list(range(8))
    stored = ("BlockStored", [11, 12], None, tokens, 4, None, "CPU")
    ingestor.on_message(src, [b"", (0).to_bytes(8, "big"), encode_kv_batch(0.0, [stored])])
    hits = router.query([*tokens, 99])
    assert (hits.host, hits.global_hit_tokens) == ({"a": 0, "b": 8, "c": 0}, 0)
    with pytest.raises(smetric.InvalidArgumentError, match="offload"):
        ingestor.add_source("a", offload="disk")  # type: ignore[arg-type]


def test_auto_offload_resolves_from_the_engines_announcement() -> None:
    auto = ServeConfig(instances=(InstanceConfig(url="http://a:8000"), InstanceConfig(url="http://b:8000")))
    assert {i.kv_offload for i in auto.instances} == {"auto"}
    resolved = auto.with_discovered_offload({"http://a:8000": 32_000, "http://b:8000": None})
    assert [i.kv_offload for i in resolved.instances] == ["host", "shared"]
    router = resolved.router_config(exact_index=True, host_offload_tokens=32_000)
    assert router.host_capacity_blocks == 32_000 // resolved.block_size, "sized from the announcement"
    # An engine that offloads an unannounced amount (0 tokens) gets the GPU-multiple default.
    unsized = resolved.router_config(exact_index=True, kv_capacity_tokens=16_000, host_offload_tokens=0)
    assert unsized.host_capacity_blocks == HOST_POOL_GPU_MULTIPLE * unsized.local_capacity_blocks
    declared = ServeConfig(instances=(InstanceConfig(url="http://a:8000", kv_offload="shared"),))
    assert declared.with_discovered_offload({"http://a:8000": 32_000}).instances[0].kv_offload == "shared"
