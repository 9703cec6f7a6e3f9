"""Fixtures shared by the proxy's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from smetric.fake_engine import FakeEngine


@pytest.fixture
def fleet() -> Iterator[list[FakeEngine]]:
    """Two fake engines with KV events, 1000x faster than the modelled hardware."""
    engines = [FakeEngine(port=0, kv_events_port=0, kv_replay_port=0, speedup=1000).start() for _ in range(2)]
    yield engines
    for e in engines:
        e.stop()


@pytest.fixture(autouse=True)
def data_plane(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """``SMETRIC_TEST_DATA_PLANE=python`` (or ``compiled``): every in-process proxy of these tests
    runs on that data plane instead of the configured one (the default is ``auto``: compiled
    where the gateway serves natively), but in tests marked ``own_data_plane``. ``make test``
    runs the suite on the default and on python."""
    import dataclasses
    import os

    import smetric.serve.proxy as proxy

    plane = os.environ.get("SMETRIC_TEST_DATA_PLANE")
    if not plane or request.node.get_closest_marker("own_data_plane") is not None:
        return
    run = proxy.run

    async def run_with(config: Any, **kwargs: Any) -> None:
        await run(dataclasses.replace(config, data_plane=plane), **kwargs)

    monkeypatch.setattr(proxy, "run", run_with)
