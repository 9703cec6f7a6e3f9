"""vllm-router's learned rate behind `vllm_router_smetric`: no rate means feasible; 8 first-token
samples through the lifecycle publish one (both the core and the plain-Python reference)."""

from __future__ import annotations

from typing import Any

import pytest

import smetric
from smetric.reference import ReferenceConfig, ReferenceRouter

BUILDERS: dict[str, tuple[Any, Any]] = {
    "core": (smetric.Router, smetric.RouterConfig),
    "reference": (ReferenceRouter, ReferenceConfig),
}


def follow_up_reason(kind: str, samples: int, policy: str = "vllm_router_smetric", **config: Any) -> str:
    """The reason of a follow-up on a one-instance fleet after `samples` first-token reports,
    with a TTFT budget of 0 s (met only by an instance without a rate)."""
    router_cls, config_cls = BUILDERS[kind]
    zero_budget = config_cls(smetric_ttft_base_s=0.0, smetric_ttft_s_per_token=0.0, **config)
    r = router_cls(["a"], policy=policy, block_size=16, seed=0, config=zero_budget)
    for k in range(samples):
        d = r.route(list(range(1000 * k, 1000 * k + 512)), now=float(k))
        r.on_prefilled(d.request_id, now=float(k) + 0.5)
        r.on_finished(d.request_id, 10)
    home = r.route(list(range(0, 512)), now=50.0)  # session 0's first turn again: its home
    r.on_finished(home.request_id, 1)
    return str(r.route([*range(0, 512), *([7] * 64)], now=60.0, turn=2).reason)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_no_rate_is_feasible_until_eight_samples(kind: str) -> None:
    # Without a learned rate the instance meets even a zero budget: the follow-up sticks.
    assert follow_up_reason(kind, 0) == "follow-up: sticky"
    assert follow_up_reason(kind, 7) == "follow-up: sticky"
    # The eighth sample publishes a rate: a zero budget is missed, by the only instance there is.
    assert follow_up_reason(kind, 8) == "follow-up: sticky (no instance meets TTFT budget)"
    # Our v2 rule has a fallback rate from the start: it misses the zero budget with no sample.
    ours = follow_up_reason(kind, 0, "smetric", smetric_rule="v2", smetric_migration="threshold", smetric_kv_fit=False)
    assert ours == "follow-up: sticky (no instance meets TTFT budget)"
