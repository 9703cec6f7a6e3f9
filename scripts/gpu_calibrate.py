"""Calibrates the simulator's engine model (``rust/smetric-sim/src/perf_model.rs``) on a real vLLM
engine: measures a prefill/decode grid of the model it is given and writes a profile file
(``smetric-profile/1``, ``docs/perf-model.md`` §9) holding the fitted constants.

What is measured, with vLLM's offline engine (``vllm.LLM``, prefix caching on, prompts as token ids
so no tokenizer time is counted):

* **prefill**: ``n`` new tokens on top of ``c`` cached ones (``c`` a whole number of KV blocks): the
  ``c``-token prefix is prefilled once, then ``prefix + n fresh tokens`` is timed with
  ``max_tokens=1`` (the median of a few fresh suffixes);
* **decode**: ``B`` requests of context ``L`` sharing a cached prefix: the time per step is
  ``(T(max_tokens=M) - T(max_tokens=1)) / (M - 1)`` over the same, cached prompts (``ignore_eos``),
  at a mean context of ``L + M/2``;
* **KV capacity**: the engine's ``num_gpu_blocks × block_size``.

The fit (pure functions: :func:`fit_decode`, :func:`fit_prefill`, :func:`fit_profile`) follows the
simulator's step model, keeping the base profile's hardware constants (HBM bandwidth, KV bytes per
token, weight bytes and η_m) so the simulator reproduces the measured times with them:

    decode step   = t_fix + max(a·B, weight_read(B)) + Σ context · kv_rank / (BW·η_kv)
    prefill       = t0 + a·n + 2b·(n·c + n²/2) + c · kv_rank / (BW·η_kv),   t0 = frontend + t_fix

Decode gives ``step_overhead_s`` (t_fix) and ``kv_read_efficiency`` (η_kv, from the slope in
Σ context; the base's weight read is subtracted first); prefill, with that KV term subtracted,
gives ``linear_s_per_token`` (a), ``attention_s_per_pair`` (b) and t0, hence ``frontend_base_s``
(t0 - t_fix: the offline engine's own per-request cost, without an HTTP server's). Least squares on
relative errors, coefficients kept non-negative; values outside the simulator's ranges are clipped
and named in ``provenance.warnings``, as are decode steps faster than the base's weight read alone.

    python scripts/gpu_calibrate.py --model /models/Qwen3-Coder-30B-A3B-Instruct \\
        --base h20-3e-qwen3-coder-30b-a3b --out profiles/my-gpu.json     # or: make gpu-calibrate MODEL=...
    python scripts/gpu_calibrate.py --dry-run --out /tmp/dry.json           # CPU, tiny model, tiny grid

Runs in a Python with vLLM (``--dry-run`` here: ``.venv-vllm``, the CPU build). The base profile's
constants come from ``smetric._core.sim_profile``: imported when smetric is installed, else through
``$SMETRIC_PYTHON`` (default ``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FORMAT = "smetric-profile/1"
DEFAULT_BASE = "h20-3e-qwen3-coder-30b-a3b"

# --- the fit: pure functions -----------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillPoint:
    """One isolated prefill: ``new`` tokens on top of ``cached`` ones took ``seconds``."""

    new: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class DecodePoint:
    """One decode step of ``batch`` requests of mean context ``context`` took ``seconds``."""

    batch: int
    context: float
    seconds: float


BASE_FIELDS = (
    "tp",
    "moe_layers",
    "experts",
    "top_k",
    "dense_weight_bytes",
    "expert_weight_bytes",
    "kv_bytes_per_token_rank",
    "hbm_bytes_per_s",
    "weight_read_efficiency",
    "linear_s_per_token",
)
"""The base profile's fields the fit keeps (the hardware and model constants it does not fit)."""


