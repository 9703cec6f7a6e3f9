"""Two real CPU vLLM engines shared by the whole session (``scripts/vllm_cpu/fleet.py``).

The engines come from the venv ``make test`` builds (``scripts/vllm_cpu/venv.sh``,
``.venv-vllm``; ``SMETRIC_VLLM_VENV`` names another). Without it the tests skip locally with the
reason, and fail in CI (``CI=true``): CI must never pass by skipping them. Each engine takes
≈ 3 GB and ≈ 30 s to start, so the two are shared by every test and stopped at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_util import Fleet, fleet

VENV = Path(os.environ.get("SMETRIC_VLLM_VENV") or fleet.VENV)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"real vLLM engines are required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    why = fleet.why_not_ready(VENV)
    if why is not None:
        _unavailable(why)
    model = fleet.make_model(VENV / "models" / fleet.MODEL_NAME, VENV)
    # Short: ipc:// paths are limited to ~107 bytes.
    work = Path(tmp_path_factory.mktemp("vllm"))
    engines = [fleet.Engine(model, work, core=i, name=f"e{i}", venv=VENV) for i in range(2)]
    try:
        for e in engines:
            e.start()
        start_s = [e.wait_ready() for e in engines]
        yield Fleet(engines, model, start_s)
    finally:
        for e in engines:
            e.stop()
