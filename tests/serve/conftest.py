"""Fixtures shared by the proxy's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from smetric.fake_engine import FakeEngine


@pytest.fixture
def fleet() -> Iterator[list[FakeEngine]]:
    """Two fake engines with KV events, 1000x faster than the modelled hardware."""
    engines = [FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=1000).start() for _ in range(2)]
    yield engines
    for e in engines:
        e.stop()
