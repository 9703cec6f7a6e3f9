"""Unit tests of the plain-Python reference router against hand-computed expectations.

They exercise `smetric.reference` alone (no Rust extension), so the oracle of the differential
test is itself checked against docs/routing-semantics.md.
"""

from __future__ import annotations

import importlib
import struct
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

try:
    importlib.import_module("smetric.reference")
except ImportError:
    # `smetric/__init__.py` imports the compiled `smetric._core`. Without it (not built yet, or
    # not installed at all) load only the plain-Python reference from the source tree, under a
    # bare parent package that skips `smetric/__init__.py`.
    _parent = types.ModuleType("smetric")
    _parent.__path__ = [str(Path(__file__).resolve().parents[2] / "python" / "smetric")]
    sys.modules["smetric"] = _parent

from smetric.reference import (
    DuplicateInstanceError,
    NoInstancesError,
    ReferenceConfig,
    ReferenceRouter,
    UnknownInstanceError,
    ref_hash_tokens,
)
from smetric.reference.index import KvIndex
from smetric.reference.policies import (
    Candidate,
    CounterRng,
    RouteInput,
    bailian_top3,
    cache_first_max_hit,
    cache_first_weighted,
    consistent_hash,
    dynamo_host_tier,
    least_load,
    linear,
    llmd_prefix_load,
    llmd_session_affinity,
    lmetric,
    lpwl,
    power_of_two,
    preble,
    preble_routed_cost_us,
    prompt_key,
    rendezvous_hash,
    round_robin,
    splitmix64_mix,
    vllm_router_cache_aware,
)
from smetric.reference.policies import (
    smetric as smetric_policy,
)
from smetric.reference.policies import (
    smetric_paper as smetric_v2_policy,
)

GOLDEN = 0x9E3779B97F4A7C15


