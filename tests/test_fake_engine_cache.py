"""The fake engine's prefix cache against a plain reference: its events, replayed into a set,
always equal its content, and it never holds more blocks than it has (seeded random runs)."""

from __future__ import annotations

import os
import random

import pytest

from smetric.fake_engine.cache import Allocation, PrefixCache

SEED = int(os.environ.get("SMETRIC_TEST_SEED", "0"))


def replay(events: list[tuple[object, ...]], into: set[int]) -> None:
    for e in events:
        if e[0] == "BlockStored":
            hashes = e[1]
            assert isinstance(hashes, list)
            assert not into & set(hashes), "a block is stored twice"
            into.update(hashes)
        elif e[0] == "BlockRemoved":
            (h,) = e[1]  # type: ignore[misc]
            into.remove(h)
        else:
            into.clear()


@pytest.mark.parametrize("seed", range(SEED, SEED + 5))
def test_events_replay_to_the_cache_and_capacity_holds(seed: int) -> None:
    rng = random.Random(seed)
    cache = PrefixCache(num_blocks=40, block_size=4)
    prefixes = [[rng.randrange(1000) for _ in range(4 * rng.randint(1, 4))] for _ in range(5)]
    seen: set[int] = set()
    live: list[Allocation] = []
    for _ in range(400):
        action = rng.random()
        if action < 0.5:
            tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(0, 12))]
            a = cache.admit(tokens, rng.randint(1, 8))
            if a is not None:
                live.append(a)
        elif action < 0.8 and live:
            cache.store(rng.choice(live))
        elif live:
            a = live.pop(rng.randrange(len(live)))
            cache.store(a)
            cache.release(a)
        replay(cache.take_events(), seen)
        assert seen == cache.cached_hashes()
        assert cache.used_blocks <= cache.num_blocks
        assert cache.cached_blocks + sum(a.private for a in live) <= cache.num_blocks
    for a in live:
        cache.release(a)
    assert cache.used_blocks == 0
    cache.clear()
    replay(cache.take_events(), seen)
    assert seen == set() == cache.cached_hashes()


def test_hits_are_capped_one_token_short_and_lru_evicts_oldest() -> None:
    cache = PrefixCache(num_blocks=4, block_size=4)
    a = cache.admit(list(range(8)), 1)  # 2 prompt blocks + 1 for the output
    assert a is not None and a.hit_blocks == 0
    cache.store(a)
    cache.release(a)
    b = cache.admit(list(range(8)), 1)  # 8 tokens: at most (8 - 1) // 4 = 1 block hits
    assert b is not None and b.hit_blocks == 1
    cache.store(b)
    cache.release(b)
    cache.take_events()
    c = cache.admit(list(range(100, 116)), 0)  # 4 new blocks: both cached ones are evicted, LRU first
    assert c is not None
    removed = [e[1][0] for e in cache.take_events() if e[0] == "BlockRemoved"]
    assert removed == cache.hash_prompt(list(range(8)))
    assert cache.admit([1, 2, 3], 1) is None  # full: it waits


def test_host_offload_announces_cpu_copies_and_evicts_its_own_lru() -> None:
    """``host_blocks``: every cached block is written to a host LRU, one ``CPU`` BlockStored
    without tokens per store, a ``CPU`` BlockRemoved per host eviction; no offload, no CPU event."""
    cache = PrefixCache(num_blocks=16, block_size=4, host_blocks=3)
    a = cache.admit(list(range(8)), 1)
    assert a is not None
    cache.store(a)
    first = cache.hash_prompt(list(range(8)))
    assert [e for e in cache.take_events() if e[-1] == "CPU"] == [("BlockStored", first, None, [], 4, None, "CPU")]
    cache.release(a)
    b = cache.admit(list(range(100, 109)), 1)  # two new blocks: the host LRU (3) drops the oldest
    assert b is not None
    cache.store(b)
    cpu = [e for e in cache.take_events() if e[-1] == "CPU"]
    assert cpu == [
        ("BlockRemoved", [first[0]], "CPU"),
        ("BlockStored", cache.hash_prompt(list(range(100, 109))), None, [], 4, None, "CPU"),
    ]
    assert cache.host_cached_blocks == 3
    plain = PrefixCache(num_blocks=16, block_size=4)
    c = plain.admit(list(range(8)), 1)
    assert c is not None
    plain.store(c)
    assert all(e[-1] == "GPU" for e in plain.take_events())


def test_bad_hash_settings_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="seed"):
        PrefixCache(num_blocks=4, block_size=4, algo="xxhash")  # xxhash needs vLLM's PYTHONHASHSEED
    assert PrefixCache(num_blocks=4, block_size=4, algo="xxhash", seed="0").hash_prompt([1, 2, 3, 4])
