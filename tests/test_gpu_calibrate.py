"""``scripts/gpu_calibrate.py``: the fit recovers known constants, and a dry run on a real engine
writes a profile file the simulator loads.

* The fit (no vLLM): measurements generated from known constants through the simulator's step model
  (with 1 % seeded noise) must give those constants back; the grid stays inside the context; the
  written ``profile`` keys load through the simulator's own profile-file reader.
* The dry run: the script on the CPU vLLM venv (``SMETRIC_VLLM_PYTHON``, else ``.venv-vllm``) with
  the tiny model and the tiny grid, in under two minutes; the file it writes must load. Without the
  venv it skips locally and fails in CI (``CI=true``), like ``tests/vllm_real``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smetric._core import sim_profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))

import fleet  # noqa: E402
import gpu_calibrate as gc  # noqa: E402

BASE = "h20-3e-qwen3-coder-30b-a3b"
TRUE = {
    "step_overhead_s": 6.1e-3,
    "kv_read_efficiency": 0.42,
    "linear_s_per_token": 4.3e-5,
    "attention_s_per_pair": 2.1e-9,
    "frontend_base_s": 0.018,
}


def synthetic(base: dict[str, Any], noise: float, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """The full grid's cells, timed by the simulator's step model with ``TRUE``'s constants."""
    rng = np.random.default_rng(seed)
    kv_s = base["kv_bytes_per_token_rank"] / (base["hbm_bytes_per_s"] * TRUE["kv_read_efficiency"])
    truth = gc.PrefillFit(
        TRUE["frontend_base_s"] + TRUE["step_overhead_s"], TRUE["linear_s_per_token"], TRUE["attention_s_per_pair"], {}
    )
    grid = gc.GRIDS["full"]
    prefill = [
        gc.PrefillPoint(n, c, gc.prefill_model(truth, kv_s, gc.PrefillPoint(n, c, 0.0)) * rng.normal(1.0, noise))
        for n, c in gc.prefill_cells(grid, 131_072, 16)
    ]
    decode = []
    for b, ctx in gc.decode_cells(grid, 131_072, 700_000):
        p = gc.DecodePoint(b, ctx + grid.decode_steps / 2, 0.0)
        seconds = gc.decode_model(base, TRUE["step_overhead_s"], kv_s, p) * rng.normal(1.0, noise)
        decode.append(gc.DecodePoint(p.batch, p.context, seconds))
    return prefill, decode


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return dict(sim_profile(BASE))


@pytest.mark.parametrize(("noise", "tolerance"), [(0.0, 1e-6), (0.01, 0.06)])
def test_the_fit_recovers_the_constants_it_was_generated_from(
    base: dict[str, Any], noise: float, tolerance: float
) -> None:
    prefill, decode = synthetic(base, noise)
    profile, fits, warnings = gc.fit_profile(prefill, decode, base, kv_capacity_tokens=123_456)
    assert warnings == {}
    for field, want in TRUE.items():
        assert profile[field] == pytest.approx(want, rel=max(tolerance, 1e-3)), field
    assert profile["kv_capacity_tokens"] == 123_456
    assert fits["decode"]["rms_rel"] <= 2 * noise + 1e-6
    assert fits["prefill"]["rms_rel"] <= 2 * noise + 1e-6


def test_the_fit_keeps_coefficients_non_negative_and_clips_into_the_simulators_ranges(base: dict[str, Any]) -> None:
    # Flat decode steps (no KV-read slope) far below the base's weight read: a base that does not
    # describe the model. η_kv has no finite value and t_fix would be negative.
    decode = [gc.DecodePoint(b, ctx, 1e-3) for b in (1, 4) for ctx in (128, 1024)]
    prefill = [gc.PrefillPoint(n, c, 5e-3) for n in (64, 256) for c in (0, 512)]
    profile, _, warnings = gc.fit_profile(prefill, decode, base)
    assert profile["kv_read_efficiency"] == 1.0
    assert all(profile[k] >= 0 for k in ("step_overhead_s", "linear_s_per_token", "attention_s_per_pair"))
    assert set(warnings) == {"kv_read_efficiency", "weight_read_exceeds_step"}
    assert "kv_capacity_tokens" not in profile


