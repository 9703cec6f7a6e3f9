"""The binding contract of ``smetric.Router``: inputs, outputs, errors, lifecycle, threads."""

from __future__ import annotations

import array
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import smetric
from smetric import Router, RouterConfig

NAMES = ["a", "b", "c"]


def make(policy: str = "smetric", **config: Any) -> Router:
    return Router(NAMES, policy=policy, block_size=4, config=RouterConfig(**config))


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_numpy_dtypes_and_lists_agree(dtype: type) -> None:
    tokens = list(range(1000, 1050))
    r = make()
    assert r.hash_tokens(np.array(tokens, dtype=dtype)) == r.hash_tokens(tokens)
    assert r.hash_tokens(tuple(tokens)) == r.hash_tokens(tokens)
    assert len(r.hash_tokens(tokens)) == 50 // 4
    # Non-contiguous views go through the same validation.
    assert r.hash_tokens(np.repeat(np.array(tokens, dtype=dtype), 2)[::2]) == r.hash_tokens(tokens)


@pytest.mark.parametrize("typecode", ["i", "I", "l", "L", "q", "Q"])
def test_any_buffer_of_32_or_64_bit_ints(typecode: str) -> None:
    """array.array and memoryview export the buffer protocol like numpy; each format is read once."""
    tokens = list(range(1000, 1050))
    r = make()
    buf = array.array(typecode, tokens)
    assert buf.itemsize in (4, 8)
    assert r.hash_tokens(buf) == r.hash_tokens(tokens)
    assert r.hash_tokens(memoryview(buf)) == r.hash_tokens(tokens)
    assert r.hash_tokens(memoryview(buf)[::3]) == r.hash_tokens(tokens[::3])
    assert r.route(buf, request_id="x").num_tokens == 50
    assert r.route(np.array(tokens, dtype=np.uint64), request_id="y").num_tokens == 50


def _layouts(tokens: list[int], dtype: type) -> dict[str, Any]:
    """The same ids in each layout a buffer may have: read in place (contiguous, 8-byte aligned)
    or copied (4-byte aligned only, strided)."""
    aligned = np.array(tokens, dtype=dtype)
    assert aligned.ctypes.data % 8 == 0
    shifted = np.zeros(len(tokens) + 1, dtype=dtype)[1:]
    shifted[:] = tokens
    assert shifted.ctypes.data % 8 == 4
    strided = np.repeat(aligned, 2)[::2]
    typecode = "i" if dtype == np.int32 else "I"
    return {"aligned": aligned, "shifted": shifted, "strided": strided, "array": array.array(typecode, tokens)}


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
@pytest.mark.parametrize("block_size", [4, 16, 5, 256])
def test_a_buffer_read_in_place_routes_as_a_list_does(dtype: type, block_size: int) -> None:
    """``route`` and ``query`` read a contiguous, 8-byte-aligned buffer of 4-byte ids in place
    (an even block size up to 128) and copy any other: every layout, tail and block size gives
    the list's hits and decisions. Ids at or above 2^31 are valid uint32 ids."""
    high = 2**31 + 3 if dtype == np.uint32 else 3
    history = [*range(100, 100 + 7 * block_size), high]
    for n in [len(history) - 1, len(history), 1]:
        tokens = history[:n]
        for layout, ids in _layouts(tokens, dtype).items():
            by_list, by_buffer = (Router(NAMES, block_size=block_size, seed=3) for _ in range(2))
            for r in (by_list, by_buffer):
                r.route(history[: 3 * block_size], request_id="warm", now=0.0)
            assert by_buffer.hash_tokens(ids) == by_list.hash_tokens(tokens)
            q_list, q_buf = by_list.query(tokens, now=1.0), by_buffer.query(ids, now=1.0)
            assert (q_buf.local, q_buf.global_hit_tokens, q_buf.deepest_blocks) == (
                q_list.local,
                q_list.global_hit_tokens,
                q_list.deepest_blocks,
            ), (layout, n)
            d_list = by_list.route(tokens, request_id="r", now=1.0)
            d_buf = by_buffer.route(ids, request_id="r", now=1.0)
            assert (d_buf.instance, d_buf.local_hit_tokens, d_buf.prefill_tokens, d_buf.num_tokens) == (
                d_list.instance,
                d_list.local_hit_tokens,
                d_list.prefill_tokens,
                d_list.num_tokens,
            ), (layout, n)


