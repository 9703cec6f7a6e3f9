"""Client API keys at the proxy: which requests must carry one, where it is read from, and the
401 in the API's own error shape.

Keys come from ``api_keys`` (a list) and ``api_keys_file`` (one key per line; blank lines and
``#`` comments ignored), read once at start. A request presents its key as ``Authorization:
Bearer <key>`` (OpenAI's SDKs) or ``x-api-key: <key>`` (Anthropic's). With no key configured the
proxy is open, as before. Every path is guarded but ``/health`` and ``/metrics`` (probes and
Prometheus scrapes carry no credentials and see no prompt) and ``/admin/…`` (its own
``admin_token``). The key the proxy puts on its own calls to engines is a separate setting
(``upstream_api_key``, applied by :class:`smetric.serve.upstream.Upstream`), and a client's key
is never forwarded to an engine while client keys are on.

Invariants: a presented key is compared with every configured key in constant time per key (on
their SHA-256 digests, so neither the content nor the length of a key leaks through timing), and
the loop does not stop at a match; a refusal holds no admission slot (the check runs first).
Costs: O(keys) digests per guarded request. May import: :mod:`smetric.serve.apis.base`,
:mod:`smetric.serve.errors`, :mod:`smetric.metrics`, ``aiohttp.web``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from smetric.errors import InvalidConfigError
from smetric.metrics import _family
from smetric.serve.apis.base import Api
from smetric.serve.errors import ProxyError

__all__ = ["OPEN_PATHS", "ClientKeys", "keys_middleware", "presented_key", "read_keys_file"]

OPEN_PATHS = ("/health", "/metrics")
"""Paths answered without a client key."""
_ADMIN_PREFIX = "/admin/"

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def read_keys_file(path: str | Path) -> list[str]:
    """The keys of a file: one a line, blank lines and ``#`` comments ignored.

    Raises:
        InvalidConfigError: the file cannot be read.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidConfigError(
            f"invalid serve setting api_keys_file: {e}", field="api_keys_file", reason=str(e)
        ) from e
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents: ``Authorization: Bearer <key>``, else ``x-api-key``."""
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key is not None and key.strip() else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", errors="surrogateescape")).digest()


class ClientKeys:
    """The configured client keys (none: the proxy is open)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(k) for k in dict.fromkeys(k for k in keys if k)]
        self.refused = 0
        """Requests answered 401."""

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @staticmethod
    def guards(path: str) -> bool:
        """Whether ``path`` needs a client key (when keys are on)."""
        return path not in OPEN_PATHS and not path.startswith(_ADMIN_PREFIX)

    def accepts(self, headers: Mapping[str, str]) -> bool:
        """Whether the request presents one of the keys (always, when no key is configured)."""
        if not self._digests:
            return True
        given = presented_key(headers)
        if given is None:
            return False
        probe = _digest(given)
        matched = False
        for digest in self._digests:  # no early exit: the time does not depend on which key matched
            matched |= hmac.compare_digest(probe, digest)
        return matched

    def render(self, prefix: str = "smetric") -> Iterator[str]:
        yield from _family(
            f"{prefix}_proxy_unauthorized_total",
            "counter",
            "Requests refused with 401 for a missing or unknown client API key.",
            [({}, self.refused)] if self.enabled else [],
        )


def unauthorized() -> ProxyError:
    return ProxyError(
        401, "a valid API key is required (Authorization: Bearer <key> or x-api-key: <key>)", "AuthenticationError"
    )


def keys_middleware(keys: ClientKeys, api_for: Callable[[str], Api[Any]]) -> Any:
    """An aiohttp middleware answering 401 (in the shape of the API ``api_for(path)`` names) to a
    guarded request without a valid key."""

    @web.middleware
    async def check_key(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if keys.enabled and keys.guards(request.path) and not keys.accepts(request.headers):
            keys.refused += 1
            response = api_for(request.path).fail(unauthorized())
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await handler(request)

    return check_key