def weight_read_s(base: dict[str, Any], tokens: int) -> float:
    """The base profile's weight-streaming time of a step of ``tokens`` batched tokens (perf_model.rs)."""
    experts, top_k = base["experts"], base["top_k"]
    touched = experts * (1.0 - (1.0 - top_k / experts) ** tokens) if experts and tokens else 0.0
    weight_bytes = base["dense_weight_bytes"] + base["moe_layers"] * touched * base["expert_weight_bytes"]
    return float(weight_bytes / (base["tp"] * base["hbm_bytes_per_s"] * base["weight_read_efficiency"]))


def attention_pairs(new: float, cached: float) -> float:
    """(query, key) pairs of a causal prefill chunk: n·c + n²/2 (``BatchShape::add_prefill``)."""
    return new * cached + new * new / 2.0


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares of ``x·β ≈ y`` with β ≥ 0: the best exact fit over every subset of columns
    whose solution is non-negative (few columns here, so enumerating the subsets is cheap)."""
    cols = x.shape[1]
    best: tuple[np.ndarray, float] | None = None
    for k in range(cols, 0, -1):
        for subset in combinations(range(cols), k):
            beta_s, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
            if (beta_s < 0).any():
                continue
            beta = np.zeros(cols)
            beta[list(subset)] = beta_s
            sse = float(np.sum((x @ beta - y) ** 2))
            if best is None or sse < best[1]:
                best = (beta, sse)
    return best if best is not None else (np.zeros(cols), float(np.sum(y**2)))


def residuals(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """Relative errors of a fit: RMS and worst, as fractions of the measured times."""
    rel = [(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    return {
        "rms_rel": round(float(np.sqrt(np.mean(np.square(rel)))), 5),
        "max_abs_rel": round(float(np.max(np.abs(rel))), 5),
        "points": len(rel),
    }


@dataclass(frozen=True)
class DecodeFit:
    step_overhead_s: float
    kv_s_per_token: float
    """Seconds per context token read in a step: kv_rank / (BW·η_kv)."""
    kv_read_efficiency: float
    """Unclipped: the simulator needs (0, 1] (:func:`fit_profile` clips)."""
    residuals: dict[str, float]


def decode_model(base: dict[str, Any], step_overhead_s: float, kv_s_per_token: float, p: DecodePoint) -> float:
    linear = max(base["linear_s_per_token"] * p.batch, weight_read_s(base, p.batch))
    return step_overhead_s + linear + p.batch * p.context * kv_s_per_token


def fit_decode(points: Sequence[DecodePoint], base: dict[str, Any]) -> DecodeFit:
    """t_fix and η_kv from decode steps: the base's linear/weight-read term is subtracted, then
    ``t_fix + s·Σ context`` is fitted on relative errors (``s = kv_rank / (BW·η_kv)``)."""
    if len(points) < 2:
        raise ValueError("the decode fit needs at least two points")
    y = np.array([p.seconds - decode_model(base, 0.0, 0.0, p) for p in points])
    x = np.array([[1.0, p.batch * p.context] for p in points])
    w = np.array([1.0 / p.seconds for p in points])
    beta, _ = nonnegative_lstsq(x * w[:, None], y * w)
    t_fix, slope = float(beta[0]), float(beta[1])
    eta = base["kv_bytes_per_token_rank"] / (base["hbm_bytes_per_s"] * slope) if slope > 0 else float("inf")
    predicted = [decode_model(base, t_fix, slope, p) for p in points]
    return DecodeFit(t_fix, slope, eta, residuals(predicted, [p.seconds for p in points]))


@dataclass(frozen=True)
class PrefillFit:
    t0_s: float
    linear_s_per_token: float
    attention_s_per_pair: float
    residuals: dict[str, float]


def prefill_model(fit: PrefillFit, kv_s_per_token: float, p: PrefillPoint) -> float:
    return (
        fit.t0_s
        + fit.linear_s_per_token * p.new
        + 2.0 * fit.attention_s_per_pair * attention_pairs(p.new, p.cached)
        + p.cached * kv_s_per_token
    )


def fit_prefill(points: Sequence[PrefillPoint], kv_s_per_token: float) -> PrefillFit:
    """t0, a and b from isolated prefills, with the KV-read term of the cached tokens (from the
    decode fit) subtracted; relative-error least squares, every coefficient ≥ 0."""
    if len(points) < 3:
        raise ValueError("the prefill fit needs at least three points")
    y = np.array([p.seconds - p.cached * kv_s_per_token for p in points])
    x = np.array([[1.0, p.new, 2.0 * attention_pairs(p.new, p.cached)] for p in points])
    w = np.array([1.0 / p.seconds for p in points])
    beta, _ = nonnegative_lstsq(x * w[:, None], y * w)
    fit = PrefillFit(float(beta[0]), float(beta[1]), float(beta[2]), {})
    predicted = [prefill_model(fit, kv_s_per_token, p) for p in points]
    return PrefillFit(
        fit.t0_s, fit.linear_s_per_token, fit.attention_s_per_pair, residuals(predicted, [p.seconds for p in points])
    )


def fit_profile(
    prefill: Sequence[PrefillPoint],
    decode: Sequence[DecodePoint],
    base: dict[str, Any],
    kv_capacity_tokens: int | None = None,
) -> tuple[dict[str, float | int], dict[str, Any], dict[str, Any]]:
    """The profile's fitted fields, the fits' residuals, and warnings: the values clipped into
    the simulator's ranges (η_kv in (0, 1], times ≥ 0) and decode steps faster than the base's
    weight read alone (a base that does not describe the measured model or GPU)."""
    d = fit_decode(decode, base)
    p = fit_prefill(prefill, d.kv_s_per_token)
    warnings: dict[str, Any] = {}
    above = [q for q in decode if decode_model(base, 0.0, 0.0, q) > q.seconds]
    if above:
        # The base's weight read alone is slower than the measured step: the base does not
        # describe this model or GPU, and t_fix and η_kv are not meaningful.
        warnings["weight_read_exceeds_step"] = [asdict(q) for q in above]
    eta = d.kv_read_efficiency
    if not 0.0 < eta <= 1.0:
        warnings["kv_read_efficiency"] = eta if np.isfinite(eta) else "inf (no KV-read slope)"
        eta = 1.0
    frontend = p.t0_s - d.step_overhead_s
    if frontend < 0.0:
        warnings["frontend_base_s"] = frontend
        frontend = 0.0
    profile: dict[str, float | int] = {
        "kv_read_efficiency": round(eta, 4),
        "step_overhead_s": float(f"{d.step_overhead_s:.4g}"),
        "linear_s_per_token": float(f"{p.linear_s_per_token:.4g}"),
        "attention_s_per_pair": float(f"{p.attention_s_per_pair:.4g}"),
        "frontend_base_s": float(f"{frontend:.4g}"),
    }
    if kv_capacity_tokens is not None:
        profile["kv_capacity_tokens"] = int(kv_capacity_tokens)
    fits = {
        "decode": {**d.residuals, "kv_s_per_token": d.kv_s_per_token},
        "prefill": {**p.residuals, "t0_s": p.t0_s},
    }
    return profile, fits, warnings


# --- the grid --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    new: tuple[int, ...]
    cached: tuple[int, ...]
    """Cached prefixes; the largest context is capped to ``max_context - n``."""
    batch: tuple[int, ...]
    context: tuple[int, ...]
    decode_steps: int
    repeats: int


K = 1024
GRIDS = {
    "full": Grid(
        new=(512, 2 * K, 8 * K),
        cached=(0, 8 * K, 32 * K, 64 * K, 128 * K),
        batch=(1, 2, 4, 8),
        context=(K, 8 * K, 32 * K, 64 * K, 128 * K),
        decode_steps=64,
        repeats=3,
    ),
    "quick": Grid((512, 2 * K), (0, 32 * K, 128 * K), (1, 8), (K, 32 * K, 128 * K), decode_steps=32, repeats=2),
    "dry-run": Grid((64, 256), (0, 512, 1536), (1, 4), (128, 1024), decode_steps=16, repeats=2),
}


def prefill_cells(grid: Grid, max_context: int, block: int) -> list[tuple[int, int]]:
    """(n, c) cells within ``max_context``; c a whole number of blocks (so all of it is cached),
    the largest one brought down to fit beside n; duplicates dropped."""
    cells = []
    for n in grid.new:
        for c in grid.cached:
            c = min(c, max_context - n - 1) // block * block
            if c >= 0 and n + c < max_context and (n, c) not in cells:
                cells.append((n, c))
    return cells


def decode_cells(grid: Grid, max_context: int, kv_tokens: int) -> list[tuple[int, int]]:
    """(B, L) cells whose prompts plus their decode steps fit the context and, with a shared
    prefix of L, the KV cache."""
    cells = []
    for b in grid.batch:
        for ctx in grid.context:
            ctx = min(ctx, max_context - grid.decode_steps - 2)
            if ctx > 0 and ctx + b * (grid.decode_steps + 32) < kv_tokens and (b, ctx) not in cells:
                cells.append((b, ctx))
    return cells


# --- the measurement (vLLM) ------------------------------------------------------------------------


class Engine:
    """``vllm.LLM`` with prefix caching; prompts are token ids drawn from a seeded generator."""

    def __init__(self, args: argparse.Namespace, max_context: int, max_new: int) -> None:
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": str(args.model),
            "dtype": args.dtype,
            "enable_prefix_caching": True,
            "max_model_len": max_context,
            "max_num_batched_tokens": max(max_new, 8192),
            "max_num_seqs": 64,
            "seed": 0,
        }
        if args.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
        if args.dry_run:
            kwargs.update(block_size=32, enforce_eager=True)  # vLLM's CPU attention needs blocks of 32k
        self.llm = LLM(**kwargs)
        cache = self.llm.llm_engine.vllm_config.cache_config
        self.block_size = int(cache.block_size)
        self.num_blocks = int(cache.num_gpu_blocks or 0)
        tokenizer = self.llm.get_tokenizer()
        special = set(tokenizer.all_special_ids)
        self.vocab = [i for i in range(min(len(tokenizer), 100_000)) if i not in special]
        self.rng = np.random.default_rng(0)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def tokens(self, count: int) -> list[int]:
        return [self.vocab[i] for i in self.rng.integers(0, len(self.vocab), count)]

    def run(self, prompts: list[list[int]], max_tokens: int) -> float:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        t0 = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - t0

    def warm_up(self) -> None:
        """A few throwaway requests: the first ones pay for lazy initialisation, not for the model."""
        for size in (64, 512):
            self.run([self.tokens(size) for _ in range(2)], 4)

    def prefill(self, new: int, cached: int, repeats: int) -> float:
        prefix = self.tokens(cached)
        if cached:
            self.run([prefix], 1)
        return statistics.median(self.run([prefix + self.tokens(new)], 1) for _ in range(repeats))

    def decode_step(self, batch: int, context: int, steps: int, repeats: int) -> float:
        prefix = self.tokens(context - 16)
        prompts = [prefix + self.tokens(16) for _ in range(batch)]
        self.run([prefix], 1)
        self.run(prompts, 1)
        per_step = []
        for _ in range(repeats):
            one = self.run(prompts, 1)
            many = self.run(prompts, steps)
            per_step.append((many - one) / (steps - 1))
        return statistics.median(per_step)


def base_profile(name: str) -> dict[str, Any]:
    """The built-in profile ``name`` as the simulator resolves it (``smetric._core.sim_profile``)."""
    try:
        from smetric._core import sim_profile
    except ImportError:
        python = os.environ.get("SMETRIC_PYTHON") or str(ROOT / ".venv" / "bin" / "python")
        code = "import json, sys; from smetric._core import sim_profile; print(json.dumps(sim_profile(sys.argv[1])))"
        out = subprocess.run([python, "-c", code, name], capture_output=True, text=True, check=True)
        resolved: dict[str, Any] = json.loads(out.stdout)
        return resolved
    return dict(sim_profile(name))


def measure(
    engine: Engine, grid: Grid, max_context: int, progress: Callable[..., Any]
) -> tuple[list[PrefillPoint], list[DecodePoint]]:
    pcells = prefill_cells(grid, max_context, engine.block_size)
    pcells = [(n, c) for n, c in pcells if n + c < engine.kv_capacity_tokens]
    dcells = decode_cells(grid, max_context, engine.kv_capacity_tokens)
    prefill, decode = [], []
    engine.warm_up()
    with progress(total=len(pcells) + len(dcells), desc="grid", unit="cell") as bar:
        for n, c in pcells:
            bar.set_postfix_str(f"prefill n={n} c={c}")
            prefill.append(PrefillPoint(n, c, engine.prefill(n, c, grid.repeats)))
            bar.update()
        for b, ctx in dcells:
            bar.set_postfix_str(f"decode B={b} L={ctx}")
            seconds = engine.decode_step(b, ctx, grid.decode_steps, grid.repeats)
            decode.append(DecodePoint(b, ctx + grid.decode_steps / 2, seconds))
            bar.update()
    return prefill, decode


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def device_name() -> str:
    if cuda_available():
        import torch

        return str(torch.cuda.get_device_name(0))
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="the model directory (or hub name) vLLM serves")
    ap.add_argument("--base", default=DEFAULT_BASE, help="the built-in profile the file starts from")
    ap.add_argument("--out", type=Path, required=True, help="the profile file to write")
    ap.add_argument("--name", help="the profile's name (default: derived from the GPU and model)")
    ap.add_argument("--max-context", type=int, default=131_072, help="max_model_len (caps the grid)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None)
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    ap.add_argument("--dry-run", action="store_true", help="the tiny model, a tiny grid, whatever device vLLM has")
    args = ap.parse_args(argv)
    started = time.monotonic()
    grid = GRIDS["dry-run" if args.dry_run else "quick" if args.quick else "full"]
    if args.dry_run:
        args.max_context = min(args.max_context, 4096)
        if not cuda_available():
            # vLLM's CPU build: its device probe, 1 GiB of KV, OpenMP on one core (docs/vllm-real.md)
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
        if args.model is None:
            sys.path.insert(0, str(ROOT / "scripts" / "vllm_cpu"))
            import make_model

            args.model = make_model.build(Path(sys.prefix) / "models" / "tiny")
    if args.model is None:
        ap.error("--model is required (or --dry-run)")
    base = base_profile(args.base)
    import vllm
    from tqdm import tqdm

    engine = Engine(args, args.max_context, max(grid.new))
    prefill, decode = measure(engine, grid, args.max_context, tqdm)
    profile, fits, warnings = fit_profile(prefill, decode, base, engine.kv_capacity_tokens)
    gpu = device_name()
    name = args.name or f"{'dry-run-' if args.dry_run else ''}{gpu.split(' (')[0]}-{Path(str(args.model)).name}"
    doc = {
        "format": FORMAT,
        "name": name.lower().replace(" ", "-"),
        "base": args.base,
        "profile": profile,
        "provenance": {
            "dry_run": args.dry_run,
            "note": "a dry run: the tiny random-weight model on this machine's device; the constants check the "
            "pipeline and describe nothing real"
            if args.dry_run
            else "measured with vLLM's offline engine (frontend_base_s excludes an HTTP server's cost)",
            "gpu": gpu,
            "vllm": vllm.__version__,
            "model": str(args.model),
            "dtype": args.dtype,
            "max_model_len": args.max_context,
            "block_size": engine.block_size,
            "num_gpu_blocks": engine.num_blocks,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "script": "scripts/gpu_calibrate.py",
            "kept_from_base": {k: base[k] for k in BASE_FIELDS},
            "grid": {"prefill": [asdict(p) for p in prefill], "decode": [asdict(p) for p in decode]},
            "fit_residuals": fits,
            "warnings": warnings,
            "seconds": round(time.monotonic() - started, 1),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"out": str(args.out), "profile": profile, "fit_residuals": fits, "warnings": warnings}))


if __name__ == "__main__":
    main()