@pytest.mark.parametrize("where", [0, 5, 6, 33, 34])
def test_a_negative_int32_id_is_refused_wherever_it_sits_in_a_buffer_read_in_place(where: int) -> None:
    """In a full block (either id of a word) or the tail: the same error as the list's, and the
    router unchanged."""
    tokens = list(range(1, 36))  # block 4: 8 full blocks, 3 ids of tail
    tokens[where] = -where - 1
    for ids in [tokens, *_layouts(tokens, np.int32).values()]:
        r = make()
        with pytest.raises(smetric.InvalidTokenError) as info:
            r.route(ids)
        assert (info.value.position, info.value.value) == (where, -where - 1)
        with pytest.raises(smetric.InvalidTokenError):
            r.query(ids)
        assert r.stats()["routed"] == 0


def test_a_buffer_written_while_it_is_routed_gives_a_route_or_a_token_error() -> None:
    """A caller that writes the array while another thread routes it (a misuse: the router
    reads the ids without the GIL, as numpy's own functions do) gets, per call, a decision or
    an ``InvalidTokenError`` for a negative id it saw, never a crash. Bounded: 2,000 routes."""
    r = Router(NAMES, block_size=16)
    ids = np.arange(1, 16 * 512 + 1, dtype=np.int32)
    stop = threading.Event()

    def write() -> None:
        k = 0
        while not stop.is_set():
            ids[k % len(ids)] = -1 if k % 3 == 0 else k
            ids[:: 1 + k % 7] += 1
            k += 1

    writer = threading.Thread(target=write)
    writer.start()
    outcomes = {"routed": 0, "refused": 0}
    try:
        for i in range(2000):
            try:
                d = r.route(ids, request_id=i)
            except smetric.InvalidTokenError:
                outcomes["refused"] += 1
            else:
                assert d.num_tokens == len(ids)
                r.on_finished(i)
                outcomes["routed"] += 1
    finally:
        stop.set()
        writer.join()
    assert sum(outcomes.values()) == 2000


@pytest.mark.parametrize("typecode", ["i", "I", "l", "L", "q", "Q"])
def test_an_empty_buffer_is_an_empty_prompt_like_an_empty_list(typecode: str) -> None:
    """An empty ``array`` (no data pointer at all) or numpy array routes as ``[]`` does: an
    empty completions prompt (``""``) must not become a ``BufferError``."""
    r = make()
    empty = array.array(typecode)
    assert r.hash_tokens(empty) == r.hash_tokens([]) == []
    assert r.route(empty, request_id="e").num_tokens == 0
    assert r.route(memoryview(empty), request_id="m").num_tokens == 0
    assert r.route(np.array([], dtype=np.uint32), request_id="n").num_tokens == 0
    with pytest.raises(smetric.UnsupportedDtypeError):
        r.route(array.array("d"))


def test_decision_fields_and_follow_up() -> None:
    # The July paper's form (v1): the smetric+ defaults would move this follow-up (its first turn still
    # queues at home and the tier holds the prefix, so a fetch on an idle instance scores better).
    r = make(**RouterConfig().v1().to_dict())
    first = list(range(40))
    d1 = r.route(first, now=0.0, request_id="req-1")
    assert (d1.first_turn, d1.turn_source, d1.request_id, d1.policy) == (True, "index", "req-1", "smetric")
    assert d1.instance in NAMES and d1.num_tokens == 40 and d1.prefill_tokens == 40
    d2 = r.route([*first, *range(100, 120)], now=1.0)
    assert d2.first_turn is False and d2.instance == d1.instance and d2.reason == "follow-up: sticky"
    assert d2.local_hit_tokens == 40 and isinstance(d2.request_id, int) and d2.request_id >= 2**63
    assert "Decision(instance=" in repr(d2)
    hits = r.query([*first, *range(100, 120)])
    # vLLM recomputes the last token and counts whole blocks only: 14 of the 15 fit in n - 1 = 59.
    assert hits.local[d1.instance] == 56 and hits.global_hit_tokens == 56