def xxh(data: bytes, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def le(*tokens: int) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def router(
    instances: tuple[str, ...] = ("a", "b", "c"),
    *,
    policy: str = "smetric",
    block_size: int = 4,
    seed: int = 0,
    **config: Any,
) -> ReferenceRouter:
    cfg = ReferenceConfig(**config)
    return ReferenceRouter(list(instances), policy=policy, block_size=block_size, seed=seed, config=cfg)


# --- §1 hashing -------------------------------------------------------------------------------
def step(parent: int, content: int) -> int:
    """§1's chain step, written out again from the spec's formula."""
    m = ((parent ^ content) * 0xFF51AFD7ED558CCD) % 2**64
    return m ^ (m >> 32)


def test_three_block_chain_matches_direct_xxhash_calls() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # 3 full blocks of 4 + a partial tail
    h0 = step(0, xxh(le(1, 2, 3, 4), 0))
    h1 = step(h0, xxh(le(5, 6, 7, 8), 0))
    h2 = step(h1, xxh(le(9, 10, 11, 12), 0))
    assert ref_hash_tokens(tokens, 4) == [h0, h1, h2]
    # The value the Rust core's unit test pins (rust/smetric-core/src/hash.rs) and §1 states.
    assert h1 == 0x3F422018C16740A2


def test_seed_and_namespace_set_the_root() -> None:
    tokens = [7, 8, 2**32 - 1, 0, 5, 6]
    root = xxh(b"lora-a", 42)
    h0 = step(root, xxh(le(7, 8), 0))
    h1 = step(h0, xxh(le(2**32 - 1, 0), 0))
    expected = [h0, h1, step(h1, xxh(le(5, 6), 0))]
    assert ref_hash_tokens(tokens, 2, hash_seed=42, namespace="lora-a") == expected
    assert ref_hash_tokens(tokens, 2, hash_seed=42)[0] == step(42, xxh(le(7, 8), 0))
    # The empty namespace is a namespace, not "no namespace".
    assert ref_hash_tokens(tokens, 2, namespace="")[0] == step(xxh(b"", 0), xxh(le(7, 8), 0))


def test_siblings_never_share_a_hash() -> None:
    # The chain step is a bijection of parent ^ content: distinct blocks under one parent differ.
    for parent in (0, 1, 2**64 - 1):
        assert len({step(parent, c) for c in range(4096)}) == 4096


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_numpy_arrays_hash_like_lists(dtype: type) -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    assert ref_hash_tokens(np.array(tokens, dtype=dtype), 3) == ref_hash_tokens(tokens, 3)


def test_short_prompts_and_bad_tokens() -> None:
    assert ref_hash_tokens([1, 2, 3], 4) == []
    assert ref_hash_tokens([], 1) == []
    with pytest.raises(ValueError, match="token ids"):
        ref_hash_tokens([2**32], 1)
    with pytest.raises(ValueError, match="token ids"):
        ref_hash_tokens([-1], 1)
    with pytest.raises(TypeError):
        ref_hash_tokens(np.array([1.0, 2.0]), 1)


def test_router_hash_tokens_uses_its_config() -> None:
    r = router(block_size=2, hash_seed=9)
    assert r.hash_tokens([1, 2, 3, 4, 5], namespace="x") == ref_hash_tokens([1, 2, 3, 4, 5], 2, 9, "x")


# --- §2 index ---------------------------------------------------------------------------------
def test_lru_evicts_tail_first() -> None:
    ix = KvIndex()
    ix.add_holder(0, capacity=5, ttl_ms=None)
    ix.touch(0, [10, 11, 12, 13, 14], now_ms=0)
    assert list(ix.holders[0].blocks) == [14, 13, 12, 11, 10]  # LRU first: the tail
    ix.touch(0, [20, 21], now_ms=1)  # 7 > 5: evicts 14 then 13
    assert list(ix.holders[0].blocks) == [12, 11, 10, 21, 20]
    assert ix.matched_blocks(0, [10, 11, 12, 13, 14]) == 3
    assert 13 not in ix.entries
    assert 14 not in ix.entries
    ix.touch(0, [10], now_ms=2)  # re-touching the head only moves it to the MRU end
    assert list(ix.holders[0].blocks) == [12, 11, 21, 20, 10]


def test_children_saturate_at_u16_max() -> None:
    ix = KvIndex()
    ix.add_holder(0, capacity=10, ttl_ms=None)
    ix.touch(0, [1], now_ms=0)
    ix.entries[1].children = 65534
    ix.touch(0, [1, 2], now_ms=0)
    ix.touch(0, [3], now_ms=0, parent=1)
    assert ix.children(1) == 65535


def test_run_longer_than_capacity_keeps_its_head() -> None:
    ix = KvIndex()
    ix.add_holder(0, capacity=2, ttl_ms=None)
    ix.touch(0, [1, 2, 3, 4], now_ms=0)
    assert list(ix.holders[0].blocks) == [2, 1]
    assert set(ix.entries) == {1, 2}


def test_ttl_expires_at_exactly_ttl_ms() -> None:
    r = router(("a",), policy="round_robin", index_mode="approximate", local_ttl_s=1.0, global_capacity_blocks=0)
    tokens = list(range(12))
    r.route(tokens, now=10.0)
    # Queried with one token more, so that every stored block can count (a hit stops at the
    # whole blocks before the last token).
    assert r.query([*tokens, 7], now=10.999).local == {"a": 12}
    assert r.query([*tokens, 7], now=11.0).local == {"a": 0}  # 1000 ms old >= ttl 1000 ms
    # Purge stops at the first unexpired LRU block.
    r.route(tokens, now=20.0)
    r.route(tokens + [99] * 4, now=20.5)  # re-touches blocks 0..2 at 20.5, adds block 3
    hits = r.query([*tokens, 99, 99, 99, 99, 7], now=21.2)
    assert hits.local == {"a": 16}


def test_ttl_uses_floored_milliseconds() -> None:
    r = router(("a",), policy="round_robin", local_ttl_s=0.0015, global_capacity_blocks=0)  # ttl_ms = 1
    r.route(list(range(8)), now=0.0009)  # stored at ms 0
    assert r.query(list(range(9)), now=0.00099).local == {"a": 8}  # ms 0: age 0 < 1
    assert r.query(list(range(9)), now=0.001).local == {"a": 0}  # ms 1: age 1 >= 1


def test_global_tier_has_no_ttl() -> None:
    r = router(("a",), policy="round_robin", local_ttl_s=1.0, global_capacity_blocks=16)
    r.route(list(range(9)), now=0.0)
    hits = r.query(list(range(9)), now=100.0)
    assert hits.local == {"a": 0}
    assert (hits.global_hit_tokens, hits.deepest_blocks) == (8, 2)


def test_children_count_branches_and_turn_inference() -> None:
    r = router(("a", "b"), policy="round_robin", global_capacity_blocks=0)
    system = list(range(8))  # 2 blocks
    d1 = r.route([*system, 100, 101, 102, 103, 104], now=0.0)
    assert (d1.first_turn, d1.turn_source) == (True, "index")  # nothing matched
    d2 = r.route([*system, 200, 201, 202, 203, 204], now=0.0)
    assert d2.first_turn  # matched the system prompt, whose last block already has 1 child
    hits = r.query([*system, 300], now=0.0)
    assert (hits.deepest_blocks, hits.branches) == (2, 2)
    # A follow-up of session 1 matches up to its previous prompt's last full block: no children.
    follow = r.route([*system, 100, 101, 102, 103, 104, 105, 106, 107, 108], now=0.0)
    assert (follow.first_turn, follow.turn_source) == (False, "index")
    assert follow.local_hit_tokens == 12
    assert follow.instance == "a"


def test_store_blocks_parent_bumps_children_once() -> None:
    r = router(("a", "b"), index_mode="exact", global_capacity_blocks=0)
    r.store_blocks("a", [1, 2], now=0.0)
    r.store_blocks("b", [3], parent=2, now=0.0)  # new entry 3 under 2
    r.store_blocks("a", [3], parent=2, now=0.0)  # 3 exists: no bump
    assert r.query(hashes=[1, 2, 9], now=0.0).branches == 1
    r.store_blocks("a", [4], parent=77, now=0.0)  # unknown parent: nothing to bump
    assert r.query(hashes=[4], now=0.0).branches == 0


def test_removal_deletes_entries_and_loses_children() -> None:
    r = router(("a", "b"), index_mode="exact", global_capacity_blocks=0)
    r.store_blocks("a", [1, 2, 3], now=0.0)
    r.store_blocks("b", [1, 2], now=0.0)
    assert r.query(hashes=[1, 2], now=0.0).branches == 1  # 2 -> 3
    r.remove_blocks("a", [2, 3, 42])  # 42 is not held: ignored
    hits = r.query(hashes=[1, 2, 3], num_tokens=100, now=0.0)
    assert hits.local == {"a": 4, "b": 8}
    assert hits.branches == 1
    r.remove_blocks("b", [2])  # nobody holds 2 any more: its entry (and children) goes
    r.store_blocks("b", [2], now=0.0)
    assert r.query(hashes=[1, 2], now=0.0).branches == 0
    r.clear("b")
    assert r.query(hashes=[1, 2], now=0.0).local == {"a": 4, "b": 0}


def test_exact_mode_route_does_not_touch() -> None:
    # Without sent blocks (§2.7 off) a decision changes nothing in the index.
    r = router(("a",), index_mode="exact", exact_pending_ttl_s=0.0)
    r.route(list(range(16)), now=0.0)
    hits = r.query(list(range(16)), now=0.0)
    assert hits.local == {"a": 0}
    assert hits.global_hit_tokens == 0


def test_exact_mode_route_sends_blocks_until_the_bound() -> None:
    # §2.7: the blocks sent count on the chosen instance (never in the global tier) until an
    # event confirms or evicts them or exact_pending_ttl_s passes; the index proper is untouched.
    r = router(("a",), index_mode="exact", exact_pending_ttl_s=0.5)
    r.route(list(range(16)), now=0.0)
    probe = list(range(17))  # one token more: all four sent blocks can count
    hits = r.query(probe, now=0.499)
    assert hits.local == {"a": 16} and hits.global_hit_tokens == 0
    assert r.query(probe, now=0.5).local == {"a": 0}
    r.route(list(range(16)), now=1.0)
    r.remove_blocks("a", r.hash_tokens(list(range(16)))[2:3])  # evicted by the engine
    assert r.query(probe, now=1.1).local == {"a": 8}


def test_global_tier_and_disabled_global_tier() -> None:
    r = router(("a", "b"), index_mode="exact", global_capacity_blocks=2)
    r.store_blocks(None, [1, 2, 3], tier="global", now=0.0)  # capacity 2: tail (3) evicted
    assert r.query(hashes=[1, 2, 3], now=0.0).global_hit_tokens == 8
    r.clear(None, tier="global")
    assert r.query(hashes=[1, 2, 3], now=0.0).global_hit_tokens == 0
    off = router(("a",), index_mode="exact", global_capacity_blocks=0)
    off.store_blocks(None, [1, 2], tier="global", now=0.0)
    assert off.query(hashes=[1, 2], now=0.0).global_hit_tokens == 0


def test_hit_tokens_leave_the_last_token() -> None:
    r = router(("a",), index_mode="exact", block_size=4)
    r.store_blocks("a", [1, 2], now=0.0)
    # §2.4, as vLLM counts: the whole blocks within the first n - 1 tokens.
    assert r.query(hashes=[1, 2], now=0.0).local == {"a": 4}  # n = 8: one block fits in 7
    assert r.query(hashes=[1, 2], num_tokens=9, now=0.0).local == {"a": 8}
    assert r.query(hashes=[1, 2], num_tokens=10, now=0.0).local == {"a": 8}
    assert r.query(hashes=[1, 2], num_tokens=0, now=0.0).local == {"a": 0}


# --- §3 load board and lifecycle ------------------------------------------------------------
def board(**fields: float | None) -> dict[str, float | None]:
    """A `load()` dict: the given fields, every other field zero (no learned drain rate)."""
    keys = ("batch_size", "waiting", "queued", "queued_work", "active", "drain_rate")
    keys += ("engine_running", "engine_waiting", "kv_usage")
    defaults: dict[str, float | None] = {"kv_usage": 0.0, "drain_rate": None}
    return {k: fields.get(k, defaults.get(k, 0)) for k in keys}


def test_lifecycle_counters_never_negative_and_events_are_idempotent() -> None:
    r = router(("a",), policy="round_robin", global_capacity_blocks=0)
    d = r.route(list(range(10)), request_id="req-1", now=0.0)
    assert d.request_id == "req-1"  # echoed as given; keyed as xxh3_64("req-1", seed=0)
    # 10 cold tokens of work: ceil(10 + 10·(10 − 5)/6923) = 11.
    assert r.load("a") == board(batch_size=1, waiting=1, queued=10, queued_work=11, active=10)
    assert r.on_finished("req-1", 5) is True  # finish before prefilled: prefilled step first
    assert r.load("a") == board()
    assert r.on_finished("req-1") is False  # double finish: unknown now
    assert r.on_prefilled(xxh(b"req-1", 0)) is False
    assert r.on_aborted(12345) is False
    assert r.load("a")["batch_size"] == 0
    assert r.load("a")["waiting"] == 0
    assert r.stats()["unknown_request_events"] == 3

    d2 = r.route(list(range(10)), now=0.0)
    assert r.on_prefilled(d2.request_id) is True
    assert r.on_prefilled(d2.request_id) is False  # already prefilled: no double decrement
    assert r.load("a")["waiting"] == 0
    assert r.load("a")["queued"] == 0
    assert r.load("a")["batch_size"] == 1
    assert r.on_aborted(d2.request_id) is True
    assert all(v == 0 for k, v in r.load("a").items() if k != "drain_rate")

    r.route(list(range(10)), request_id="req-2", now=0.0)
    assert r.on_finished(xxh(b"req-2", 0)) is True  # a str id and its hash name the same request


def test_prefill_uses_best_of_local_and_global_hit() -> None:
    r = router(("a", "b"), policy="round_robin", block_size=4, global_capacity_blocks=64)
    r.route(list(range(12)), now=0.0)  # -> a; stores 3 blocks on a and in the global tier
    d = r.route([*range(12), 50, 51], now=0.0)  # -> b: no local hit, global hit 12
    assert (d.instance, d.local_hit_tokens, d.global_hit_tokens, d.prefill_tokens) == ("b", 0, 12, 2)
    assert r.load("b")["queued"] == 2
    assert r.load("b")["active"] == 14


def test_auto_request_ids_count_from_two_to_the_63() -> None:
    r = router(("a",), policy="round_robin")
    ids = [r.route([1, 2, 3], now=0.0).request_id for _ in range(3)]
    assert ids == [2**63, 2**63 + 1, 2**63 + 2]
    assert r.route([1], request_id=7, now=0.0).request_id == 7
    assert r.route([1], now=0.0).request_id == 2**63 + 3  # explicit ids do not consume the counter


def test_removed_and_reused_slot_is_not_touched_by_old_requests() -> None:
    r = router(("a", "b"), policy="round_robin", global_capacity_blocks=0)
    d = r.route(list(range(8)), now=0.0)
    assert d.instance == "a"
    r.remove_instance("a")
    assert r.on_prefilled(d.request_id) is False  # slot removed
    r.add_instance("c")  # reuses slot 0 with a new generation
    assert r.instances == ["c", "b"]
    r.route(list(range(4)), now=0.0)  # rr=1 -> candidates[1] = "b"
    e = r.route(list(range(4)), now=0.0)  # rr=2 -> "c"
    assert e.instance == "c"
    assert r.on_finished(d.request_id) is False  # known, but its slot was reused
    assert r.load("c")["batch_size"] == 1
    assert r.on_finished(d.request_id) is False  # now forgotten
    assert r.stats()["unknown_request_events"] == 1


def test_instances_errors() -> None:
    with pytest.raises(NoInstancesError):
        ReferenceRouter([])
    with pytest.raises(DuplicateInstanceError):
        ReferenceRouter(["a", "a"])
    r = router(("a",))
    with pytest.raises(DuplicateInstanceError):
        r.add_instance("a")
    with pytest.raises(UnknownInstanceError):
        r.remove_instance("zz")
    with pytest.raises(UnknownInstanceError):
        r.load("zz")
    r.remove_instance("a")
    with pytest.raises(NoInstancesError):
        r.route([1, 2, 3], now=0.0)
    r.add_instance("a")
    assert r.route([1, 2, 3], now=0.0).request_id == 2**63  # the refused route issued no id


def test_removing_an_instance_clears_its_blocks() -> None:
    r = router(("a", "b"), index_mode="exact", global_capacity_blocks=0)
    r.store_blocks("a", [1, 2], now=0.0)
    r.remove_instance("a")
    r.add_instance("a")
    assert r.query(hashes=[1, 2], now=0.0).local == {"a": 0, "b": 0}


def test_engine_snapshot_counts_only_while_fresh() -> None:
    r = router(("a", "b"), policy="least_load", engine_load_staleness_s=1.0)
    r.update_load("a", running=3, waiting=2, kv_usage=0.5, now=10.0)
    assert r.load("a") == board(engine_running=3, engine_waiting=2, kv_usage=0.5)
    # fresh at 11.0 (1000 ms <= 1000 ms): a scores 4*2 + 5 = 13, b 0 -> b
    assert r.route([1], now=11.0).instance == "b"
    # stale at 11.001: a scores 0, b scores 4*1 + 1 = 5 -> a
    assert r.route([1], now=11.001).instance == "a"
    r.update_load("a", kv_usage=0.1, now=20.0)  # only kv_usage changes; the stamp moves
    assert r.load("a")["engine_running"] == 3
    assert r.load("a")["kv_usage"] == 0.1


# --- §4 turn inference ------------------------------------------------------------------------
def test_turn_sources_in_order() -> None:
    r = router(("a",), policy="round_robin")
    msgs_first = [{"role": "system", "content": ""}, {"role": "user", "content": ""}]
    msgs_follow = [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}]
    msgs_last_assistant = [{"role": "user"}, {"role": "assistant"}]
    hinted = r.route([1], turn=2, messages=msgs_first, now=0.0)
    assert (hinted.first_turn, hinted.turn_source) == (False, "hint")
    assert r.route([1], turn=1, messages=msgs_follow, now=0.0).first_turn is True
    d = r.route([1], messages=msgs_follow, now=0.0)
    assert (d.first_turn, d.turn_source) == (False, "messages")
    assert r.route([1], messages=msgs_first, now=0.0).first_turn is True
    assert r.route([1], messages=msgs_last_assistant, now=0.0).first_turn is True  # only messages before the last
    assert r.route([1], messages=[], now=0.0).turn_source == "messages"
    with pytest.raises(ValueError, match="turn"):
        r.route([1], turn=0, now=0.0)


