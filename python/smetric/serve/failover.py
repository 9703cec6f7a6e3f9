"""The attempt loop of one request: route, open, relay; on a failure, try elsewhere or continue.

Per attempt (``max_attempts`` in all): the fleet names the instances to skip
(:meth:`~smetric.serve.fleet.Fleet.exclusions`), the backend routes and opens the answer
(:mod:`smetric.serve.backends`), the relay forwards it (:mod:`smetric.serve.relay`). A failure
before the first byte reached the client — a connection error, a timeout, a 5xx — is retried
as it was on another instance. It counts against the instance only when it is the instance's
own: no answer, a timeout, 502–504 (:attr:`~smetric.serve.upstream.Refused.own`) at once; any
other 5xx only once another instance has served the same request (a 500 can be the request's
doing: a body that crashes every engine must not eject the fleet). A request answered with the
same such status by two instances is answered with it (in the API's shape), not retried
fleet-wide. A stream cut after its first chunk is
continued on another instance with the request its API builds
(:meth:`~smetric.serve.apis.base.Api.continuation`), or ended with the API's error event when it
cannot be continued. A request is lost only when no instance can serve it (503 in the API's shape).

Invariants: each attempt's lifecycle is closed on every path (the backend and the relay close it;
an exception here aborts it and closes the upstream connection, which makes vLLM abort the
request); a failed instance is not tried again by the same request. Cost beyond the parts: O(1)
per attempt, plus one load-board read per instance for the per-instance cap. May import:
:mod:`smetric.serve.admission`, ``.apis.base``, ``.backends.base``, ``.decision_log``, ``.errors``,
``.fleet``, ``.relay``, ``.telemetry``, ``.tokens``, ``.upstream``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from smetric._core import SHARED_CUT_MESSAGE, SHARED_LOST_STATE, SHARED_LOST_STATE_FAILED, SHARED_LOST_STATE_LEFT
from smetric.serve.admission import skip_full
from smetric.serve.apis.base import Api, Prepared, StreamState
from smetric.serve.backends.base import Answered, Backend, NoInstance
from smetric.serve.config import ServeConfig
from smetric.serve.decision_log import note_answer, note_attempt, note_grouping, note_prepared, with_request_id
from smetric.serve.errors import ProxyError
from smetric.serve.fleet import Fleet
from smetric.serve.pinning import resolve
from smetric.serve.relay import Relayed, end_stream, read_whole, relay_stream
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.tokens import TokenSource
from smetric.serve.upstream import Refused, forwardable

__all__ = ["CUT_MESSAGE", "Failover", "lost_state"]

CUT_MESSAGE: str = SHARED_CUT_MESSAGE
"""The error a cut stream ends with when it could not be continued (the gateway and the app both send it)."""


def lost_state(instance: str | None, cause: str) -> ProxyError:
    """The answer to a pinned request whose instance is gone (404) or does not answer (503):
    the state it names lived there only."""
    where = (
        SHARED_LOST_STATE_LEFT if instance is None else SHARED_LOST_STATE_FAILED.format(instance=instance, cause=cause)
    )
    message = SHARED_LOST_STATE.format(where=where)
    if instance is None:
        return ProxyError(404, message, "NotFoundError", "previous_response_id")
    return ProxyError(503, message, "ServiceUnavailableError", "previous_response_id")


class Failover:
    """Serves prepared requests over a backend, with failover and stream continuation."""

    def __init__(
        self,
        config: ServeConfig,
        fleet: Fleet,
        backend: Backend,
        telemetry: ProxyTelemetry,
        tokens: TokenSource,
        admitted: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.backend = backend
        self.telemetry = telemetry
        self.tokens = tokens
        self.admitted: Callable[[], int] = admitted or (lambda: config.max_in_flight_per_instance)
        """Requests holding an admission slot now (the app's admission); unknown: assume a full load."""

    async def serve(
        self,
        request: web.Request,
        api: Api[Any],
        prepared: Prepared[Any],
    ) -> web.StreamResponse:
        """The client's answer to ``prepared`` (see the module docs)."""
        fleet = self.fleet
        headers = with_request_id(forwardable(request.headers), request)
        note_prepared(request, prepared.model, prepared.turn, prepared.tokens.count)
        tried = _Tried()
        response: web.StreamResponse | None = None
        """The client stream, once its headers are out."""
        state: StreamState | None = None
        pinned = None if prepared.pin is None else resolve(prepared.pin, fleet.instances)
        if prepared.pin is not None and pinned is None:
            return api.fail(lost_state(None, ""))
        attempt_no = 0
        while attempt_no < self.config.max_attempts:
            attempt_no += 1
            if pinned is not None:  # only its instance can serve it, ejected or not
                if pinned in tried.failed:
                    return api.fail(lost_state(pinned, f"did not answer ({tried.causes[-1]})"))
                exclude: list[str] | None = [u for u in fleet.instances if u != pinned]
            else:
                exclude = fleet.exclusions(prepared.model, tried.failed, self.backend.pools)
                cap = self.config.max_in_flight_per_instance
                # The per-instance cap (a full instance only when nothing else is left) can bind
                # only once the proxy has admitted `cap` requests: below that the load board is
                # not read.
                if exclude is not None and self.admitted() >= cap:
                    exclude = skip_full(exclude, self.backend.in_flight(fleet.instances), cap, self.backend.pools)
                if prepared.group_instance is not None and exclude is not None and not tried.failed:
                    exclude = self._grouped(request, prepared.group_instance, exclude)
            opened = await self.backend.open(prepared, headers, attempt_no, exclude) if exclude is not None else None
            if opened is None or isinstance(opened, NoInstance):
                attempt_no -= 1
                break
            if isinstance(opened, Refused):
                repeated = self._refused(opened, tried)
                if repeated is not None:
                    return api.fail(repeated)
                continue
            # Another instance took the request: the earlier 5xx were their own after all.
            for url, cause in tried.suspects:
                fleet.charge(url, cause)
            tried.suspects.clear()
            if isinstance(opened, Answered):
                return opened.response
            attempt, upstream = opened.attempt, opened.upstream
            note_attempt(request, attempt)
            stream: StreamState | None = None
            try:
                if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                    stream = state or api.stream(keep=self.config.resume_streams)
                    stream.hide_usage = stream.hide_usage or prepared.hide_usage
                    result = await relay_stream(
                        request,
                        opened,
                        stream,
                        response,
                        idle_timeout_s=self.config.idle_timeout_s,
                        telemetry=self.telemetry,
                    )
                else:
                    result = await read_whole(api, opened, self.telemetry, response)
                if isinstance(result, Relayed):
                    fleet.succeeded(attempt.instance)
                    if stream is not None:
                        note_answer(request, attempt, cached_tokens=stream.cached_tokens, output_tokens=stream.tokens)
                    elif isinstance(result.response, web.Response) and result.response.status == 200:
                        body = result.response.body
                        hit = api.realized_hit(body) if isinstance(body, bytes) else None
                        note_answer(request, attempt, cached_tokens=hit, output_tokens=None)
                    return result.response
                # The attempt failed: before any byte reached the client (retry as it was), or
                # mid-stream (continue the client's stream).
                tried.fail(attempt.instance, result.cause)
                fleet.failed(attempt.instance, result.cause)
                state, response = result.state, result.response
                if response is not None:
                    resumed = self._resumed(api, prepared, state)
                    if resumed is None:
                        return await end_stream(api, response, ProxyError.unavailable(CUT_MESSAGE))
                    prepared = resumed
            except BaseException:
                attempt.abort()
                upstream.close()  # the engine aborts a request whose connection closes
                raise
            finally:
                upstream.release()
        if response is not None:
            self.telemetry.unresumed_streams += 1
            return await end_stream(api, response, ProxyError.unavailable(CUT_MESSAGE))
        failed = ", ".join(tried.failed) or "none"
        return api.fail(
            ProxyError.unavailable(f"no instance could serve the request ({attempt_no} attempts; failed: {failed})")
        )

    def _grouped(self, request: web.Request, home: str, exclude: list[str]) -> list[str]:
        """The parent rule (``docs/serve.md``, "Session life"): a sub-agent's first request is
        routed among its parent's home alone when the home is a candidate and has at most
        ``parent_affinity_margin`` more requests in flight than the least busy candidate; else
        ``exclude`` as it was (the policy places it as any first turn). The policy still decides
        (its load accounting and index insert happen as for any request). O(instances)."""
        candidates = [u for u in self.fleet.instances if u not in exclude]
        if home not in candidates:
            outcome = "parent_unavailable"
        else:
            loads = self.backend.in_flight(candidates)
            least = min(loads.get(u, 0) for u in candidates)
            if loads.get(home, 0) <= least + self.config.parent_affinity_margin:
                outcome = "parent"
                exclude = [*exclude, *(u for u in candidates if u != home)]
            else:
                outcome = "overloaded"
        self.telemetry.parent_placements[outcome] += 1
        note_grouping(request, outcome)
        return exclude

    def _refused(self, refused: Refused, tried: _Tried) -> ProxyError | None:
        """Accounts an attempt that failed before its first byte; the error to answer when the
        same status came twice (the request's failure, not the instances')."""
        tried.fail(refused.instance, refused.cause)
        if refused.own:
            self.fleet.failed(refused.instance, refused.cause)
            return None
        self.fleet.retried(refused.cause)
        if refused.status in tried.statuses:
            return _repeated_failure(refused.status, len(tried.failed))
        if refused.status is not None:
            tried.statuses.add(refused.status)
        tried.suspects.append((refused.instance, refused.cause))
        return None

    def _resumed(self, api: Api[Any], prepared: Prepared[Any], state: StreamState | None) -> Prepared[Any] | None:
        """The request that continues a stream cut after ``state``, or None when it is not
        continued (off, or not faithfully possible); either is counted."""
        continued = None
        if state is not None and self.config.resume_streams:
            continued = api.continuation(prepared, state, self.tokens)
        if continued is None:
            self.telemetry.unresumed_streams += 1
            return None
        if continued.model in self.fleet.adapters:  # as the app does for the original
            continued = replace(continued, namespace=self.fleet.namespace(continued.model, continued.namespace))
        self.telemetry.resumed_streams += 1
        return continued


@dataclass(slots=True)
class _Tried:
    """What one request's attempts went through so far."""

    failed: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    statuses: set[int] = field(default_factory=set)
    suspects: list[tuple[str, str]] = field(default_factory=list)
    """Instances that answered a 5xx that may be the request's, not yet charged."""

    def fail(self, instance: str, cause: str) -> None:
        self.failed.append(instance)
        self.causes.append(cause)


def _repeated_failure(status: int, attempts: int) -> ProxyError:
    """The answer to a request that two instances failed with the same ``status`` (not 502–504)."""
    kind = "InternalServerError" if status == 500 else "APIError"
    return ProxyError(
        status,
        f"the engines failed this request with HTTP {status} on {attempts} instances; "
        "it is not retried further (the request itself is the likely cause)",
        kind,
    )