def test_turn_sources() -> None:
    r = make()
    assert r.route([1] * 20, turn=3).turn_source == "hint"
    d = r.route([1] * 20, messages=[{"role": "system"}, {"role": "user"}])
    assert (d.first_turn, d.turn_source) == (True, "messages")
    msgs = [{"role": "user"}, {"role": "assistant"}, {"role": "tool", "content": "x"}]
    assert r.route([1] * 20, messages=msgs).first_turn is False


def test_hashes_input() -> None:
    r = make(policy="lmetric")
    d = r.route(hashes=[11, 12, 13], num_tokens=14)
    assert d.num_tokens == 14
    r.on_finished(d.request_id)
    d2 = r.route(hashes=np.array([11, 12, 13, 14], dtype=np.uint64))
    assert d2.instance == d.instance and d2.local_hit_tokens == 12


def test_lifecycle_counters_never_negative() -> None:
    r = make()
    d = r.route(list(range(40)), request_id=7)
    name = d.instance
    assert r.load(name)["batch_size"] == 1 and r.load(name)["waiting"] == 1 and r.load(name)["queued"] == 40
    assert r.on_finished(7) is True  # finish before prefill applies both steps
    assert r.on_finished(7) is False
    assert r.on_prefilled(7) is False
    assert r.on_aborted(12345) is False
    assert {k: r.load(name)[k] for k in ("batch_size", "waiting", "queued", "active")} == dict.fromkeys(
        ("batch_size", "waiting", "queued", "active"), 0
    )
    assert r.stats()["unknown_request_events"] == 3


def test_fleet_changes_and_index_feed() -> None:
    r = make(index_mode="exact")
    chain = r.hash_tokens(list(range(16)))
    r.store_blocks("b", chain)
    assert r.route([*range(16), 1], turn=2).instance == "b"
    r.remove_blocks("b", chain[2:])
    assert r.query(list(range(16))).local["b"] == 8
    r.store_blocks(None, chain, tier="global")
    assert r.query(list(range(16))).global_hit_tokens == 12  # the whole blocks within n - 1 tokens, as vLLM
    assert r.query(list(range(17))).global_hit_tokens == 16
    r.clear("b")
    r.clear(tier="global")
    assert r.query(list(range(16))).local["b"] == 0
    r.add_instance("d")
    r.remove_instance("a")
    r.add_instance("e")
    assert r.instances == ["e", "b", "c", "d"]  # "e" reuses the slot "a" left
    r.update_load("c", running=3, waiting=1, kv_usage=0.5)
    assert r.load("c")["engine_running"] == 3


def test_names_follow_the_fleet_through_churn() -> None:
    # The binding reuses one Python string per instance name: after an instance leaves and
    # another takes its slot, decisions and query keys name the newcomer, never the old string,
    # and thousands of names through one slot keep working (the cache starts over past its bound).
    r = Router(["a", "b"], policy="round_robin")
    assert {r.route([1] * 32).instance for _ in range(4)} == {"a", "b"}
    for k in range(5_000):
        r.remove_instance("a" if k == 0 else f"x{k - 1}")
        r.add_instance(f"x{k}")
        assert {r.route([3] * 32).instance for _ in range(2)} == {f"x{k}", "b"}
    assert r.instances == ["x4999", "b"]
    assert {r.route([2] * 32).instance for _ in range(4)} == {"x4999", "b"}
    assert list(r.query([2] * 32).local) == ["x4999", "b"]
    assert list(r.query([2] * 32).host) == ["x4999", "b"]


