"""``smetric.PdRouter``: the binding of the PD router the proxy's PD mode calls."""

from __future__ import annotations

import pytest

import smetric
from smetric import DECODE_RULES, DecodeLoad, PdRouter, PdRouterStats
from smetric.errors import DuplicateInstanceError, InvalidConfigError, NoInstancesError, UnknownInstanceError


def test_route_names_both_instances_and_the_lifecycle_balances() -> None:
    r = PdRouter(["p0", "p1"], ["d0", "d1"], block_size=4, seed=1)
    assert r.policy == "smetric" and r.decode_rule == "kv_fit"
    assert r.prefill_instances == ["p0", "p1"] and r.decode_instances == ["d0", "d1"]
    turn1 = list(range(40))
    d1 = r.route(turn1, messages=[{"role": "user", "content": "hi"}], request_id="a", now=0.0)
    assert d1.prefill_instance in ("p0", "p1") and d1.decode_instance in ("d0", "d1")
    assert d1.first_turn and d1.turn_source == "messages" and d1.request_id == "a"
    assert (d1.transfer_tokens, d1.decode_hit_tokens, d1.num_tokens) == (40, 0, 40)
    assert r.load(d1.prefill_instance)["queued"] == 40
    assert r.decode_load(d1.decode_instance)["pulling"] == 1
    assert r.on_prefilled("a") and r.load(d1.prefill_instance)["queued"] == 0
    assert r.on_transferred("a") and r.load(d1.prefill_instance)["batch_size"] == 0
    assert r.decode_load(d1.decode_instance)["pulling"] == 0
    assert r.on_finished("a", 7) and not r.on_finished("a", 7)
    d2 = r.route([*turn1, *range(100, 140)], turn=2, request_id=2, now=1.0)
    assert not d2.first_turn and d2.prefill_instance == d1.prefill_instance
    assert d2.decode_instance == d1.decode_instance and d2.decode_hit_tokens == 40
    assert r.on_aborted(2)
    s = r.stats()
    assert set(s) == set(PdRouterStats.__required_keys__)
    assert all(set(v) == set(DecodeLoad.__required_keys__) for v in s["decode"].values())
    assert s["routed"] == 2 and s["in_flight"] == 0 and s["output_tokens"] == 7
    assert all(v["batch_size"] == 0 and v["reserved_blocks"] == 0 for v in s["decode"].values())
    assert "PdDecision(" in repr(d2) and "PdRouter(" in repr(r)


def test_peer_forms_and_options() -> None:
    assert DECODE_RULES == ("kv_fit", "least_batch", "power_of_two", "round_robin")
    assert PdRouter(["p"], ["d"], policy="lmetric").decode_rule == "power_of_two"
    assert PdRouter(["p"], ["d"], policy="round_robin").decode_rule == "round_robin"
    r = PdRouter(["p"], ["d0", "d1"], decode_rule="round_robin", decode_capacity_blocks=64)
    assert [r.route(list(range(32)), now=float(k)).decode_instance for k in range(3)] == ["d0", "d1", "d0"]
    r.update_decode_load("d1", 0.5, now=0.0)
    assert r.decode_load("d1")["kv_usage"] == 0.5
    r.update_load("p", running=3, now=0.0)
    assert r.load("p")["engine_running"] == 3
    with pytest.raises(UnknownInstanceError):
        r.update_decode_load("p", 0.5)
    with pytest.raises(NoInstancesError):
        PdRouter(["p"], [])
    with pytest.raises(DuplicateInstanceError):
        PdRouter(["x"], ["x"])
    with pytest.raises(InvalidConfigError):
        PdRouter(["p"], ["d"], decode_rule="nope")  # type: ignore[arg-type]
    assert not r.on_finished(12345)
    assert smetric.PdRouter is PdRouter
