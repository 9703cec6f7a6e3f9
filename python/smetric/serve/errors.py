"""The one builder of OpenAI-style error bodies, and the typed error the proxy answers with.

Every error the proxy writes in OpenAI's shape — a request it rejects (:class:`smetric.serve.request.RequestError`),
a failure of its own (no instance left, a timeout, a bug), an admin refusal, the error event that ends a
cut stream — is built by :func:`openai_error`, so the shape lives in one place:
``{"error": {"message", "type", "param", "code"}}``. Which shape an endpoint answers in is its API
adapter's choice (:mod:`smetric.serve.apis`); this module only knows OpenAI's.

Invariants: pure data, no I/O, no aiohttp (:mod:`smetric.serve.request`, which the integrations import
without the ``serve`` extra, builds its bodies here). May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ProxyError", "openai_error"]


def openai_error(message: str, *, type: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class ProxyError:
    """An error the proxy answers itself (not an engine's): its HTTP status, message and kind.

    ``kind`` is the OpenAI SDK's class name for the status (``ServiceUnavailableError``, …); the
    OpenAI body carries the status as its ``code``, as the proxy always has.
    """

    status: int
    message: str
    kind: str
    param: str | None = None

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return openai_error(self.message, type=self.kind, param=self.param, code=self.status)

    @classmethod
    def unavailable(cls, message: str) -> ProxyError:
        """503: no instance could serve it, the proxy is draining, a stream could not be continued."""
        return cls(503, message, "ServiceUnavailableError")

    @classmethod
    def timeout(cls, message: str) -> ProxyError:
        """504: the request outlived ``client_timeout_s`` in the proxy."""
        return cls(504, message, "TimeoutError")

    @classmethod
    def internal(cls, message: str = "internal error in the proxy") -> ProxyError:
        """500: a bug in the proxy (logged; the proxy stays up)."""
        return cls(500, message, "InternalServerError")
