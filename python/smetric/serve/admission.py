"""Admission control's app side: the gateway's door admits (``rust/smetric-gateway/src/admission.rs``),
this module words its refusals, renders its metric families and keeps attempts off full instances.

The door lets ``min(max_in_flight, max_in_flight_per_instance × live instances)`` requests
through to routing at once (ejected instances do not count, but at least one always does), queues
at most ``queue_size`` more in FIFO order for at most ``queue_timeout_s``, and refuses past that:
a full queue with 429, a wait that times out with 503, a request queued while the proxy drains
with 503, all with ``Retry-After``. A refusal of a path the app answers comes to the app with the
reason (:func:`refusal_error` words it; the caller renders it in the API's shape). The
per-instance cap also shapes routing: :func:`skip_full` keeps an attempt off an instance already
holding ``max_in_flight_per_instance`` requests while another instance of its pool has room
(never off the last one: an admitted request is routed, however skewed the sessions' homes are).

Until 2026-12-05 the app had an admission of its own for the requests it served itself (the
Python data plane); the gateway is now the only door. Costs: O(instances) per
:func:`skip_full`. May import: :mod:`smetric.serve.errors`, :mod:`smetric.serve.telemetry`,
:mod:`smetric.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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

__all__ = ["WAIT_BUCKETS_S", "Refusal", "refusal_error", "render_admission", "skip_full"]

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
    """The door's admission families in Prometheus' text format."""

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