def test_nonnegative_lstsq_drops_a_column_that_would_come_out_negative() -> None:
    x = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    beta, _ = gc.nonnegative_lstsq(x, np.array([3.0, 2.0, 1.0]))  # unconstrained: slope −1
    assert beta[1] == 0.0
    assert beta[0] == pytest.approx(2.0)


def test_the_grid_stays_inside_the_context_and_caches_whole_blocks() -> None:
    cells = gc.prefill_cells(gc.GRIDS["full"], 131_072, 16)
    assert (8192, 131_072 - 8192 - 16) in cells  # 128K − n, brought down to a whole block below the cap
    assert all(n + c < 131_072 and c % 16 == 0 for n, c in cells)
    small = gc.prefill_cells(gc.GRIDS["full"], 32_768, 16)
    assert max(n + c for n, c in small) < 32_768 and len(set(small)) == len(small)
    assert all(ctx + 64 + 2 <= 32_768 for _, ctx in gc.decode_cells(gc.GRIDS["full"], 32_768, 10**6))
    # A KV cache too small for a cell's shared prefix and its decodes leaves the cell out.
    assert all(ctx < 50_000 for _, ctx in gc.decode_cells(gc.GRIDS["full"], 131_072, 50_000))


def test_a_fitted_profile_loads_in_the_simulator(base: dict[str, Any], tmp_path: Path) -> None:
    prefill, decode = synthetic(base, 0.0)
    profile, fits, _ = gc.fit_profile(prefill, decode, base, kv_capacity_tokens=590_000)
    path = tmp_path / "p.json"
    doc = {"format": gc.FORMAT, "name": "synthetic", "base": BASE, "profile": profile, "provenance": {"fits": fits}}
    path.write_text(json.dumps(doc))
    resolved = sim_profile(file=path)
    assert resolved["name"] == "synthetic"
    for field, value in profile.items():
        assert resolved[field] == pytest.approx(value), field  # type: ignore[literal-required]


# --- the dry run on a real CPU vLLM engine ----------------------------------------------------------


def _vllm_python() -> str | None:
    configured = os.environ.get("SMETRIC_VLLM_PYTHON")
    if configured:
        return configured if Path(configured).exists() else None
    return None if fleet.why_not_ready() else str(fleet.venv_python())


@pytest.mark.vllm_real
@pytest.mark.slow
def test_a_dry_run_on_the_cpu_engine_writes_a_profile_the_simulator_loads(tmp_path: Path) -> None:
    python = _vllm_python()
    if python is None:
        why = fleet.why_not_ready() or "SMETRIC_VLLM_PYTHON names no interpreter"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the vLLM CPU venv is required in CI: {why}", pytrace=False)
        pytest.skip(why)
    out = tmp_path / "dry.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(SMETRIC_PYTHON=sys.executable, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.monotonic()
    run = subprocess.run(
        [python, str(ROOT / "scripts" / "gpu_calibrate.py"), "--dry-run", "--out", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - t0
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["format"] == "smetric-profile/1" and doc["base"] == gc.DEFAULT_BASE
    assert set(doc["profile"]) == {*TRUE, "kv_capacity_tokens"}
    prov = doc["provenance"]
    assert prov["dry_run"] is True and "dry run" in prov["note"]
    assert prov["vllm"] == "0.32.0"
    assert len(prov["grid"]["prefill"]) == 6 and len(prov["grid"]["decode"]) == 4
    assert all(p["seconds"] > 0 for p in prov["grid"]["prefill"] + prov["grid"]["decode"])
    # The engine's KV: 1 GiB of CPU KV space in blocks of 32 tokens.
    assert doc["profile"]["kv_capacity_tokens"] == prov["num_gpu_blocks"] * 32 > 0
    assert "grid:" in run.stderr  # the progress bar
    resolved = sim_profile(file=out)
    assert resolved["kv_capacity_tokens"] == doc["profile"]["kv_capacity_tokens"]
    assert seconds < 120
