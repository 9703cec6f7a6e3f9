"""The interface of a backend: how one attempt of a request is routed and opened on the fleet —
the deployment mode's room, so the data plane never branches on it.

:meth:`Backend.open` makes the routing decision (recording it in the telemetry), builds the
attempt's once-only lifecycle (:class:`~smetric.serve.attempt.Attempt`) and opens the upstream
answer. Its outcome is typed (:data:`OpenOutcome`):

* :class:`~smetric.serve.upstream.Opened` — headers received, status below 500: relay it;
* :class:`~smetric.serve.upstream.Refused` — the instance failed before any byte (the attempt is
  already aborted): count it and retry elsewhere;
* :class:`Answered` — the backend answered the client itself (PD: the prefill instance's 4xx);
* :data:`NO_INSTANCE` — the router had no instance left to try.

Besides, a backend names where the fleet's feeds go (:meth:`Backend.feed_targets`), its pools
(each must keep an eligible instance), its load per instance and metric families for
``/metrics``, and whether instances can be added at run time.

Implementations: :mod:`.colocated` (one ``Router``) and :mod:`.pd` (a ``PdRouter`` and vLLM's
disaggregated-prefill protocol). May import: :mod:`smetric.serve.apis.base`, ``.attempt``,
``.fleet``, ``.labels``, ``.telemetry``, ``.upstream``, ``smetric._core``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from aiohttp import web

from smetric._core import Decision, PdDecision
from smetric.errors import NoInstancesError
from smetric.serve.apis.base import Prepared
from smetric.serve.attempt import Attempt
from smetric.serve.fleet import FeedTargets
from smetric.serve.labels import reason_label
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.upstream import Opened, Refused, Upstream

__all__ = ["NO_INSTANCE", "Answered", "Backend", "NoInstance", "OpenOutcome", "Unsupported", "open_unrouted"]


@dataclass(frozen=True, slots=True)
class Answered:
    """The backend answered the client itself; the attempt's lifecycle is closed."""

    response: web.StreamResponse


@dataclass(frozen=True, slots=True)
class NoInstance:
    """No instance is left for this request (all excluded, failed or removed)."""


NO_INSTANCE: Final = NoInstance()

OpenOutcome = Opened | Refused | Answered | NoInstance

D = TypeVar("D", Decision, PdDecision)


def decide(
    route: Callable[..., D], prepared: Prepared[Any], exclude: Sequence[str] | None, telemetry: ProxyTelemetry
) -> D | None:
    """Routes ``prepared``'s tokens with ``route`` (a ``Router``'s or a ``PdRouter``'s), counting
    the decision and its latency; None when every instance is excluded."""
    tokens = prepared.tokens
    t0 = time.perf_counter()
    try:
        d = route(
            tokens.ids,
            messages=prepared.messages,
            turn=prepared.turn,
            namespace=prepared.namespace,
            exclude=exclude,
            previous_instance=prepared.previous_instance,
            session_key=prepared.session_key,
        )
    except NoInstancesError:
        return None
    telemetry.record_decision(d, reason_label(d.reason), tokens.source, tokens.count, time.perf_counter() - t0)
    return d


"""What one :meth:`Backend.open` ends with."""


class Unsupported(Exception):
    """An operation the deployment mode does not support (its message says which)."""


class Backend(ABC):
    """A deployment mode (see the module docs)."""

    pools: Sequence[frozenset[str]] | None
    """Pools that must each keep an eligible instance for an attempt; None: the fleet is one."""
    resizable: bool = False
    """Whether :meth:`add_instance` / :meth:`remove_instance` are supported."""
    session_cookie: bool = False
    """Whether the router's policy is llm-d's session affinity: a request's ``llm-d-session``
    cookie is read as its ``previous_instance`` and answers set it (:mod:`smetric.serve.session`)."""
    hashes_session: bool = False
    """Whether the router's policy is one of vllm-router's hash policies: a request's session
    header is passed as its ``session_key`` (:data:`smetric.serve.session.HASH_POLICIES`)."""

    @abstractmethod
    async def open(
        self, prepared: Prepared[Any], headers: Mapping[str, str], attempt_no: int, exclude: list[str]
    ) -> OpenOutcome:
        """Routes attempt ``attempt_no`` without the ``exclude``\\ d instances and opens its answer."""

    @abstractmethod
    def feed_targets(self) -> FeedTargets:
        """Where the fleet's KV events and engine load go."""

    @abstractmethod
    def in_flight(self, urls: Iterable[str]) -> dict[str, int]:
        """Requests routed to each of ``urls`` and not finished (the router's load board; an
        instance the router does not know is left out)."""

    @abstractmethod
    def metrics_text(self, subscriber: Any, scraper: Any) -> str:
        """The router's families in the text format (ends with a newline, or empty)."""

    @abstractmethod
    def metric_lines(self) -> list[str]:
        """The backend's own families, after the proxy's."""

    def add_instance(self, url: str, host_pool: str | None = None) -> None:
        """Adds an instance to the router, its CPU KV$ in ``host_pool`` (a node's shared pool;
        None: its own). Raises :class:`Unsupported`."""
        raise Unsupported("adding or removing instances is not supported in this mode")

    def remove_instance(self, url: str) -> None:
        """Removes an instance from the router. Raises :class:`Unsupported`."""
        raise Unsupported("adding or removing instances is not supported in this mode")


async def open_unrouted(
    backend: Backend,
    upstream: Upstream,
    candidates: Iterable[str],
    prepared: Prepared[Any],
    headers: Mapping[str, str],
    attempt_no: int,
    exclude: list[str],
) -> OpenOutcome:
    """Opens a request that is not routed (``Prepared.routed`` false: a pass-through, a stored
    response's route) on the least-loaded of ``candidates`` not excluded — no routing decision,
    no KV accounting, no lifecycle on the load board. O(candidates)."""
    skip = set(exclude)
    eligible = [url for url in candidates if url not in skip]
    if not eligible:
        return NO_INSTANCE
    load = backend.in_flight(eligible)
    instance = min(eligible, key=lambda url: load.get(url, 0))
    attempt = Attempt(instance, f"instance={instance}; reason=pass-through; attempt={attempt_no}")
    return await upstream.post(attempt, prepared.path, prepared.body, headers, method=prepared.method)
