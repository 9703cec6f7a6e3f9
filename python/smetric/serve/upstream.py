"""The proxy's side of its calls to engines: which headers travel, which failures may be retried,
and the one HTTP client every call goes through.

* :func:`forwardable` drops RFC 9110 §7.6.1 hop-by-hop fields (and any ``Connection`` names),
  ``Host`` and ``Content-Length`` from a header map, in one pass;
* :data:`RETRYABLE` is what counts as the instance's failure (connection, payload, timeout);
  of the 5xx answers only :data:`OWN_STATUSES` (502–504: a gateway's or an unreachable engine's)
  are the instance's own — another 5xx may be the request's doing (:attr:`Refused.own`);
* :class:`Upstream` owns the ``aiohttp.ClientSession`` (no pool limit, no decompression: bodies
  pass through as the engine sent them) and the attempt's POST (:meth:`Upstream.post`, a typed
  :class:`Opened` or :class:`Refused`), and the short GETs of discovery and health;
* the proxy's own credential on every call it makes (``upstream_api_key``: ``Authorization:
  Bearer``, as vLLM's ``--api-key`` expects), and a client's credential (``Authorization``,
  ``x-api-key``) dropped when the proxy checks client keys itself or has its own.

Invariants: the proxy fetches only configured instance URLs, never a URL taken from a request; a
refused attempt has its lifecycle closed (``abort``) before :meth:`Upstream.post` returns.
May import: :mod:`smetric.serve.attempt`, ``aiohttp``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from smetric._core import SHARED_HOP_BY_HOP
from smetric.serve.attempt import Attempt

__all__ = ["HOP_BY_HOP", "OWN_STATUSES", "RETRYABLE", "Opened", "Refused", "Upstream", "forwardable"]

HOP_BY_HOP = frozenset(SHARED_HOP_BY_HOP)
"""RFC 9110 §7.6.1 hop-by-hop fields, never forwarded (nor any field ``Connection`` names)."""
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
_CREDENTIALS = frozenset({"authorization", "x-api-key"})
"""A client's credential for the proxy: never sent on to an engine when the proxy checks keys."""

RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)
"""Failures of the instance (not of the request): the attempt is retried elsewhere."""

OWN_STATUSES = frozenset({502, 503, 504})
"""5xx statuses that say the instance (or what stands in front of it) failed, whatever the
request: a bad gateway, an unavailable or a timed-out engine. Any other 5xx (a 500 above all)
can be a request's deterministic failure — an engine crashing on one body does so everywhere."""


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without hop-by-hop fields, those ``Connection`` names, ``Host`` and ``Content-Length``."""
    lowered = [(k.lower(), k, v) for k, v in headers.items()]
    named = {h.strip() for low, _, v in lowered if low == "connection" for h in v.lower().split(",") if h.strip()}
    return {k: v for low, k, v in lowered if low not in _NOT_FORWARDED and low not in named}


def answer_headers(headers: Mapping[str, str], attempt: Attempt) -> dict[str, str]:
    """The headers of the answer relayed for ``attempt``: the engine's :func:`forwardable` ones,
    ``x-smetric-decision``, and the attempt's ``Set-Cookie`` when it has one."""
    out = forwardable(headers)
    out["x-smetric-decision"] = attempt.header
    if attempt.cookie is not None:
        out["Set-Cookie"] = attempt.cookie
    return out


@dataclass(frozen=True, slots=True)
class Opened:
    """An attempt whose upstream answered with headers and a status below 500."""

    attempt: Attempt
    upstream: aiohttp.ClientResponse
    started: float
    """``time.perf_counter()`` when the POST was sent (the first-byte latency's origin)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """An attempt that failed before its first byte, at ``instance``: retry elsewhere."""

    instance: str
    cause: str
    """A connection error's class name, ``http_<status>``, or a protocol failure."""
    status: int | None = None
    """The engine's 5xx status, or None (no answer)."""

    @property
    def own(self) -> bool:
        """Whether the failure is the instance's whatever the request (no answer, or 502–504),
        so it is charged to its health at once; else only if another instance then serves the
        request (:mod:`smetric.serve.failover`)."""
        return self.status is None or self.status in OWN_STATUSES


class Upstream:
    """The proxy's one HTTP client to its engines (open it on the proxy's event loop)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        first_byte_timeout_s: float,
        api_key: str | None = None,
        drop_client_credentials: bool = False,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.auth: dict[str, str] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        """What every call to an engine carries (the upstream key), or nothing."""
        self._drop_credentials = drop_client_credentials or bool(api_key)
        self._first_byte_timeout_s = first_byte_timeout_s
        self._client: aiohttp.ClientSession | None = None

    def open(self) -> None:
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout_s, sock_read=self._first_byte_timeout_s
            ),
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise RuntimeError("the upstream client is not open")
        return self._client

    async def post(
        self, attempt: Attempt, path: str, body: bytes, headers: Mapping[str, str], *, method: str = "POST"
    ) -> Opened | Refused:
        """Sends an attempt's request (``method``, POST by default) to its instance; a connection
        error or a 5xx aborts the attempt."""
        started = time.perf_counter()
        url = attempt.instance
        if self._drop_credentials:
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS} | self.auth
        try:
            upstream = await self.client.request(method, url + path, data=body or None, headers=headers)
        except RETRYABLE as e:
            attempt.abort()
            return Refused(url, type(e).__name__)
        except BaseException:
            attempt.abort()
            raise
        if upstream.status >= 500:
            attempt.abort()
            upstream.release()
            return Refused(url, f"http_{upstream.status}", status=upstream.status)
        return Opened(attempt, upstream, started)

    async def healthy(self, url: str) -> bool:
        """``GET {url}/health`` answers 200 within the connect timeout."""
        try:
            async with self.client.get(
                f"{url}/health", headers=self.auth, timeout=aiohttp.ClientTimeout(total=self.connect_timeout_s)
            ) as r:
                return r.status == 200
        except RETRYABLE:
            return False

    async def model_cards(self, url: str) -> list[dict[str, Any]] | None:
        """The model cards of ``GET {url}/v1/models`` (those with a string ``id``), or None when
        the instance does not answer with them."""
        try:
            async with self.client.get(
                f"{url}/v1/models", headers=self.auth, timeout=aiohttp.ClientTimeout(total=self.connect_timeout_s)
            ) as r:
                if r.status != 200:
                    return None
                # Any content type: an engine's JSON is read as JSON whatever it is labelled.
                data = json.loads(await r.read()).get("data")
                return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        # Not JSON, not the shape, or an HTTP-level error (aiohttp.ClientError): not an answer.
        except (*RETRYABLE, aiohttp.ClientError, ValueError, AttributeError, TypeError, RecursionError):
            return None