# --- §5 random numbers ----------------------------------------------------------------------
def test_counter_rng_matches_splitmix64() -> None:
    rng = CounterRng(0)
    assert rng.next_u64() == 0xE220A8397B1DCDAF  # splitmix64's well-known first output for state 0
    seed = 2**64 - 5
    rng = CounterRng(seed)
    assert [rng.next_u64() for _ in range(2)] == [
        splitmix64_mix((seed + GOLDEN) % 2**64),
        splitmix64_mix((seed + 2 * GOLDEN) % 2**64),
    ]
    u = CounterRng(1).uniform()
    assert u == (splitmix64_mix(1 + GOLDEN) >> 11) * 2.0**-53
    assert 0.0 <= u < 1.0


# --- §6 policies on hand-made boards ----------------------------------------------------------
def cand(hit: int = 0, bs: int = 0, waiting: int = 0, queued: int = 0, active: int = 0) -> Candidate:
    return Candidate(local_hit=hit, bs=bs, waiting=waiting, queued=queued, active=active)


def req(n: int, first_turn: bool = False, global_hit: int = 0, block_size: int = 16) -> RouteInput:
    return RouteInput(n=n, global_hit=global_hit, block_size=block_size, first_turn=first_turn)


def first_draw(seed: int = 0) -> int:
    return splitmix64_mix((seed + GOLDEN) % 2**64)


