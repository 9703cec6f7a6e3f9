"""The real engines' ports: picked where no kernel-assigned port can land, each once.

A CI run lost its real-vLLM suite when an engine's replay port, picked by binding port 0, was
taken by another socket in the ≈ 20 s before the engine bound it (``scripts/vllm_cpu/fleet.py``)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))

import fleet  # noqa: E402


def test_ports_are_picked_below_the_ephemeral_range_and_never_twice() -> None:
    low = fleet.ephemeral_low()
    ports = [fleet.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(fleet.LOWEST_PICKED_PORT <= p < low for p in ports)


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    # A range of one port, and that one taken: nothing to hand out.
    monkeypatch.setattr(fleet, "ephemeral_low", lambda *_: fleet.LOWEST_PICKED_PORT + 1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", fleet.LOWEST_PICKED_PORT))
        with pytest.raises(RuntimeError, match="no free loopback port"):
            fleet.free_port()


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert fleet.ephemeral_low(f) == 40000
    assert fleet.ephemeral_low(tmp_path / "missing") == 32768


def test_a_failed_engines_error_names_the_root_cause_above_the_tail(tmp_path: Path) -> None:
    engine = fleet.Engine(model=tmp_path, workdir=tmp_path, core=0)
    cause = "(EngineCore pid=7) ERROR 12-08 01:04:13 [core.py:1510] zmq.error.ZMQError: Address already in use"
    noise = "(APIServer pid=6) WARNING [system_utils.py:255] This can cause `OSError: [Errno 24] Too many open files`"
    engine.log_path.write_text("\n".join([noise, cause, *[f"traceback line {i}" for i in range(50)]]) + "\n")
    tail = engine.log_tail(5)
    assert tail.splitlines()[0] == f"first error: {cause}"
    assert tail.endswith("traceback line 49")
    engine.log_path.write_text("\n".join([noise, "all fine"]) + "\n")
    assert "first error" not in engine.log_tail(5)
