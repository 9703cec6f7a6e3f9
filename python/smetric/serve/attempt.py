"""One routed attempt of a request: where it went, its ``x-smetric-decision`` header, and the
router's lifecycle calls, each made at most once.

Invariants: an attempt gets exactly one of :meth:`Attempt.finish` / :meth:`Attempt.abort` reported
(later calls are no-ops) and at most one :meth:`Attempt.first_byte`, never after the end — so the
router's load board returns to zero on every path, however the attempt ends. What the calls
mean is the backend's (co-located: ``on_prefilled`` at the first byte; PD: ``on_transferred``).
The attempt also keeps its routing decision and when its first byte and its end came (the
decision log's TTFT and inter-token latency). O(1) per call. May import: the standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Attempt"]


def _nothing(*_: object) -> None:
    return None


class Attempt:
    """One routed attempt and its once-only lifecycle calls."""

    __slots__ = (
        "_abort",
        "_finish",
        "_first_byte",
        "cookie",
        "decision",
        "done",
        "finished_at",
        "first_byte_at",
        "header",
        "instance",
        "prefilled",
    )

    def __init__(
        self,
        instance: str,
        header: str,
        *,
        first_byte: Callable[[], object] = _nothing,
        finish: Callable[[int], object] = _nothing,
        abort: Callable[[], object] = _nothing,
        decision: object = None,
        cookie: str | None = None,
    ) -> None:
        self.instance = instance
        """The instance the attempt's request goes to."""
        self.header = header
        """Its ``x-smetric-decision`` value."""
        self._first_byte, self._finish, self._abort = first_byte, finish, abort
        self.decision = decision
        """The router's ``Decision`` (or ``PdDecision``) behind the attempt, when one was made."""
        self.cookie = cookie
        """A ``Set-Cookie`` value its answer carries (llm-d's session cookie), or None."""
        self.first_byte_at: float | None = None
        """``time.perf_counter()`` at the first body byte."""
        self.finished_at: float | None = None
        """``time.perf_counter()`` when the answer was complete."""
        self.prefilled = False
        self.done = False

    def first_byte(self) -> None:
        if not self.prefilled and not self.done:
            self.prefilled = True
            self.first_byte_at = time.perf_counter()
            self._first_byte()

    def finish(self, output_tokens: int) -> None:
        if not self.done:
            self.done = True
            self.finished_at = time.perf_counter()
            self._finish(output_tokens)

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self._abort()