def test_round_robin() -> None:
    cands = [cand(), cand(), cand()]
    assert [round_robin(cands, rr)[0] for rr in range(5)] == [0, 1, 2, 0, 1]
    assert round_robin(cands, 0)[1] == "round-robin"


def test_least_load_single_winner_takes_no_draw() -> None:
    rng = CounterRng(0)
    # 4w + bs: 5, 3, 4
    assert least_load([cand(bs=1, waiting=1), cand(bs=3), cand(bs=4)], rng) == (1, "least-load")
    assert rng.draws == 0


def test_least_load_tie_draws_once() -> None:
    rng = CounterRng(0)
    pos, _ = least_load([cand(bs=2), cand(bs=1), cand(bs=5), cand(bs=1)], rng)
    assert pos == [1, 3][first_draw() % 2]
    assert rng.draws == 1


def test_cache_first_weighted_samples_the_normalised_score() -> None:
    # hit = [0.5, 0]: n0 = [1, 0]; bs = [2, 0]: n1 = [0, 1]; active equal: n2 = [0, 0].
    # p = [0.7, 0.15], sum 0.85; pick 0 iff 0.7 > u * 0.85.
    cands = [cand(hit=100, bs=2, active=7), cand(hit=0, bs=0, active=7)]
    for seed in range(20):
        rng = CounterRng(seed)
        u = (first_draw(seed) >> 11) * 2.0**-53 * (0.7 + 0.15)
        expected = 0 if u < 0.7 else 1
        assert cache_first_weighted(cands, req(200), (0.7, 0.15, 0.15), rng) == (expected, "cache-first: weighted")
        assert rng.draws == 1


