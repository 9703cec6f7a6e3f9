"""``smetric_paper`` in the simulator: the authors' shipped co-located configuration (the decode
mask in its honest and oracle forms) runs on the core placer, which feeds the mask its signals
(the lifecycle calls; for the oracle, each request's recorded output length), and its mask binds;
``smetric_v2_port`` keeps the port without it."""

from __future__ import annotations

from typing import Any

import pytest

from smetric import RouterConfig
from smetric.sim import RunSpec, SimulationConfig, TraceSpec, Window, run_one
from smetric.sim.config import POLICY_VARIANTS, embedded_trace_path

UNSAFE = "follow-up: migrate (home would break a live decode)"


def _run(policy: str, **router: Any) -> dict[str, Any]:
    config = SimulationConfig(instances=4)
    if router:
        config = config.with_router(**router)
    spec = RunSpec(
        trace=TraceSpec(paths=(str(embedded_trace_path()),), format="weka"),
        config=config,
        window=Window(duration_s=600.0, warmup_s=60.0, max_think_s=60.0),
        policy=policy,
        load=0.2,
        seed=3,
    )
    reasons: dict[str, int] = run_one(spec).metrics["reasons"]
    return reasons


def test_variants_name_the_shipped_configuration_and_the_port() -> None:
    assert POLICY_VARIANTS["smetric_paper"][1]["smetric_decode_mask"] == "honest"
    assert POLICY_VARIANTS["smetric_paper"][1]["smetric_store_pricing"] is False
    assert POLICY_VARIANTS["smetric_v2_port"][1]["smetric_decode_mask"] == "off"
    assert POLICY_VARIANTS["smetric_v2_port"][1]["smetric_drain_rate"] is None


@pytest.mark.parametrize("mask", ["honest", "oracle"])
def test_the_mask_binds_in_both_forms_and_not_when_off(mask: str) -> None:
    shipped = {k: v for k, v in RouterConfig().paper().to_dict().items() if k.startswith("smetric_")}
    masked = _run("smetric", **(shipped | {"smetric_decode_mask": mask}))
    assert masked.get(UNSAFE, 0) > 0, masked
    unmasked = _run("smetric", **(shipped | {"smetric_decode_mask": "off"}))
    assert UNSAFE not in unmasked, unmasked
    assert _run("smetric_v2_port").get(UNSAFE, 0) == 0
