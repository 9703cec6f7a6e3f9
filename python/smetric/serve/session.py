"""Session hints that clients already send, and the turn they imply.

The router is stateless: for chat requests it reads the turn from the history the request
carries (no assistant message yet = the first turn). A completions request carries no roles, so
there the proxy uses a session hint when the client sends one: the first request it sees under
a key is turn 1, the next turn 2, and so on. No hint is ever required; without one the router
infers the turn from its index (a prompt whose prefix is not yet known is a first turn).

Hints, first match wins (``docs/serve.md`` lists their origins):

1. ``x-session-id`` (explicit; OpenCode, vLLM's own header), ``x-claude-code-session-id`` joined
   with ``x-claude-code-agent-id`` (a Claude Code sub-agent starts a history of its own, so it is
   a session of its own), ``thread-id`` (Codex CLI: one thread; its ``session-id`` names the whole
   agent tree, whose sub-agents have histories of their own), ``session-id`` (older Codex),
   ``x-dynamo-session-id``;
2. the body's ``session_id`` (vLLM), ``prompt_cache_key`` (OpenAI), ``user``.

:class:`SessionTable` is an LRU of at most ``capacity`` keys (O(1) per request); a key unseen for
``ttl_s`` starts over at turn 1. Hints are the client's and may be megabytes long: the table keeps
only a fixed-size digest of each (BLAKE2b, 16 bytes; hashing is O(hint length) once per request),
so it is bounded in bytes as well as entries — about :data:`ENTRY_BYTES` per entry, whatever the
clients send (``tests/serve/test_hostile_state.py`` measures it).

**vllm-router's hash policies** (``--policy consistent_hash`` / ``rendezvous_hash``): the
request's header hint (the headers of rule 1; vllm-router's own list starts with
``x-session-id`` too) is passed to the router as its ``session_key``; without one they hash the
prompt.

**llm-d's session cookie** (for ``--policy llmd_session_affinity``, llm-d's session-affinity
scorer as smetric's core ports it): the answer sets ``llm-d-session`` to the base64 of the instance
that served it, as llm-d's ``SessionAffinity.ResponseReceived`` does (``Path=/; HttpOnly;
SameSite=Lax``, only when the request's cookie did not already say so), and a request's cookie
names its ``previous_instance`` (:func:`affinity_instance`; a value that is not base64 of UTF-8
text names none, as llm-d ignores it). No state: the client carries the session's instance.

Several proxy replicas keep separate tables: a session whose requests alternate between
replicas is seen as starting over on each, which only costs the balanced placement of what is
really a follow-up — the index still finds its KV$.

May import: the standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

AFFINITY_COOKIE = "llm-d-session"
"""llm-d's session-affinity cookie: the base64 of the instance that served the session last."""
AFFINITY_POLICY = "llmd_session_affinity"
"""The policy that reads the cookie (as ``previous_instance``) and whose answers set it."""
HASH_POLICIES = frozenset({"consistent_hash", "rendezvous_hash"})
"""vllm-router's hash policies: they hash the request's session hint (``Router.route``'s
``session_key``; vllm-router reads ``x-session-id`` first), else the prompt."""

_HEADER_HINTS = ("x-session-id", "x-claude-code-session-id", "thread-id", "session-id", "x-dynamo-session-id")


@dataclass(frozen=True, slots=True)
class SessionHint:
    """A session key and where it came from (a header name or a body field)."""

    key: str
    source: str


def session_hint(
    headers: Mapping[str, str],
    *,
    session_id: str | None = None,
    prompt_cache_key: str | None = None,
    user: str | None = None,
) -> SessionHint | None:
    """The request's session hint, or None (see the module docs for the order)."""
    for name in _HEADER_HINTS:
        value = headers.get(name)
        if value:
            if name == "x-claude-code-session-id":
                agent = headers.get("x-claude-code-agent-id")
                if agent:
                    return SessionHint(f"{value}/{agent}", name)
            return SessionHint(value, name)
    for source, value in (("session_id", session_id), ("prompt_cache_key", prompt_cache_key), ("user", user)):
        if value:
            return SessionHint(value, source)
    return None


ENTRY_BYTES = 250
"""An upper bound of one table entry's memory (digest, turn and time, the LRU's links), bytes."""


def session_digest(key: str) -> bytes:
    """The fixed-size form a session key is kept in (any ``str``, lone surrogates included)."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class SessionTable:
    """Turns routed per session key: a bounded LRU with an idle timeout, keyed by digests."""

    def __init__(self, capacity: int = 100_000, ttl_s: float = 3600.0) -> None:
        if capacity < 1 or ttl_s <= 0:
            raise ValueError("capacity must be >= 1 and ttl_s > 0")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._turns: OrderedDict[bytes, tuple[int, float]] = OrderedDict()

    def next_turn(self, key: str, now: float | None = None) -> int:
        """Counts a request of session ``key`` and returns its turn (1 for a new or idle key)."""
        now = time.monotonic() if now is None else now
        digest = session_digest(key)
        seen = self._turns.pop(digest, None)
        turn = 1 if seen is None or now - seen[1] > self.ttl_s else seen[0] + 1
        self._turns[digest] = (turn, now)
        if len(self._turns) > self.capacity:
            self._turns.popitem(last=False)
        return turn

    def __len__(self) -> int:
        return len(self._turns)


def affinity_instance(headers: Mapping[str, str]) -> str | None:
    """The instance a request's ``llm-d-session`` cookie names, or None (no cookie, or a value
    that is not base64 of UTF-8 text). O(length of the ``Cookie`` header)."""
    for pair in headers.get("cookie", "").split(";"):
        name, sep, value = pair.strip().partition("=")
        if sep and name == AFFINITY_COOKIE:
            try:
                return base64.b64decode(value, validate=True).decode()
            except (binascii.Error, ValueError):
                return None
    return None


def affinity_cookie(instance: str) -> str:
    """The ``Set-Cookie`` value that names ``instance`` as the session's, as llm-d sets it."""
    token = base64.b64encode(instance.encode()).decode()
    return f"{AFFINITY_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"


def affinity_set_cookie(previous: str | None, chosen: str) -> str | None:
    """The ``Set-Cookie`` an answer from ``chosen`` carries when the request's cookie named
    ``previous``: none when it already named ``chosen`` (llm-d sets it only when it differs)."""
    return None if previous == chosen else affinity_cookie(chosen)
