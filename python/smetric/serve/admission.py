"""Admission control: how many requests the proxy lets through to routing at once, and how many
may wait for a slot, ahead of the routing decision.

A request of an API adapter takes a slot before it is parsed and routed and gives it back when
its answer is done. The per-instance cap also shapes routing: :func:`skip_full` keeps an attempt
off an instance already holding ``max_in_flight_per_instance`` requests while another instance of
its pool has room (never off the last one: an admitted request is routed, however skewed the
sessions' homes are). The fleet's capacity is ``min(max_in_flight, max_in_flight_per_instance ×
live instances)`` (ejected instances do not count, but at least one always does), so a fleet
that loses an instance admits less. When every slot is taken the request waits in a FIFO queue
of at most ``queue_size`` for at most ``queue_timeout_s``; a full queue refuses at once with 429,
a wait that times out with 503, both with ``Retry-After`` (the caller renders them in the API's
own error shape through its adapter). While the proxy drains, queued requests are refused with
503: they were never admitted, and the drain waits only for admitted ones.

Invariants: an admitted request is never refused afterwards — its slot is handed straight to the
head of the queue when it leaves (no barging), and a waiter cancelled after its grant (its client
went away) gives the slot back; ``admitted`` never exceeds the capacity at the time of a grant;
the queue holds at most ``queue_size`` waiters, so a burst costs O(queue_size) memory beyond the
admitted requests. State lives on the proxy's event loop: no locking. Costs: O(1) per request
(a timed-out waiter is removed in O(queue)). May import: :mod:`smetric.serve.errors`,
:mod:`smetric.serve.telemetry`, :mod:`smetric.metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from smetric._core import (
    SHARED_REFUSED_AT_CAPACITY,
    SHARED_REFUSED_DRAINING,
    SHARED_REFUSED_QUEUE_TIMEOUT,
    SHARED_WAIT_BUCKETS_S,
)
from smetric.metrics import _family
from smetric.serve.errors import ProxyError
from smetric.serve.telemetry import Histogram

__all__ = ["WAIT_BUCKETS_S", "Admission", "Refusal", "refusal_error", "render_admission", "skip_full"]

WAIT_BUCKETS_S: tuple[float, ...] = SHARED_WAIT_BUCKETS_S
"""Upper bounds (seconds) of the queue-wait histogram; an immediate admission lands in the first
(the gateway's door fills the same buckets)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the proxy did not admit: the error to answer (in the API's shape) and when to retry."""

    error: ProxyError
    reason: str
    """``queue_full`` (429), ``queue_timeout`` (503) or ``draining`` (503): the metric's label."""
    retry_after_s: int


def skip_full(
    exclude: list[str],
    in_flight: Mapping[str, int],
    cap: int,
    pools: Sequence[frozenset[str]] | None,
) -> list[str]:
    """``exclude`` plus the instances at ``cap`` in-flight requests, pool by pool (None: one pool
    of every instance in ``in_flight``), where the pool keeps an instance below the cap."""
    out = list(exclude)
    skipped = set(exclude)
    for pool in [frozenset(in_flight)] if pools is None else pools:
        candidates = [u for u in pool if u in in_flight and u not in skipped]
        full = [u for u in candidates if in_flight[u] >= cap]
        if full and len(full) < len(candidates):
            out += full
    return out


def _granted(waiter: asyncio.Future[bool]) -> bool:
    return waiter.done() and not waiter.cancelled() and waiter.result()