def test_cache_first_weighted_zero_sum_is_a_uniform_pick() -> None:
    rng = CounterRng(3)
    pos, _ = cache_first_weighted([cand(), cand(), cand()], req(10), (0.7, 0.15, 0.15), rng)
    assert pos == first_draw(3) % 3
    assert rng.draws == 1
    rng = CounterRng(3)
    assert cache_first_weighted([cand(hit=5)], req(10), (0.7, 0.15, 0.15), rng)[0] == 0
    assert rng.draws == 0  # one candidate: no draw


def test_cache_first_max_hit() -> None:
    rng = CounterRng(0)
    assert cache_first_max_hit([cand(hit=50, bs=3), cand(hit=50, bs=1), cand(hit=10)], rng) == (
        1,
        "cache-first: max-hit",
    )
    assert rng.draws == 0


def test_linear() -> None:
    rng = CounterRng(0)
    # w(q + n - L)/B + a/B with B = 16: (0 + 64)/16 + 160/16 = 14; (32 + 32)/16 + 0 = 4; (0+64)/16 + 16/16 = 5
    cands = [cand(hit=0, active=160), cand(hit=32, queued=32), cand(hit=0, active=16)]
    assert linear(cands, req(64), 1.0, rng) == (1, "linear")
    # w = 0 leaves only the decode term: a/B = 10, 0, 1
    assert linear(cands, req(64), 0.0, rng)[0] == 1


def test_lmetric() -> None:
    rng = CounterRng(0)
    # max(q + n - L, 1) * (bs + 1): 100*10 = 1000, 1000*1 = 1000, 1000*2 = 2000 -> tie of 0 and 1
    cands = [cand(hit=900, bs=9), cand(), cand(bs=1)]
    assert lmetric(cands, req(1000), rng) == ([0, 1][first_draw() % 2], "lmetric")
    # a fully cached prompt still scores max(0, 1) = 1, times its batch
    assert lmetric([cand(hit=10, bs=3), cand(hit=0, bs=0)], req(10), rng)[0] == 0


def test_lpwl() -> None:
    rng = CounterRng(0)
    # q + n - max(L, Gh): 500 + 100 = 600, 0 + 1000 = 1000, 200 + 300 = 500; the batch plays no part
    cands = [cand(hit=900, queued=500), cand(), cand(hit=700, bs=40, queued=200)]
    assert lpwl(cands, req(1000), rng) == (2, "lpwl")
    assert rng.draws == 0
    # a global hit of 800 caps everyone's uncached part at 200: 300 + 100 vs 50 + 200
    assert lpwl([cand(hit=900, queued=300), cand(queued=50)], req(1000, global_hit=800), rng)[0] == 1
    # a tie (1100 each) is broken by one draw
    tied = [cand(queued=100), cand(hit=100, queued=200), cand(queued=500)]
    assert lpwl(tied, req(1000), rng) == ([0, 1][first_draw() % 2], "lpwl")
    assert rng.draws == 1


def test_llmd_prefix_load() -> None:
    # 1,000 tokens in blocks of 16: 992 hashed; 100 blocks of GPU KV = 1,600 tokens.
    # 2*prefix + free KV + inverse queue: 2*0.5 + 0.5 + 4/8 = 2, 0 + 1 + 1 = 2, 2*1 + 0 + 0 = 2
    cands = [cand(hit=496, bs=4, active=800), cand(), cand(hit=992, bs=8, active=1600)]
    rng = CounterRng(0)
    assert llmd_prefix_load(cands, req(1000), 100, rng) == (first_draw() % 3, "llmd-prefix-load")
    # loads 5, 1, 8 and 160 tokens in flight on 1: 1 + 0.5 + 3/7, 0 + 0.9 + 1, 2 + 0 + 0 -> 2
    cands = [cand(hit=496, bs=5, active=800), cand(bs=1, active=160), cand(hit=992, bs=8, active=1600)]
    rng = CounterRng(0)
    assert llmd_prefix_load(cands, req(1000), 100, rng) == (2, "llmd-prefix-load")
    assert rng.draws == 0


def test_dynamo_host_tier() -> None:
    # 100 blocks, the tier holds 80: 120 - (40 + 0.75*40) = 50; 100 - 0.75*80 + 640/16 = 80; 150 - 80 = 70
    cands = [cand(hit=640, bs=1, queued=320), cand(bs=1, active=640), cand(hit=1280, bs=1, queued=800)]
    rng = CounterRng(0)
    assert dynamo_host_tier(cands, req(1600, global_hit=1280), 1.0, rng) == (0, "dynamo-host-tier")
    # without the tier: 80, 140, 70
    assert dynamo_host_tier(cands, req(1600), 1.0, rng)[0] == 2
    assert rng.draws == 0


def test_bailian_top3() -> None:
    # weights 2^35, 2^10, 2^45, 2^5 (loads 1, 0, 0.5, 0.5 around a mean of 0.5): the top three
    # are 2, 0, 1 and the draw u * (2^45 + 2^35 + 2^10) falls on 2 unless u > 2^45 / total
    cands = [cand(hit=900, bs=4), cand(), cand(hit=900, bs=2), cand(hit=100, bs=2)]
    for seed in range(50):
        rng = CounterRng(seed)
        u = (first_draw(seed) >> 11) * 2.0**-53
        total = 2.0**45 + 2.0**35 + 2.0**10
        expected = 2 if u * total < 2.0**45 else (0 if u * total < 2.0**45 + 2.0**35 else 1)
        assert bailian_top3(cands, req(1000), rng) == (expected, "bailian-top3")
        assert rng.draws == 1
    # a single instance takes no draw
    rng = CounterRng(0)
    assert bailian_top3(cands[:1], req(1000), rng) == (0, "bailian-top3")
    assert rng.draws == 0


def windowed(hit: int = 0, bs: int = 0, requests: int = 0, cost_us: int = 0) -> Candidate:
    return Candidate(
        local_hit=hit, bs=bs, waiting=0, queued=0, active=0, recent_requests=requests, recent_cost_us=cost_us
    )


