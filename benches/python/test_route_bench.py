"""pytest-benchmark of ``Router.route()`` from Python (FFI included), per policy, input kind
and prompt size, and of the plain-Python reference on the same calls.

Run the measurements: ``pytest benches/python --benchmark-enable --benchmark-only``
(``make bench``). Under the default options (``--benchmark-disable``) every case runs once,
which is how CI checks that the benchmarks still work. Latency percentiles and the speed-up
table come from ``benches/python/route_latency.py``; figures are in BENCHMARKS.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from smetric import POLICIES, Router
from smetric.reference import ReferenceRouter

INSTANCES = [f"gpu-{i}" for i in range(32)]
SIZES = {"1K": 1_024, "32K": 32_768}


def warm(router: Any, size: int) -> np.ndarray:
    """Routes 64 sessions sharing a system prompt; returns one session's follow-up prompt."""
    rng = np.random.default_rng(1)
    system = rng.integers(0, 151_936, min(4_096, size // 2), dtype=np.int32)
    prompts = [
        np.concatenate([system, rng.integers(0, 151_936, size - len(system), dtype=np.int32)]) for _ in range(64)
    ]
    for p in prompts:
        router.on_finished(router.route(p if isinstance(router, Router) else p.tolist()).request_id)
    return prompts[7]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("kind", ["numpy", "list"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_route(benchmark: Any, policy: str, kind: str, size: str) -> None:
    router = Router(INSTANCES, policy=policy)
    prompt = warm(router, SIZES[size])
    arg: Any = prompt if kind == "numpy" else prompt.tolist()

    def one() -> None:
        router.on_finished(router.route(arg).request_id)

    benchmark(one)


@pytest.mark.parametrize("size", list(SIZES))
def test_reference_route(benchmark: Any, size: str) -> None:
    router = ReferenceRouter(INSTANCES, policy="smetric")
    prompt = warm(router, SIZES[size]).tolist()

    def one() -> None:
        router.on_finished(router.route(prompt).request_id)

    benchmark(one)