@pytest.mark.parametrize(
    "config",
    [
        RouterConfig(),
        # The two forms whose lifecycle calls release the GIL (they may wait behind a long
        # hold: `Router::lifecycle_may_wait`); the default keeps it through them.
        RouterConfig(index_mode="exact", exact_answer_credit=True),
        RouterConfig().paper(),
    ],
    ids=["default", "exact-answer-credit", "decode-mask"],
)
def test_routes_from_many_threads(config: RouterConfig) -> None:
    r = Router([f"i{k}" for k in range(8)], policy="smetric", config=config)
    prompts = [np.arange(k * 1000, k * 1000 + 4096, dtype=np.int32) for k in range(8)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(200):
                d = r.route(prompts[k])
                r.on_prefilled(d.request_id)
                r.on_finished(d.request_id, 10)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = r.stats()
    assert stats["routed"] == 800 and stats["in_flight"] == 0
    for name in r.instances:
        assert r.load(name)["batch_size"] == 0


# ---- the bad-input table: every row raises the documented exception and changes nothing ----

BAD_INPUT: list[tuple[str, Any, type[smetric.SmetricError], dict[str, Any]]] = [
    ("negative token (list)", lambda r: r.route([1, -2]), smetric.InvalidTokenError, {"position": 1, "value": -2}),
    ("token >= 2^32 (list)", lambda r: r.route([2**32]), smetric.InvalidTokenError, {"position": 0, "value": 2**32}),
    (
        "negative token (int64)",
        lambda r: r.route(np.array([5, 6, -1], dtype=np.int64)),
        smetric.InvalidTokenError,
        {"position": 2, "value": -1},
    ),
    (
        "token >= 2^32 (int64)",
        lambda r: r.route(np.array([2**32 + 5], dtype=np.int64)),
        smetric.InvalidTokenError,
        {"position": 0, "value": 2**32 + 5},
    ),
    (
        "negative token (int32)",
        lambda r: r.route(np.array([-7], dtype=np.int32)),
        smetric.InvalidTokenError,
        {"value": -7},
    ),
    (
        "negative token (int32, in a full block read in place)",
        lambda r: r.route(np.array([1, 2, 3, 4, 5, -6, 7, 8, 9], dtype=np.int32)),
        smetric.InvalidTokenError,
        {"position": 5, "value": -6},
    ),
    (
        "token >= 2^32 (uint64)",
        lambda r: r.route(np.array([1, 2, 3, 2**40], dtype=np.uint64)),
        smetric.InvalidTokenError,
        {"position": 3, "value": 2**40},
    ),
    (
        "negative token (array.array 'q', strided memoryview)",
        lambda r: r.route(memoryview(array.array("q", [4, 0, -9, 5]))[::2]),
        smetric.InvalidTokenError,
        {"position": 1, "value": -9},
    ),
    ("float32 array", lambda r: r.route(np.zeros(4, dtype=np.float32)), smetric.UnsupportedDtypeError, {}),
    ("array.array of doubles", lambda r: r.route(array.array("d", [1.0])), smetric.UnsupportedDtypeError, {}),
    ("bytes", lambda r: r.route(b"\x01\x02"), smetric.UnsupportedDtypeError, {}),
    ("int16 array", lambda r: r.route(np.zeros(4, dtype=np.int16)), smetric.UnsupportedDtypeError, {}),
    ("list of str", lambda r: r.route(["a", "b"]), smetric.UnsupportedDtypeError, {}),
    ("no prompt", lambda r: r.route(), smetric.MissingPromptError, {}),
    ("turn 0", lambda r: r.route([1], turn=0), smetric.InvalidArgumentError, {"argument": "turn"}),
    ("negative now", lambda r: r.route([1], now=-1.0), smetric.InvalidArgumentError, {"argument": "now"}),
    ("bad request id", lambda r: r.route([1], request_id=-5), smetric.InvalidArgumentError, {"argument": "request_id"}),
    ("message without role", lambda r: r.route([1], messages=[{}]), smetric.InvalidArgumentError, {}),
    ("unknown instance (load)", lambda r: r.update_load("zz", running=1), smetric.UnknownInstanceError, {"name": "zz"}),
    ("unknown instance (remove)", lambda r: r.remove_instance("zz"), smetric.UnknownInstanceError, {"name": "zz"}),
    ("unknown instance (store)", lambda r: r.store_blocks("zz", [1]), smetric.UnknownInstanceError, {"name": "zz"}),
    ("duplicate instance", lambda r: r.add_instance("a"), smetric.DuplicateInstanceError, {"name": "a"}),
    ("bad tier", lambda r: r.store_blocks("a", [1], tier="gpu"), smetric.InvalidArgumentError, {"argument": "tier"}),
    ("local tier without name", lambda r: r.store_blocks(None, [1]), smetric.InvalidArgumentError, {}),
    ("kv usage > 1", lambda r: r.update_load("a", kv_usage=2.0), smetric.InvalidArgumentError, {}),
    ("empty instance list", lambda r: Router([]), smetric.NoInstancesError, {}),
    ("duplicate names", lambda r: Router(["x", "x"]), smetric.DuplicateInstanceError, {"name": "x"}),
    ("block_size=0", lambda r: Router(["x"], block_size=0), smetric.InvalidBlockSizeError, {"block_size": 0}),
    ("block_size<0", lambda r: Router(["x"], block_size=-3), smetric.InvalidBlockSizeError, {}),
    ("unknown policy", lambda r: Router(["x"], policy="fastest"), smetric.UnknownPolicyError, {"name": "fastest"}),
    (
        "zero capacity",
        lambda r: RouterConfig(local_capacity_blocks=0),
        smetric.InvalidConfigError,
        {"field": "local_capacity_blocks"},
    ),
    ("bad index mode", lambda r: RouterConfig(index_mode="magic"), smetric.InvalidConfigError, {"field": "index_mode"}),
    ("negative ttl", lambda r: RouterConfig(local_ttl_s=-1.0), smetric.InvalidConfigError, {"field": "local_ttl_s"}),
    ("nan weight", lambda r: RouterConfig(global_fetch_cost=float("nan")), smetric.InvalidConfigError, {}),
]


@pytest.mark.parametrize(("case", "call", "exc", "attrs"), BAD_INPUT, ids=[row[0] for row in BAD_INPUT])
def test_bad_input_table(case: str, call: Any, exc: type[Exception], attrs: dict[str, Any]) -> None:
    r = make()
    r.route(list(range(12)), request_id=1)
    before = (r.stats(), [r.load(n) for n in r.instances], r.instances)
    with pytest.raises(exc) as info:
        call(r)
    assert isinstance(info.value, smetric.SmetricError) and isinstance(info.value, ValueError)
    for key, value in attrs.items():
        assert getattr(info.value, key) == value, case
    assert (r.stats(), [r.load(n) for n in r.instances], r.instances) == before, "a failed call changed the router"


def test_config_defaults_match_the_documented_table() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "routing-semantics.md").read_text()
    table = doc[doc.index("## 9.") :]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", table, flags=re.M))
    config = RouterConfig().to_dict()
    assert set(rows) == set(config)
    for field, text in rows.items():
        expected = eval(text.replace("_", "") if text[0].isdigit() else text)  # literals of the table
        assert config[field] == expected, field


