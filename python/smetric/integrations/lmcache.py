"""LMCache's controller as the truth of the global KV$ tier: what the fleet's LMCache instances hold.

LMCache (0.5.6) caches KV in 256-token *chunks*; each LMCache worker reports every chunk it admits
or evicts to the LMCache controller, which can then answer, for a prompt, how long a prefix the
fleet holds and where. Its CPU-tier stores do not reach vLLM's KV-event stream (LMCache#3532), so
the controller is the only source. This module asks it at route time and records the answer into
the router's global tier just before :meth:`smetric.Router.route` (``docs/integrations/lmcache.md``
has the measurements behind that choice and what is lost).

**Chunk keys** (:func:`chunk_keys`), as the controller computes them (``ChunkedTokenDatabase`` with
no engine config, pre-caching hash ``"builtin"``): ``key[i] = hash((key[i-1], tuple(chunk_i), ()))``
with Python's own ``hash``, chained from ``key[-1] = none_hash``, over chunks of ``chunk_size``
tokens, the trailing partial chunk included (``full_chunks_only`` drops it, as an engine's store
does). ``none_hash`` is 0 when the controller's process cannot import vLLM (the usual standalone
``lmcache_controller``); with vLLM importable LMCache derives it from ``PYTHONHASHSEED`` and it
must be passed. ``hash`` of a tuple of ints does not depend on
``PYTHONHASHSEED``, so the keys are the same in every CPython process (64-bit builds: hashes are
signed 64-bit ints). Complexity: O(n) tuple building and hashing, 1.4–4 µs per 256-token chunk
(32K tokens: 0.17–0.5 ms, measured on a loaded 2-core machine).

**Lookup** (:class:`ControllerClient` over the controller's HTTP ``POST /lookup``, or
:func:`lookup_in_process` on an embedded ``LMCacheControllerManager``): the controller walks the
prompt's chunk keys until the first key no registered instance holds, and reports, per instance
that held one of the walked chunks, ``(location, end)`` — ``end`` being the end of the last walked
chunk found on that instance. The fleet holds the prefix ``max(end)`` (:attr:`Lookup.prefix_tokens`).

**Feed** (:class:`GlobalTierFeed`): one lookup per routed prompt, then
``smetric.integrations._global_tier.record_prefix``; the router's global tier then agrees with the
controller on every block of that prompt's chain.
"""

from __future__ import annotations

import http.client
import importlib
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from smetric import Decision, Router
from smetric.errors import InvalidArgumentError, MissingExtraError
from smetric.integrations._global_tier import record_prefix

if TYPE_CHECKING:
    from smetric._core import _Tokens  # a list of ints or a token buffer (numpy int32/uint32/int64 array)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ControllerClient",
    "ControllerError",
    "GlobalTierFeed",
    "Holder",
    "Lookup",
    "chunk_keys",
    "lookup_in_process",
]

DEFAULT_CHUNK_SIZE = 256
"""LMCache's default ``chunk_size`` (config ``chunk_size``, env ``LMCACHE_CHUNK_SIZE``)."""


def chunk_keys(
    tokens: _Tokens, *, chunk_size: int = DEFAULT_CHUNK_SIZE, none_hash: int = 0, full_chunks_only: bool = False
) -> list[int]:
    """LMCache's chained chunk keys of a prompt, equal to its controller's (pre-caching hash ``"builtin"``).

    Args:
        tokens: the prompt's token ids.
        chunk_size: LMCache's ``chunk_size``.
        none_hash: the root of the chain (0 unless the controller's process imports vLLM).
        full_chunks_only: skip the trailing partial chunk, as an LMCache engine does when it stores
            (``save_unfull_chunk`` is false by default); the controller's lookup hashes it.

    Returns:
        One signed 64-bit int key per chunk, in prompt order.

    Raises:
        InvalidArgumentError: ``chunk_size`` is not positive.
    """
    if chunk_size <= 0:
        raise InvalidArgumentError(
            f"chunk_size must be positive, got {chunk_size}", argument="chunk_size", reason="not positive"
        )
    tokens = _int_list(tokens)
    end = len(tokens) - len(tokens) % chunk_size if full_chunks_only else len(tokens)
    keys = []
    key = none_hash
    for start in range(0, end, chunk_size):
        key = hash((key, tuple(tokens[start : start + chunk_size]), ()))
        keys.append(key)
    return keys


def _int_list(tokens: _Tokens) -> list[int]:
    # A numpy array's ``tolist`` gives Python ints (JSON-serialisable, hashed like LMCache's list) in one C loop.
    tolist = getattr(tokens, "tolist", None)
    return list(tokens) if tolist is None else list(tolist())


@dataclass(frozen=True, slots=True)
class Holder:
    """One entry of the controller's ``layout_info``: an LMCache instance found on the prompt's prefix walk."""

    instance_id: str
    """The LMCache instance id (``lmcache_instance_id``; :meth:`ControllerClient.query_instance` maps an IP to it)."""
    location: str
    """The LMCache storage backend holding the chunk (``"LocalCPUBackend"``, ``"LocalDiskBackend"``, ``"P2PBackend"``,
    ``"RemoteBackend…"``; whatever the worker reported)."""
    end: int
    """The end (in tokens) of the last walked chunk this instance held."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """The controller's answer for one prompt."""

    holders: tuple[Holder, ...]
    """Every instance the prefix walk found a chunk on, in the controller's order."""

    @property
    def prefix_tokens(self) -> int:
        """How many leading tokens of the prompt the fleet's LMCache instances hold (0 if none)."""
        return max((h.end for h in self.holders), default=0)

    @classmethod
    def from_layout(cls, layout_info: Mapping[str, Sequence[Any]]) -> Lookup:
        """From the controller's ``layout_info`` (``{instance_id: (location, end)}``)."""
        return cls(tuple(Holder(inst, str(loc), int(end)) for inst, (loc, end) in layout_info.items()))