def test_preble() -> None:
    cfg = ReferenceConfig()
    rng = CounterRng(0)
    # 600 of 1,000 held by 1 and 2 (> 0.5): exploit, the fewest windowed requests whatever their cost
    cands = [windowed(100), windowed(600, 3, 5, 1), windowed(600, 3, 4, 9_000_000)]
    assert preble(cands, req(1000), cfg, rng) == (2, "preble: exploit")
    # 500 of 1,000 is not more than half: explore by cost; an empty prompt explores too
    cands = [windowed(500, 0, 0, 7_000_000), windowed(0, 2, 9, 6_900_000)]
    assert preble(cands, req(1000), cfg, rng) == (1, "preble: explore")
    assert preble(cands, req(0), cfg, rng) == (1, "preble: explore")
    # in flight 10 and 1 (9 > 8): only 1 is gated in; the tree's ratio still says exploit (the root)
    cands = [windowed(900, 10), windowed(0, 1, 50, 99_000_000)]
    assert preble(cands, req(1000), cfg, rng) == (1, "preble: exploit")
    assert preble([windowed(900, 9), windowed(0, 1)], req(1000), cfg, rng) == (0, "preble: exploit")
    assert rng.draws == 0
    # a tie is drawn
    assert preble([windowed(), windowed(), windowed()], req(100), cfg, rng) == (first_draw() % 3, "preble: explore")
    assert rng.draws == 1


def test_preble_routed_cost() -> None:
    # one new token of 1,000: 1/1000 * (55 + 0.8) ms / 0.9 + 45 * 0.15 s
    one = 0.001 * ((55.0 / 1000.0 + 0.80 / 1000.0) / 0.9) + 45.0 * 0.15
    assert preble_routed_cost_us(1000, [windowed(500), windowed(999)]) == int(one * 1e6)
    # a cold 12,000-token prompt: linear + attention (not halved) + quadratic, ≈ 11.35 s
    assert 11_000_000 < preble_routed_cost_us(12_000, [windowed()]) < 12_000_000


def test_llmd_session_affinity() -> None:
    rng = CounterRng(0)
    # in flight 2, 4, 3: active 0.5, 0, 0.25; the previous instance adds 1
    cands = [cand(bs=2), cand(bs=4), cand(bs=3)]
    assert llmd_session_affinity(cands, RouteInput(100, 0, 16, False, previous=2), rng) == (2, "llmd-session-affinity")
    assert llmd_session_affinity(cands, req(100), rng) == (0, "llmd-session-affinity")
    assert rng.draws == 0
    # the busiest previous instance (1 + 0) ties an idle one (0 + 1)
    tied = llmd_session_affinity([cand(bs=4), cand()], RouteInput(100, 0, 16, False, previous=0), rng)
    assert tied == (first_draw() % 2, "llmd-session-affinity")


def test_hash_policies_follow_the_documented_formulas() -> None:
    mask = 2**64 - 1
    names = [xxh(name.encode(), 0) for name in ("a", "b", "c")]
    cands = [Candidate(0, 0, 0, 0, 0, name_hash=h) for h in names]
    for key in (0, 1, 2**63, 12345):
        k = splitmix64_mix(key)
        weights = [splitmix64_mix(k ^ h) for h in names]
        got = rendezvous_hash(cands, RouteInput(10, 0, 16, False, hash_key=key), CounterRng(0))
        assert got == (weights.index(max(weights)), "rendezvous-hash")
        # §6 item 15 as an explicit sorted ring: the first node at or after mix(key), wrapping.
        ring = sorted((splitmix64_mix((h + v * GOLDEN) & mask), i) for i, h in enumerate(names) for v in range(1, 161))
        owner = next((i for p, i in ring if p >= k), ring[0][1])
        got = consistent_hash(cands, RouteInput(10, 0, 16, False, hash_key=key), CounterRng(0))
        assert got == (owner, "consistent-hash")
    assert prompt_key([], 5) == splitmix64_mix(5)
    assert prompt_key([7, 9], 40) == splitmix64_mix(9 ^ 40)


def test_power_of_two_draws_a_distinct_pair() -> None:
    cands = [cand(bs=9), cand(bs=1), cand(bs=5)]
    for seed in range(50):
        rng, replay = CounterRng(seed), CounterRng(seed)
        a = replay.below(3)
        b = replay.below(2)
        b += b >= a
        assert power_of_two(cands, rng) == (b if cands[b].bs < cands[a].bs else a, "power-of-two")
        assert rng.draws == 2
    rng = CounterRng(0)
    assert power_of_two([cand(bs=1), cand(bs=1)], rng) == (first_draw() % 2, "power-of-two")
    assert rng.draws == 1, "of two, the second is forced"
    assert power_of_two([cand()], rng)[0] == 0 and rng.draws == 1


def test_vllm_router_cache_aware_branches() -> None:
    cfg = ReferenceConfig()
    rng = CounterRng(0)
    # 100 - 20 > 64 and 100 > 1.5 * 20: imbalanced, the least loaded despite a full match
    cands = [cand(hit=1000, bs=100), cand(bs=20), cand(bs=50)]
    assert vllm_router_cache_aware(cands, req(1000), cfg, rng) == (1, "vllm-router-cache-aware: load balance")
    # balanced; 400 / 1000 > 0.3: the match; 300 / 1000 is not: the least loaded
    cands = [cand(hit=400, bs=9), cand(hit=100, bs=1), cand(bs=4)]
    assert vllm_router_cache_aware(cands, req(1000), cfg, rng) == (0, "vllm-router-cache-aware: cache affinity")
    cands = [cand(hit=300, bs=9), cand(hit=100, bs=1), cand(bs=4)]
    assert vllm_router_cache_aware(cands, req(1000), cfg, rng) == (1, "vllm-router-cache-aware: low match")
    assert rng.draws == 0


def test_session_key_reaches_the_hash_policies() -> None:
    r = router(("a", "b", "c"), policy="rendezvous_hash")
    homes = {r.route(list(range(k, k + 9)), now=0.0, session_key="s-1").instance for k in range(5)}
    assert len(homes) == 1, "a session keeps its instance whatever its prompt"
    assert r.route([1, 2, 3, 4, 5], now=0.0).instance == r.route([1, 2, 3, 4, 5], now=0.0).instance


