"""The typed results: each ``TypedDict`` of ``smetric._types`` has exactly the keys the core returns,
each ``Literal`` exactly the core's values, and ``mypy --strict`` sees them (a wrong key is an error).

The simulator's report types are tied in ``tests/sim/test_report_types.py``.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any, get_args, is_typeddict

import pytest

import smetric
from smetric import POLICIES, Router, RouterConfig
from smetric._core import KvEventIngestor
from smetric._types import (
    CacheFirstMode,
    IndexMode,
    IngestSourceStats,
    IngestStats,
    InstanceLoad,
    PolicyName,
    Reason,
    RouterConfigFields,
    RouterStats,
    TurnSource,
)
from smetric.events import KvEventSubscriber
from smetric.vllm import HASH_ALGOS, HashAlgo


def keys(typed: Any) -> set[str]:
    """Every key a ``TypedDict`` declares, required or not."""
    assert is_typeddict(typed)
    return set(typed.__required_keys__ | typed.__optional_keys__)


def routed_router() -> Router:
    router = Router(["a", "b"], policy="smetric")
    d = router.route(list(range(64)), request_id=1, now=0.0)
    router.on_prefilled(d.request_id)
    return router


def test_router_results_have_the_declared_keys() -> None:
    router = routed_router()
    assert set(router.stats()) == keys(RouterStats)
    assert set(router.load("a")) == keys(InstanceLoad)
    assert set(router.config.to_dict()) == keys(RouterConfigFields)
    assert RouterConfig(**router.config.to_dict()) == router.config


def test_router_literals_are_the_cores_values() -> None:
    assert get_args(PolicyName) == POLICIES == smetric.POLICIES
    assert tuple(routed_router().stats()["reasons"]) == get_args(Reason), "every reason, in the core's order"
    for mode in get_args(IndexMode):
        assert RouterConfig(index_mode=mode).index_mode == mode
    for mode in get_args(CacheFirstMode):
        assert RouterConfig(cache_first_mode=mode).cache_first_mode == mode
    with pytest.raises(smetric.InvalidConfigError):
        RouterConfig(index_mode="fuzzy")  # type: ignore[arg-type]
    router = Router(["a"])
    sources = {
        router.route(list(range(32))).turn_source,
        router.route(list(range(32)), turn=2).turn_source,
        router.route(list(range(32)), messages=[{"role": "user"}]).turn_source,
    }
    assert sources == set(get_args(TurnSource))
    assert get_args(HashAlgo) == HASH_ALGOS


def test_ingestor_results_have_the_declared_keys() -> None:
    ingestor = KvEventIngestor(Router(["a"]))
    source = ingestor.add_source("a")
    step = ingestor.on_message(source, [b"", (0).to_bytes(8, "big"), b"\xc1"])
    assert (step.replay_from, step.replay_done) == (None, False) and step.error
    assert "IngestStep(replay_from=None, replay_done=False, error=" in repr(step)
    assert set(ingestor.stats()) == keys(IngestStats)
    assert set(ingestor.stats(source)) == keys(IngestSourceStats)
    assert ingestor.stats(source)["decode_errors"] == sum(ingestor.stats(source)["decode_errors_by_kind"].values()) == 1


def test_ingest_defaults_are_defined_once() -> None:
    """The subscriber's keyword defaults are the binding's, which are the Rust core's
    ``IngestConfig::DEFAULT`` (the binding's signature reads it)."""
    assert KvEventIngestor.DEFAULT_MAX_MAPPED_BLOCKS > 0 and KvEventIngestor.DEFAULT_MAX_PENDING_BATCHES > 0
    params = inspect.signature(KvEventSubscriber).parameters
    assert params["max_mapped_blocks"].default == KvEventIngestor.DEFAULT_MAX_MAPPED_BLOCKS
    assert params["max_pending_batches"].default == KvEventIngestor.DEFAULT_MAX_PENDING_BATCHES


_USAGE = """
    from smetric import Reason, Router
    from smetric._core import KvEventIngestor

    router = Router(["a"])
    routed: int = router.stats()["routed"]
    reasons: dict[Reason, int] = router.stats()["reasons"]
    labels: list[str] = list(reasons)
    batch: int = router.load("a")["batch_size"]
    usage: float = router.load("a")["kv_usage"]
    held: int = KvEventIngestor(router).stats()["held_local_blocks"]
    replay_from: int | None = KvEventIngestor(router).on_replay_failed(0).replay_from
"""

_MISTAKES = {
    'router.stats()["routd"]': 'TypedDict "RouterStats" has no key "routd"',
    'router.load("a")["bs"]': 'TypedDict "InstanceLoad" has no key "bs"',
    'KvEventIngestor(router).stats(0)["held_local_blocks"]': 'has no key "held_local_blocks"',
    'Router(["a"], policy="fastest")': "incompatible type \"Literal['fastest']\"",
    'router.store_blocks("a", [1], tier="gpu")': "incompatible type \"Literal['gpu']\"",
    'x: str = router.stats()["routed"]': "Incompatible types in assignment",
}


def test_mypy_strict_sees_the_result_types(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    good = tmp_path / "good.py"
    good.write_text(textwrap.dedent(_USAGE))
    bad = tmp_path / "bad.py"
    lines = [f"{statement}  # mistake {i}" for i, statement in enumerate(_MISTAKES)]
    bad.write_text(textwrap.dedent(_USAGE) + "\n".join(lines) + "\n")
    cache = ["--cache-dir", str(tmp_path / ".mypy_cache")]
    out, err, status = api.run(["--strict", *cache, str(good)])
    assert status == 0, out + err
    out, err, status = api.run(["--strict", *cache, str(bad)])
    assert status == 1, out + err
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == len(_MISTAKES), out
    for message in _MISTAKES.values():
        assert message in out, (message, out)
