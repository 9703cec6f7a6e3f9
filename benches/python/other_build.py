"""Another build of ``smetric._core`` loaded beside the installed one, for same-process A/B pairs.

``route_latency.py --against`` and ``gateway_plan.py --against`` time the same work by both builds,
alternated batch by batch: on this noisy machine separate runs differ by more than the changes
worth measuring, alternated pairs in one process do not.
"""

from __future__ import annotations

import importlib.util
import statistics
from types import ModuleType


def load(path: str) -> ModuleType:
    """The build at ``path`` (a ``_core.abi3.so`` copied aside), as a module of its own."""
    spec = importlib.util.spec_from_file_location("_core", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(other: list[float], installed: list[float]) -> tuple[float, float, int]:
    """The medians of the two builds' paired figures and how many pairs the installed one won."""
    wins = sum(o > i for o, i in zip(other, installed, strict=True))
    return statistics.median(other), statistics.median(installed), wins


def order(pair: int) -> tuple[str, str]:
    """Which build goes first in pair number ``pair``: the other one in even pairs, the installed
    one in odd ones (neither always meets the machine first)."""
    return ("other", "installed") if pair % 2 == 0 else ("installed", "other")
