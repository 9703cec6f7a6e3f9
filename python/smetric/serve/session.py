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

:class:`SessionTable` (``smetric._core``; ``rust/smetric-gateway/src/session_table.rs``) is an LRU
of at most ``capacity`` keys (O(1) per request); a key unseen for ``ttl_s`` starts over at turn 1.
One table serves the app and the gateway's native path: both read and write the same one.
Hints are the client's and may be megabytes long: the table keeps only a fixed-size digest of each
(SHA-256's first 16 bytes; O(hint length) once per request), so it is bounded in bytes as well as
entries — at most :data:`ENTRY_BYTES` per entry, whatever the clients send
(``tests/serve/test_hostile_state.py`` measures it).

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

**A session's home and its sub-agents** (``docs/serve.md``, "Session life"): the table also
keeps, per header session key, the instance that answered the session's last request (its
*home*; :meth:`SessionTable.place`). A sub-agent names its parent (:func:`parent_key`: Codex's
``x-codex-parent-thread-id``, Claude Code's ``x-claude-code-parent-agent-id`` or, for a
top-level sub-agent, its root session, OpenCode's ``x-parent-session-id``, Dynamo's
``x-dynamo-parent-session-id``); its first request may start at the parent's home
(:meth:`smetric.serve.failover.Failover.serve`, the margin rule).