@pytest.mark.parametrize("impl", ["rust", "reference"])
@pytest.mark.parametrize("policy", ["least_load", "smetric", "lmetric"])
def test_peer_load_is_added_to_the_board_the_policies_read(impl: str, policy: str) -> None:
    from smetric.reference import ReferenceRouter

    cls: Any = Router if impl == "rust" else ReferenceRouter
    r = cls(NAMES, policy=policy, block_size=4)
    peers = {"batch_size": 6, "waiting": 6, "queued": 40_000, "queued_work": 60_000, "active": 40_000}
    for name in ("a", "b"):
        r.set_peer_load(name, **peers)
    assert r.peer_load("a") == peers and r.peer_load("c") == dict.fromkeys(peers, 0)
    # Idle boards of their own, but peers' work on a and b: a first turn goes to c.
    assert r.route(list(range(100, 140)), turn=1).instance == "c"
    assert r.load("a")["batch_size"] == 0, "the router's own counters never hold peers' work"
    for name in ("a", "b"):
        r.set_peer_load(name)  # replaced whole: back to nothing
    assert r.peer_load("a") == dict.fromkeys(peers, 0)
    with pytest.raises(ValueError, match="nope") as err:
        r.set_peer_load("nope", batch_size=1)
    assert type(err.value).__name__ == "UnknownInstanceError"
