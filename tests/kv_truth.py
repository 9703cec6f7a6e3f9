"""Helpers shared by the KV-event tests: captures, ground truth checks, bounded waiting."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smetric import Router, RouterConfig

DATA = Path(__file__).parent / "data" / "vllm"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name).read_text())
    return doc


def frames(message: list[str]) -> list[bytes]:
    return [bytes.fromhex(f) for f in message]


def exact_router(instances: list[str], block_size: int = 16) -> Router:
    return Router(instances, block_size=block_size, config=RouterConfig(index_mode="exact"))


def mismatches(router: Router, instance: str, truth: dict[str, Any]) -> list[str]:
    """How the router's view of ``instance`` differs from vLLM's block pool (empty = equal)."""
    b = router.block_size
    out = []
    for i, probe in enumerate(truth["probes"]):
        chain = router.hash_tokens(probe["tokens"], namespace=probe["lora"])
        hit = router.query(hashes=chain, num_tokens=len(chain) * b + 1).local[instance] // b
        if hit != probe["cached_blocks"]:
            out.append(f"probe {i}: smetric {hit} blocks, vLLM {probe['cached_blocks']}")
    held = router.stats()["index_local_blocks"][instance]
    if held != truth["cached_blocks_total"]:
        out.append(f"index holds {held} blocks, vLLM caches {truth['cached_blocks_total']}")
    return out


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Polls ``predicate`` until it holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
