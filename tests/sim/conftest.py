"""Tiny traces of every format, written into a temporary directory (tests never read shared data)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TraceWriter = Callable[..., Path]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def weka_rows(
    sessions: int = 4, turns: int = 6, first_tokens: int = 3_000, growth: int = 700, first: int = 0
) -> list[dict[str, Any]]:
    """Closed-loop agent sessions (``first`` … ``first + sessions − 1``): each turn re-sends the
    previous prompt plus ``growth`` tokens."""
    rows = []
    for s in range(first, first + sessions):
        base = (s + 1) * 1_000_000  # disjoint id range per session, as in the staged traces
        prev = -1
        for k in range(turns):
            tokens = first_tokens + k * growth
            rid = (s + 1) * 100_000 + k
            rows.append(
                {
                    "request_id": rid,
                    "prev_request_id": prev,
                    "session_id": f"weka-{s:04d}",
                    "root_session_id": f"weka-{s:04d}",
                    "parent_session_id": None,
                    "turn": k + 1,
                    "t": 10.0 * k,
                    "input_length": tokens,
                    "output_length": 40 + 10 * k,
                    "hash_ids": list(range(base, base + tokens // 64)),
                    "think_time": 2.0 if k else 0.0,
                    "api_time": 1.0,
                    "session_tool_tokens": 1_024,
                    "session_system_tokens": 512,
                }
            )
            prev = rid
    return rows


@pytest.fixture
def weka_trace(tmp_path: Path) -> TraceWriter:
    """``weka_trace(name="w.jsonl", **weka_rows options)`` writes a tiny Weka file."""

    def write(name: str = "weka_tiny.jsonl", **options: Any) -> Path:
        return _write(tmp_path / name, weka_rows(**options))

    return write


@pytest.fixture
def trace_of(tmp_path: Path) -> Callable[[str], Path]:
    """``trace_of(format)`` writes a tiny trace of that format (gzipped for mooncake)."""

    def write(fmt: str) -> Path:
        if fmt == "weka":
            return _write(tmp_path / "weka.jsonl", weka_rows())
        if fmt == "bailian":
            rows = [
                {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40, "output_length": 5,
                 "turn": 1, "hash_ids": [1, 2, 3]},
                {"chat_id": 2, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 33, "output_length": 5,
                 "turn": 1, "hash_ids": [7, 8, 9]},
                {"chat_id": 3, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 70, "output_length": 9,
                 "turn": 2, "hash_ids": [1, 2, 4, 5, 6]},
            ]  # fmt: skip
            return _write(tmp_path / "bailian.jsonl", rows)
        if fmt == "mooncake":
            rows = [
                {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
                {"timestamp": 500, "input_length": 1100, "output_length": 12, "hash_ids": [0, 1, 3]},
                {"timestamp": 900, "input_length": 700, "output_length": 8, "hash_ids": [4, 5]},
            ]
            return _write(tmp_path / "mooncake.jsonl.gz", rows)
        if fmt == "azure":
            rows = [
                {"timestamp": 0.0, "input_length": 900, "output_length": 20},
                {"timestamp": 0.7, "input_length": 1500, "output_length": 5},
            ]
            return _write(tmp_path / "azure.jsonl", rows)
        raise ValueError(fmt)

    return write
