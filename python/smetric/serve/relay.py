"""The relay: an upstream answer to the client, whole or as a stream, with the attempt's
lifecycle and the state a continuation needs when a stream is cut.

* :func:`read_whole`: a non-streamed answer, read whole and sent with the decision header;
* :func:`relay_stream`: an event stream. A first attempt is forwarded chunk by chunk as the bytes
  arrive (O(chunk bytes): the API's :class:`~smetric.serve.apis.base.StreamState` only scans);
  a continuation (the client stream already started) event by event, its first event dropped
  when it repeats the stream's opening;
* :func:`end_stream`: ends a started stream with the API's error event.

Outcomes are typed: :class:`Relayed` (the client has its answer) or :class:`Cut` (the attempt
failed; ``response`` is the client stream when its headers are out — continue it — else None:
retry as it was). Invariants: every path reports the attempt exactly once (``finish`` when the
answer is complete, ``abort`` otherwise, :mod:`smetric.serve.attempt`); a client that goes away
aborts the attempt and closes the upstream connection (vLLM then aborts the request).
May import: :mod:`smetric.serve.apis.base`, ``.attempt``, ``.errors``, ``.telemetry``, ``.upstream``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from smetric.serve.apis.base import Api, StreamState
from smetric.serve.errors import ProxyError
from smetric.serve.telemetry import ProxyTelemetry
from smetric.serve.upstream import RETRYABLE, Opened, answer_headers

__all__ = ["STREAM_KEY", "Cut", "Relayed", "end_stream", "read_whole", "relay_stream"]

STREAM_KEY = web.RequestKey("smetric.stream", web.StreamResponse)
"""Where a request keeps its client stream once the headers are sent (for a timeout's error event)."""


@dataclass(frozen=True, slots=True)
class Relayed:
    """The client has its answer (complete, an engine's error, or a client gone mid-stream)."""

    response: web.StreamResponse


@dataclass(frozen=True, slots=True)
class Cut:
    """The attempt failed at its instance before the answer was complete."""

    cause: str
    state: StreamState | None
    """The stream so far (None for a whole answer)."""
    response: web.StreamResponse | None
    """The client stream when its headers were sent (then it must be continued or ended)."""


async def read_whole(
    api: Api[Any], opened: Opened, telemetry: ProxyTelemetry, partial: web.StreamResponse | None
) -> Relayed | Cut:
    """Reads a non-streamed answer and relays it with the decision header."""
    attempt, upstream = opened.attempt, opened.upstream
    try:
        data = await upstream.read()
    except RETRYABLE as e:
        attempt.abort()
        return Cut(type(e).__name__, None, partial)
    telemetry.first_byte_s.observe(time.perf_counter() - opened.started)
    attempt.first_byte()
    attempt.finish(api.output_tokens(data) if upstream.status == 200 else 0)
    headers = answer_headers(upstream.headers, attempt)
    data = api.relay_body(data, attempt.instance)
    return Relayed(web.Response(body=data, status=upstream.status, headers=headers))


async def relay_stream(
    request: web.Request,
    opened: Opened,
    state: StreamState,
    response: web.StreamResponse | None,
    *,
    idle_timeout_s: float,
    telemetry: ProxyTelemetry,
) -> Relayed | Cut:
    """Relays an event stream (``response`` given: a continuation of that client stream)."""
    attempt, upstream = opened.attempt, opened.upstream
    continuation = response is not None
    before = state.tokens
    first_event = continuation
    state.begin(attempt.instance)
    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout_s):
                    chunk = await upstream.content.readany()
            except RETRYABLE as e:
                attempt.abort()
                if state.finished:  # the answer was complete; only the end marker was lost
                    break
                return Cut(type(e).__name__, state, response)
            if not chunk:
                if not state.done and not state.finished:
                    attempt.abort()
                    return Cut("stream_cut", state, response)
                break
            if response is None:
                telemetry.first_byte_s.observe(time.perf_counter() - opened.started)
                response = web.StreamResponse(status=upstream.status, headers=answer_headers(upstream.headers, attempt))
                await response.prepare(request)
                request[STREAM_KEY] = response
            attempt.first_byte()
            events = state.feed(chunk)
            if not continuation and not state.hide_usage:
                await response.write(state.outgoing(chunk, events))
                continue
            out = events
            if first_event and out:
                first_event = False
                if state.drops_on_continuation(out[0]):
                    state.forget(out[0])
                    out = out[1:]
            if state.hide_usage:
                out = [event for event in out if state.shown(event)]
            if out:
                await response.write(state.outgoing(b"\n\n".join(out) + b"\n\n", out))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        attempt.abort()  # the client went away: close the upstream request with it
        upstream.close()
        assert response is not None
        return Relayed(response)
    if response is None:  # an empty 200 stream
        response = web.StreamResponse(status=upstream.status)
        await response.prepare(request)
    if not state.done:
        await response.write(state.end_marker)
    attempt.finish(max(0, state.tokens - before))
    await response.write_eof()
    return Relayed(response)


async def end_stream(api: Api[Any], response: web.StreamResponse, error: ProxyError) -> web.StreamResponse:
    """Ends a started stream with the API's error event (and its end marker)."""
    await response.write(api.stream_failure(error))
    await response.write_eof()
    return response