def test_previous_instance_only_counts_when_live() -> None:
    r = router(("a", "b", "c"), policy="llmd_session_affinity")
    assert r.route([1, 2, 3, 4], now=0.0, previous_instance="c").instance == "c"
    r.remove_instance("b")
    # "b" is gone: no candidate is favoured, the idle "a" wins over "c" (one in flight)
    assert r.route([1, 2, 3, 4], now=0.0, previous_instance="b").instance == "a"


def test_preble_window_ages_out() -> None:
    r = router(("a", "b"), policy="preble", preble_window_s=10.0)
    first = r.route(list(range(40)), now=0.0).instance
    second = r.route(list(range(100, 140)), now=1.0).instance
    assert first != second
    # the follow-up of the first prompt exploits its instance
    assert r.route(list(range(48)), now=2.0).instance == first
    # just before 10 s the first instance's window holds two entries; at 11 s only the cheap follow-up
    assert r.route(list(range(200, 240)), now=9.999).instance == second
    assert r.route(list(range(300, 340)), now=11.0).instance == first


def test_smetric_first_turn_ignores_local_hits() -> None:
    rng = CounterRng(0)
    cfg = ReferenceConfig().v1()
    # (q + c) * (bs + 1) with c = n - Gh + Gh*f = 100: (0+100)*3 = 300 vs (50+100)*1 = 150
    cands = [cand(hit=99, bs=2), cand(hit=0, bs=0, queued=50)]
    assert smetric_policy(cands, req(100, first_turn=True), cfg, rng) == (1, "first-turn: least-loaded")


def test_smetric_follow_up_sticky_evicted_overloaded() -> None:
    rng = CounterRng(0)
    cfg = ReferenceConfig().v1()
    # Home = most local hits; 60 >= 0.5 * 100 and not overloaded -> sticky.
    cands = [cand(hit=10), cand(hit=60, bs=1), cand()]
    assert smetric_policy(cands, req(100), cfg, rng) == (1, "follow-up: sticky")
    # Home keeps only 40 < 50 tokens -> migrate to argmin score: (100-40)*2=120, (100-10)*1=90, 100*1 = 100.
    cands = [cand(hit=10), cand(hit=40, bs=1), cand()]
    assert smetric_policy(cands, req(100), cfg, rng) == (0, "follow-up: migrate (local KV$ evicted)")
    # Home overloaded by queue: q = 20000 > 1.5 * mean(6666.7) + 8192 -> migrate among the others.
    cands = [cand(hit=90, queued=20000), cand(hit=0, bs=1), cand(hit=0, bs=0)]
    assert smetric_policy(cands, req(100), cfg, rng) == (2, "follow-up: migrate (home overloaded)")
    # Overloaded by batch: bs = 20 > 1.5 * mean(7.33) + 4 = 15.
    cands = [cand(hit=90, bs=20), cand(bs=1), cand(bs=1)]
    pos, reason = smetric_policy(cands, req(100), cfg, rng)
    assert reason == "follow-up: migrate (home overloaded)"
    assert pos in (1, 2)


def test_smetric_global_hits_enter_the_cost() -> None:
    rng = CounterRng(0)
    cfg = ReferenceConfig(global_fetch_cost=0.5, min_local_hit_ratio=0.0).v1()
    # cost = (n - max(L, Gh)) + max(Gh - L, 0) * f, n = 100, Gh = 80:
    # L=0: 20 + 40 = 60 -> score 60*(1+1) = 120 ; L=10: 20 + 35 = 55 -> 55*(3+1) = 220 (home, sticky)
    cands = [cand(hit=0, bs=1), cand(hit=10, bs=3)]
    assert smetric_policy(cands, req(100, global_hit=80), cfg, rng) == (1, "follow-up: sticky")
    cfg = ReferenceConfig(global_fetch_cost=0.5, min_local_hit_ratio=0.5).v1()
    assert smetric_policy(cands, req(100, global_hit=80), cfg, rng) == (0, "follow-up: migrate (local KV$ evicted)")


def test_smetric_kv_fit_and_fetch_rule() -> None:
    rng = CounterRng(0)
    # 100 blocks of 16 tokens: 1,600 tokens of KV per instance.
    cfg = ReferenceConfig(local_capacity_blocks=100)
    assert (cfg.smetric_kv_fit, cfg.smetric_migration, cfg.smetric_kv_bound_share) == (True, "fetch", 0.3)  # §21.1
    # Instance 1 is idle by the score but 1,200 tokens in flight leave no room for 1,000.
    cands = [cand(bs=2), cand(active=1200), cand(bs=3)]
    assert smetric_policy(cands, req(1000, first_turn=True), cfg, rng)[0] == 0
    assert smetric_policy(cands, req(1000, first_turn=True), cfg.paper(), rng)[0] == 1
    # The fetch rule: the score decides only where the tier holds the prompt.
    cands = [cand(), cand(hit=9000, bs=12)]
    cfg = ReferenceConfig(smetric_migration="fetch", smetric_migration_margin=0.25)
    assert smetric_policy(cands, req(10_000), cfg, rng) == (1, "follow-up: sticky")
    moved = smetric_policy(cands, req(10_000, global_hit=10_000), cfg, rng)
    assert moved == (0, "follow-up: migrate (cheaper elsewhere)")