class ControllerError(RuntimeError):
    """The LMCache controller answered with an HTTP error or a body this module cannot read."""

    def __init__(self, path: str, status: int, body: str) -> None:
        super().__init__(f"LMCache controller {path}: HTTP {status}: {body[:200]}")
        self.path = path
        self.status = status
        self.body = body


class ControllerClient:
    """A client of the standalone LMCache controller's HTTP API (``lmcache_controller --port 9000``).

    Keeps one keep-alive connection (``http.client``; no dependency) and reconnects once when the
    server closed it. Not thread-safe: give each routing thread its own client.

    Args:
        url: the controller's base URL, e.g. ``"http://10.0.0.5:9000"``.
        timeout: seconds to wait for a reply.
    """

    def __init__(self, url: str, *, timeout: float = 1.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise InvalidArgumentError(
                f"expected an http://host:port URL, got {url!r}", argument="url", reason="not http"
            )
        self._host = parsed.hostname
        self._port = parsed.port or 80
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def lookup(self, tokens: _Tokens) -> Lookup:
        """``POST /lookup``: where the fleet's LMCache instances hold the prompt's prefix."""
        doc = self._post("/lookup", {"tokens": _int_list(tokens)})
        layout = doc.get("layout_info")
        if not isinstance(layout, dict):
            raise ControllerError("/lookup", 200, json.dumps(doc))
        return Lookup.from_layout(layout)

    def query_instance(self, ip: str) -> str:
        """``POST /query_instance``: the LMCache instance id registered from ``ip``."""
        # The endpoint requires an event_id in the body (0.5.6) and replaces it with its own.
        doc = self._post("/query_instance", {"event_id": "smetric", "ip": ip})
        return str(doc["res"])

    def close(self) -> None:
        """Closes the connection (a later call reopens it)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            try:
                self._conn.request("POST", path, payload, headers)
                response = self._conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed in between: retry once on a fresh one.
                self.close()
                if attempt:
                    raise
                continue
            if response.status != 200:
                raise ControllerError(path, response.status, data.decode(errors="replace"))
            doc: dict[str, Any] = json.loads(data)
            return doc
        raise AssertionError("unreachable")


class _OrchestrationHandler(Protocol):
    def handle_orchestration_message(self, msg: Any, /) -> Awaitable[Any]: ...


async def lookup_in_process(manager: _OrchestrationHandler, tokens: _Tokens, *, event_id: str = "") -> Lookup:
    """Asks an ``LMCacheControllerManager`` embedded in this process (as production-stack's kvaware router does).

    Needs lmcache (``pip install 'smetric-router[lmcache]'``); the HTTP client needs nothing.

    Raises:
        MissingExtraError: lmcache is not installed.
        ControllerError: the controller answered with an error message.
    """
    try:
        # Imported by name: lmcache is optional and ships no type information.
        message = importlib.import_module("lmcache.v1.cache_controller.message")
    except ModuleNotFoundError as e:
        raise MissingExtraError(
            "smetric.integrations.lmcache.lookup_in_process", "lmcache", "lmcache", name=e.name
        ) from e
    ret = await manager.handle_orchestration_message(message.LookupMsg(event_id=event_id, tokens=_int_list(tokens)))
    if not isinstance(ret, message.LookupRetMsg):
        raise ControllerError("LookupMsg", 0, repr(ret))
    return Lookup.from_layout(ret.layout_info)


class GlobalTierFeed:
    """Routes each prompt after recording what LMCache holds of it into the router's global tier.

    Args:
        router: the router to feed (its ``RouterConfig.global_capacity_blocks`` must be positive).
        lookup: one prompt → :class:`Lookup`, e.g. ``ControllerClient(url).lookup``; ``None`` when the
            caller looks up itself (``await lookup_in_process(...)``) and calls :meth:`record`.

    Attributes:
        last: the controller's answer for the last prompt (the per-instance detail the router drops).
    """

    def __init__(self, router: Router, lookup: Callable[[_Tokens], Lookup] | None = None) -> None:
        self.router = router
        self._lookup = lookup
        self.last: Lookup | None = None

    def record(self, tokens: _Tokens, found: Lookup, *, namespace: str | None = None) -> None:
        """Records the controller's answer for a prompt into the router's global tier."""
        self.last = found
        record_prefix(self.router, tokens, found.prefix_tokens, namespace=namespace)

    def refresh(self, tokens: _Tokens, *, namespace: str | None = None) -> Lookup:
        """Looks the prompt up and records the answer; returns the answer.

        Raises:
            InvalidArgumentError: the feed was built without a ``lookup``.
        """
        if self._lookup is None:
            raise InvalidArgumentError("this feed has no lookup: call record()", argument="lookup", reason="None")
        found = self._lookup(tokens)
        self.record(tokens, found, namespace=namespace)
        return found

    def route(self, tokens: _Tokens, *, namespace: str | None = None, **route_kwargs: Any) -> Decision:
        """:meth:`refresh`, then ``router.route`` (other arguments are passed through)."""
        self.refresh(tokens, namespace=namespace)
        return self.router.route(tokens, namespace=namespace, **route_kwargs)