class Admission:
    """The in-flight slots and the wait queue of one proxy (see the module docs)."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        max_in_flight_per_instance: int,
        queue_size: int,
        queue_timeout_s: float,
        retry_after_s: int,
        live_instances: Callable[[], int],
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_instance = max_in_flight_per_instance
        self.queue_size = queue_size
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self._live_instances = live_instances
        self._floor = min(max_in_flight, max_in_flight_per_instance)
        """:attr:`capacity` with one live instance: the least it can be."""
        self.admitted = 0
        """Requests holding a slot."""
        self.closed = False
        self.rejections: Counter[str] = Counter()
        self.wait_s = Histogram(WAIT_BUCKETS_S)
        self._waiters: deque[asyncio.Future[bool]] = deque()

    @property
    def capacity(self) -> int:
        """Slots the fleet has now."""
        return min(self.max_in_flight, self.max_in_flight_per_instance * max(1, self._live_instances()))

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def enter(self) -> Refusal | None:
        """Takes a slot (waiting in the queue if need be); None: admitted — call :meth:`leave`
        once the answer is done. A :class:`Refusal` holds no slot."""
        if self.closed:
            return self._refuse("draining")
        # The fleet's capacity is never below one live instance's: only past that is it counted.
        if not self._waiters and (self.admitted < self._floor or self.admitted < self.capacity):
            self.admitted += 1
            self.wait_s.observe(0.0)
            return None
        if len(self._waiters) >= self.queue_size:
            return self._refuse("queue_full")
        started = time.perf_counter()
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                admitted = await granted
        except TimeoutError:
            if _granted(granted):  # the grant and the timeout fell in one loop turn: keep the slot
                self.wait_s.observe(time.perf_counter() - started)
                return None
            self._forget(granted)
            return self._refuse("queue_timeout")
        except asyncio.CancelledError:  # the client went away (or the proxy stops) while queued
            if _granted(granted):
                self.leave()  # granted just before the cancellation: give the slot on
            else:
                self._forget(granted)
            raise
        if not admitted:  # the proxy closed the queue (see close)
            return self._refuse("draining")
        self.wait_s.observe(time.perf_counter() - started)
        return None

    def leave(self) -> None:
        """Gives an admitted request's slot back: straight to the oldest waiter when one waits."""
        self.admitted -= 1
        self._grant()

    def close(self) -> None:
        """The proxy drains: queued requests are refused (503) and no new one is admitted."""
        self.closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)

    def _grant(self) -> None:
        if not self._waiters:
            return
        capacity = self.capacity
        while self._waiters and self.admitted < capacity:
            waiter = self._waiters.popleft()
            if waiter.done():  # timed out or cancelled, not yet removed
                continue
            waiter.set_result(True)
            self.admitted += 1

    def _forget(self, waiter: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):  # already popped by a grant or by close
            self._waiters.remove(waiter)

    def _refuse(self, reason: str) -> Refusal:
        self.rejections[reason] += 1
        error = refusal_error(
            reason, admitted=self.admitted, queued=len(self._waiters), queue_timeout_s=self.queue_timeout_s
        )
        return Refusal(error, reason, self.retry_after_s)

    def render(self, prefix: str = "smetric") -> Iterator[str]:
        """The admission families in Prometheus' text format."""
        return render_admission(self.admitted, self.capacity, len(self._waiters), self.wait_s, self.rejections, prefix)


def refusal_error(reason: str, *, admitted: int, queued: int, queue_timeout_s: float) -> ProxyError:
    """The error a refusal for ``reason`` answers with (``queue_full``: 429, else 503)."""
    if reason == "queue_full":
        return ProxyError(429, SHARED_REFUSED_AT_CAPACITY.format(admitted=admitted, queued=queued), "RateLimitError")
    if reason == "queue_timeout":
        return ProxyError.unavailable(SHARED_REFUSED_QUEUE_TIMEOUT.format(seconds=f"{queue_timeout_s:g}"))
    return ProxyError.unavailable(SHARED_REFUSED_DRAINING)


def render_admission(
    admitted: int,
    capacity: int,
    queued: int,
    wait_s: Histogram,
    rejections: Mapping[str, int],
    prefix: str = "smetric",
) -> Iterator[str]:
    """The admission families in Prometheus' text format (the app's, or its gateway's)."""

    def name(n: str) -> str:
        return f"{prefix}_proxy_admission_{n}"

    yield from _family(name("in_flight"), "gauge", "Requests holding an admission slot.", [({}, admitted)])
    yield from _family(name("capacity"), "gauge", "Admission slots the fleet has now.", [({}, capacity)])
    yield from _family(name("queue_depth"), "gauge", "Requests waiting for an admission slot.", [({}, queued)])
    yield from wait_s.render(
        name("wait_seconds"), "Time admitted requests waited for their slot (0 when admitted at once)."
    )
    yield from _family(
        name("rejections_total"),
        "counter",
        "Requests refused admission, by reason (queue_full: 429; queue_timeout, draining: 503).",
        [({"reason": r}, rejections.get(r, 0)) for r in ("queue_full", "queue_timeout", "draining")],
    )