def test_smetric_decode_budget_mirrors_the_core() -> None:
    """The core's `the_decode_budget_moves_a_stay_off_a_home_predicted_over_it` case, on the
    reference policy: the gate keeps the follow-up home; the home is predicted at 25 ms a token."""
    from dataclasses import replace

    from smetric.reference.policies import smetric_paper

    rng = CounterRng(0)
    budget = ReferenceConfig(smetric_migration="threshold", smetric_kv_bound_share=0.0, smetric_tpot_budget_s=0.02)
    off = replace(budget, smetric_tpot_budget_s=0.0)
    rate = 10_000.0
    cands = [
        replace(cand(), drain_rate=2 * rate, tpot_s=0.012),
        replace(cand(hit=15_000, bs=5), queued_work=10_000, drain_rate=rate, tpot_s=0.025),
        replace(cand(bs=1), queued_work=40_000, drain_rate=rate, tpot_s=0.015),
    ]
    assert smetric_paper(cands, req(16_000), budget, rng) == (0, "follow-up: migrate (home misses TPOT budget)")
    assert smetric_paper(cands, req(16_000), off, rng) == (1, "follow-up: sticky")
    paced_home = [cands[0], replace(cands[1], tpot_s=0.019), cands[2]]
    assert smetric_paper(paced_home, req(16_000), budget, rng) == (1, "follow-up: sticky")
    nowhere = [replace(cands[0], tpot_s=0.03), cands[1], cands[2]]
    assert smetric_paper(nowhere, req(16_000), budget, rng) == (1, "follow-up: sticky")
    # While the fleet is KV-bound (16,000 of 2 × 16,000 tokens in flight at a 0.5 share), the stay stands.
    bound = replace(budget, smetric_kv_bound_share=0.5, local_capacity_blocks=1_000, smetric_kv_fit=False)
    kv_bound = [cands[0], replace(cands[1], active=16_000), cands[2]]
    assert smetric_paper(kv_bound[:2], req(16_000), bound, rng) == (1, "follow-up: sticky")
    assert smetric_paper([kv_bound[0], replace(kv_bound[1], active=15_999)], req(16_000), bound, rng)[0] == 0


def test_smetric_learned_fetch_cost_mirrors_the_core() -> None:
    """The core's `a_learned_fetch_cost_prices_the_store_hit` case, on the reference policy: a
    store hit at 1.0 a token keeps the follow-up home, a free one moves it; the option off reads
    no cost."""
    from dataclasses import replace

    from smetric.reference.policies import smetric_paper

    rng = CounterRng(0)
    learn = ReferenceConfig(smetric_migration="fetch", smetric_learn_fetch_cost=True)
    home = replace(cand(hit=9_000, bs=2), queued_work=20_000, drain_rate=10_000.0)

    def target(cost: float) -> Candidate:
        return replace(cand(bs=1), drain_rate=10_000.0, fetch_cost=cost)

    assert smetric_paper([home, target(0.0)], req(10_000, global_hit=10_000), learn, rng) == (
        1,
        "follow-up: migrate (cheaper elsewhere)",
    )
    assert smetric_paper([home, target(1.0)], req(10_000, global_hit=10_000), learn, rng) == (0, "follow-up: sticky")
    off = replace(learn, smetric_learn_fetch_cost=False)
    assert smetric_paper([home, target(1.0)], req(10_000, global_hit=10_000), off, rng)[0] == 1


def test_router_ties_consume_draws_in_order() -> None:
    # Two idle instances tie under least_load: the first route draws once, picks by draw 0.
    r = router(("a", "b"), policy="least_load", seed=11)
    assert r.route([1], now=0.0).instance == ["a", "b"][first_draw(11) % 2]


def test_config_is_keyword_only_and_frozen() -> None:
    cfg = ReferenceConfig(local_capacity_blocks=8)
    assert cfg.global_capacity_blocks == 1_048_576
    assert cfg.cache_first_weights == (0.7, 0.15, 0.15)
    with pytest.raises(TypeError):
        ReferenceConfig(0)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        cfg.hash_seed = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="index_mode"):
        ReferenceConfig(index_mode="fuzzy")


# --- §6 item 8: smetric v2, one test per gate branch (the Rust unit tests' cases) ------------
V2 = ReferenceConfig().paper()
N_V2 = 16_000  # budget 1 + 16,000/16,000 = 2 s


def v2_cand(hit: int, bs: int, queued_work: int, rate: float) -> Candidate:
    return Candidate(hit, bs, 0, 0, 0, queued_work, rate)


def v2(cands: list[Candidate], first_turn: bool = False, cfg: ReferenceConfig = V2) -> tuple[int, str]:
    return smetric_v2_policy(cands, RouteInput(N_V2, 0, 16, first_turn), cfg, CounterRng(0))


def test_v2_first_turn_takes_the_least_pending_work_times_batch() -> None:
    cands = [v2_cand(15_000, 2, 40_000, 1e4), v2_cand(0, 4, 1_000, 1e4), v2_cand(0, 1, 20_000, 1e4)]
    assert v2(cands, first_turn=True) == (2, "first-turn: least-loaded")


def test_v2_gate_branches() -> None:
    # Home 1 meets: 10,000 queued + 3,239 own at 10,000/s = 1.3 s <= 2 s.
    assert v2([v2_cand(0, 0, 0, 1e4), v2_cand(15_000, 5, 10_000, 1e4)]) == (1, "follow-up: sticky")
    # Home misses (3.3 s); the idle instance drains 20,000/s: a cold 16K prompt in 1.7 s.
    cands = [v2_cand(0, 0, 0, 2e4), v2_cand(15_000, 5, 30_000, 1e4)]
    assert v2(cands) == (0, "follow-up: migrate (home misses TTFT budget)")
    # Nobody meets: stay home.
    cands = [v2_cand(0, 0, 0, 1e4), v2_cand(15_000, 5, 30_000, 1e4)]
    assert v2(cands) == (1, "follow-up: sticky (no instance meets TTFT budget)")
    # Evicted: the home holds only half the prompt.
    assert v2([v2_cand(0, 1, 0, 2e4), v2_cand(8_000, 0, 0, 2e4)])[1] == "follow-up: migrate (local KV$ evicted)"


def test_v2_drain_rate_is_learned_from_on_prefilled_timing() -> None:
    r = router(("a",), smetric_rule="v2", smetric_drain_min_samples=2, global_capacity_blocks=0)
    for k in range(3):
        d = r.route(list(range(100 * k, 100 * k + 40)), now=float(k))
        # 40 cold tokens: ceil(40 + 40·20/6923) = 41 work units, first token 41 ms later.
        assert r.on_prefilled(d.request_id, now=k + 0.041) is True
    assert r.load("a")["drain_rate"] == 1000.0
