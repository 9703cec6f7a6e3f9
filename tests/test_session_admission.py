"""The binding of the core's session-admission stage: verdicts, the negative control (pause holds
where smetric moves), the bounded table, bad input, and calls from several threads."""

from __future__ import annotations

import threading

import pytest

from smetric import InvalidConfigError, SessionAdmission

CAP = 100_000


def stage(mode: str, instances: int = 3) -> SessionAdmission:
    return SessionAdmission(instances, mode=mode, capacity_tokens=CAP, output_reserve_tokens=0)


def test_pause_holds_and_smetric_moves_to_the_cheapest_instance_with_room() -> None:
    for mode, want in (("pause", ("hold", 0, 0)), ("smetric", ("elsewhere", 2, 0))):
        s = stage(mode)
        assert s.decide(1, 0, 60_000, 0.0) == ("admit", 0, 0)
        assert s.decide(2, 0, 60_000, 1.0, costs=[20_000.0, 60_000.0, 10_000.0]) == want
        assert s.mode == mode
    # Off admits everything and keeps nothing.
    off = stage("off")
    assert [off.decide(k, 0, 90_000, 0.0)[0] for k in range(5)] == ["admit"] * 5
    assert off.working_set(0, 0.0) == 0


def test_a_finished_session_is_idle_and_paused_for_a_newcomer() -> None:
    s = stage("pause", 1)
    s.decide(1, 0, 60_000, 0.0)
    assert s.decide(2, 0, 60_000, 1.0)[0] == "hold"
    s.on_finished(1, 0, 61_000, 2.0)
    assert s.working_set(0, 2.0) == 61_000
    assert s.decide(2, 0, 60_000, 2.0) == ("admit", 0, 1)
    assert s.counters() == {"admitted": 2, "moved": 0, "held": 1, "released": 0, "paused": 1}
    assert s.working_set(7, 2.0) == 0  # a slot out of range holds nothing


def test_a_bounded_hold_admits_at_the_policys_instance_once_it_ran_out() -> None:
    s = SessionAdmission(1, mode="smetric", capacity_tokens=CAP, output_reserve_tokens=0, max_hold_s=2.0)
    assert s.decide(1, 0, 60_000, 0.0) == ("admit", 0, 0)
    assert s.decide(2, 0, 60_000, 0.5) == ("hold", 0, 0)
    assert s.release_at(0.5) == 2.5
    assert s.decide(2, 0, 60_000, 2.4, held_since=0.5) == ("hold", 0, 0)
    assert s.decide(2, 0, 60_000, 2.5, held_since=0.5) == ("admit", 0, 0)
    assert s.counters()["released"] == 1
    assert s.working_set(0, 2.5) == 120_000  # admitted over capacity: both in flight
    # Pause is ThunderAgent's form: it never gives up holding by default.
    pause = SessionAdmission(1, mode="pause", capacity_tokens=CAP, output_reserve_tokens=0)
    assert pause.release_at(0.0) is None
    pause.decide(1, 0, 60_000, 0.0)
    assert pause.decide(2, 0, 60_000, 1e9, held_since=0.0)[0] == "hold"


def test_bad_config_raises_invalid_config() -> None:
    with pytest.raises(InvalidConfigError):
        SessionAdmission(2, mode="thunder", capacity_tokens=CAP)
    with pytest.raises(InvalidConfigError):
        SessionAdmission(2, mode="pause", capacity_tokens=CAP, idle_window_s=float("nan"))
    for bad in (-1.0, float("nan")):
        with pytest.raises(InvalidConfigError):
            SessionAdmission(2, mode="smetric", capacity_tokens=CAP, max_hold_s=bad)


def test_decides_from_many_threads() -> None:
    s = SessionAdmission(4, mode="smetric", capacity_tokens=CAP, max_sessions_per_instance=8)

    def work(base: int) -> None:
        for k in range(200):
            verdict, instance, _ = s.decide(base + k, k % 4, 1_000, float(k), costs=[0.0] * 4)
            if verdict != "hold":
                s.on_finished(base + k, instance, 1_500, float(k) + 0.5)

    threads = [threading.Thread(target=work, args=(t * 1_000,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(s.counters().values()) >= 800
    assert all(s.working_set(i, 200.0) <= 8 * 1_500 for i in range(4))