**The end of a session** (:func:`session_end`: ``x-session-end: true``, or Dynamo's
``x-dynamo-session-final: true``, on the session's last request; or ``POST
/v1/sessions/{id}/end`` / vllm-router's ``POST /finish_session?session_id=``):
:meth:`SessionTable.end` drops the session's entry — its turn count and its home — at once, so a
later request under the same key starts over at turn 1 and a later sub-agent of it is placed as
any first turn. Ids taken by the endpoint are checked by :func:`session_id_problem`.

May import: the standard library, and from :mod:`smetric._core` the table's entry bound and the
shared header constants (defined once in the compiled gateway, ``rust/smetric-gateway/src/shared.rs``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from smetric._core import (
    SESSION_ENTRY_BYTES,
    SHARED_AFFINITY_ATTRIBUTES,
    SHARED_AFFINITY_COOKIE,
    SHARED_BAD_END_HEADER,
    SHARED_END_HEADERS,
    SHARED_MAX_SESSION_ID_BYTES,
    SHARED_PARENT_HEADERS,
    SHARED_SESSION_HEADERS,
    SHARED_SESSION_ID_CONTROL,
    SHARED_SESSION_ID_EMPTY,
    SHARED_SESSION_ID_TOO_LONG,
)

AFFINITY_COOKIE: str = SHARED_AFFINITY_COOKIE
"""llm-d's session-affinity cookie: the base64 of the instance that served the session last."""
AFFINITY_POLICY = "llmd_session_affinity"
"""The policy that reads the cookie (as ``previous_instance``) and whose answers set it."""
HASH_POLICIES = frozenset({"consistent_hash", "rendezvous_hash"})
"""vllm-router's hash policies: they hash the request's session hint (``Router.route``'s
``session_key``; vllm-router reads ``x-session-id`` first), else the prompt."""

_HEADER_HINTS: tuple[str, ...] = SHARED_SESSION_HEADERS
"""Headers naming a request's session, in the order they are read. This and the two below are
defined once, in the compiled gateway's ``shared`` constants, which reads the same headers."""
PARENT_HEADERS: tuple[str, ...] = SHARED_PARENT_HEADERS
"""Headers naming the agent a request's agent was spawned by (Codex, Claude Code, OpenCode,
Dynamo), in the order :func:`parent_key` reads them."""
END_HEADERS: tuple[str, ...] = SHARED_END_HEADERS
"""Headers marking a session's last request (smetric's, Dynamo's): ``true`` or ``false``."""
MAX_SESSION_ID_BYTES: int = SHARED_MAX_SESSION_ID_BYTES
"""The longest session id the end endpoint takes (UTF-8 bytes); the agents' ids are UUIDs
(36 bytes) or shorter, Claude Code's sub-agent key two of them."""


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


def parent_key(headers: Mapping[str, str]) -> str | None:
    """The session key of the request's parent agent (the key :func:`session_hint` gives the
    parent's own requests), or None: not a sub-agent's request.

    Claude Code: a sub-agent's request carries the root's ``x-claude-code-session-id`` and its
    own ``x-claude-code-agent-id``; its parent is ``{session}/{x-claude-code-parent-agent-id}``
    (a nested sub-agent) or the root session (a top-level one, no parent header). A parent
    header on a request without an agent id (the root's) is ignored, as Dynamo does."""
    session = headers.get("x-claude-code-session-id")
    if session:
        if not headers.get("x-claude-code-agent-id"):
            return None
        parent = headers.get("x-claude-code-parent-agent-id")
        return f"{session}/{parent}" if parent else session
    for name in PARENT_HEADERS:
        value = headers.get(name)
        if value and name != "x-claude-code-parent-agent-id":
            return value
    return None


def session_end(headers: Mapping[str, str]) -> bool:
    """Whether the request is its session's last (an :data:`END_HEADERS` header is ``true``).

    Raises:
        ValueError: a value other than ``true`` / ``false`` / ``1`` / ``0`` (any case); the
            proxy answers it with a 400 naming the header.
    """
    ended = False
    for name in END_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        word = value.strip().lower()
        if word in ("true", "1"):
            ended = True
        elif word not in ("false", "0"):
            raise ValueError(SHARED_BAD_END_HEADER.format(name=name))
    return ended


def session_id_problem(session_id: str) -> str | None:
    """What is wrong with a session id the end endpoint was given, or None: empty, over
    :data:`MAX_SESSION_ID_BYTES` bytes, or holding a control character (CR, LF, NUL, …: such an
    id could never have been a header value, so no session has it). O(length)."""
    if not session_id:
        return SHARED_SESSION_ID_EMPTY
    size = len(session_id.encode("utf-8", "surrogatepass"))
    if size > MAX_SESSION_ID_BYTES:
        return SHARED_SESSION_ID_TOO_LONG.format(size=size, max=MAX_SESSION_ID_BYTES)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in session_id):
        return SHARED_SESSION_ID_CONTROL
    return None


class TurnCounter(Protocol):
    """What counts a hinted request's turn: the session table (``SessionTable``), or a turn the
    gateway already counted in it (:class:`CountedTurn`)."""

    def next_turn(self, key: str, now: float | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class CountedTurn:
    """The turn the gateway counted in the shared table for a request it handed on (a failed
    attempt, a cut stream): the app routes with it and counts nothing again."""

    turn: int

    def next_turn(self, key: str, now: float | None = None) -> int:
        return self.turn


ENTRY_BYTES: int = SESSION_ENTRY_BYTES
"""An upper bound of one table entry's memory (digest, turn, time and home, the LRU's order),
bytes; the home is an interned instance name, shared by every entry that names it."""


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
    return f"{AFFINITY_COOKIE}={token}; {SHARED_AFFINITY_ATTRIBUTES}"


def affinity_set_cookie(previous: str | None, chosen: str, *, ended: bool = False) -> str | None:
    """The ``Set-Cookie`` an answer from ``chosen`` carries when the request's cookie named
    ``previous``: none when it already named ``chosen`` (llm-d sets it only when it differs);
    the cookie's deletion when the request ``ended`` its session."""
    if ended:
        return affinity_cleared_cookie()
    return None if previous == chosen else affinity_cookie(chosen)


def affinity_cleared_cookie() -> str:
    """The ``Set-Cookie`` that deletes the session cookie (an ended session's answer)."""
    return f"{AFFINITY_COOKIE}=; Max-Age=0; {SHARED_AFFINITY_ATTRIBUTES}"
