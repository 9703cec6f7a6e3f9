"""Agent sessions of the shipped Weka excerpt as chat requests, for replaying through a proxy.

The excerpt (``smetric/data/weka_excerpt.jsonl.gz``) has block ids, not text. A block id becomes
16 bytes of text (4 tokens of the fake engine's byte-chunk tokenizer), so a turn's prompt is the
text of its ``hash_ids``. Each turn is a chat whose messages keep the earlier turns' text as they
were (one user message per turn's new blocks, an assistant message between turns), so turn k's
rendering is a prefix of turn k+1's: the history is reused as in a real agent session. Copies of
the excerpt (``copies``) get disjoint block texts: separate sessions with the same shape.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any


@dataclass
class Turn:
    messages: list[dict[str, str]]
    at_s: float
    """Offset of the request from the replay's start (scaled)."""
    max_tokens: int


@dataclass
class Session:
    key: str
    turns: list[Turn] = field(default_factory=list)


def _rows() -> list[dict[str, Any]]:
    data = resources.files("smetric.data").joinpath("weka_excerpt.jsonl.gz").read_bytes()
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


def sessions(*, copies: int, max_turns: int, span_s: float, max_output: int = 12, first_copy: int = 0) -> list[Session]:
    """``copies`` × the excerpt's sessions, each cut to ``max_turns`` turns, their start times
    scaled into ``span_s`` seconds (the order and gaps of the trace, compressed)."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in _rows():
        by_session.setdefault(row["session_id"], []).append(row)
    t_max = max(r["t"] for r in _rows()) or 1.0
    out = []
    for c in range(first_copy, first_copy + copies):
        for sid, rows in sorted(by_session.items()):
            rows.sort(key=lambda r: r["turn"])
            s = Session(key=f"{sid}-copy{c}")
            seen = 0
            messages: list[dict[str, str]] = []
            for r in rows[:max_turns]:
                blocks = r["hash_ids"]
                new = blocks[seen:] if len(blocks) > seen else blocks[-1:]
                if messages:
                    messages.append({"role": "assistant", "content": "ok"})
                messages.append({"role": "user", "content": "".join(f"{c:03x}{b:012x} " for b in new)})
                seen = max(seen, len(blocks))
                offset = (r["t"] / t_max) * span_s + (c - first_copy) * span_s / max(1, copies) / 4
                s.turns.append(Turn([*messages], offset, max(1, min(max_output, int(r["output_length"])))))
            out.append(s)
    return out
