"""The fuzz battery (issue 21 item 7): seeded random mutations of real request bodies, hostile
hint values, and a mixed burst of good and bad requests, through the proxy in front of three fake
engines. Each request's answer is checked — its status, the JSON error shape of every error, no
5xx of the proxy's own for client input — and at the end the proxy is healthy: ``/health`` 200,
the load board at 0, no traceback logged, RSS within :data:`RSS_BOUND`. Loopback only; bounded
in requests (:data:`MUTATIONS`, :data:`BURST`) and time (every request has a timeout)."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hostile_util import assert_healthy, error_of, hostile_proxy, rss_bytes
from proxy_util import request

from smetric.fake_engine import FakeEngine
from smetric.serve.proxy import ProxyServer

SEED = 21
MUTATIONS = 400
"""Mutated bodies sent (each a new seeded draw)."""
BURST = 300
"""Requests of the mixed burst (8 client threads)."""
RSS_BOUND = 64 << 20
"""Allowed RSS growth over the battery (the bodies sent total ≈ 100 MiB)."""

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SYSTEM = "You are a careful coding agent working in a large repository. " * 8

REAL_BODIES: list[tuple[str, dict[str, Any]]] = [
    (
        CHAT,
        {
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Refactor the parser."},
                {"role": "assistant", "content": "Done.", "tool_calls": []},
                {"role": "user", "content": [{"type": "text", "text": "Now the tests."}]},
            ],
            "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
            "max_tokens": 4,
            "stream": True,
            "user": "agent-7",
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3, "prompt_cache_key": "k"}),
    (COMPLETIONS, {"model": "fake-model", "prompt": SYSTEM + "def f():", "max_tokens": 3, "stream": False}),
    (COMPLETIONS, {"prompt": [1, 2, 3, 4, 5, 6, 7, 8] * 8, "max_tokens": 2, "stream": True, "cache_salt": "tenant"}),
]

HOSTILE_VALUES: list[Any] = [
    None,
    "",
    "\ud800",
    "\udfff\ud800",
    "\x00",
    "\u202e\ufeff",
    "x" * 100_000,
    -1,
    0,
    2**64,
    10**400,
    1e308,
    True,
    [],
    {},
    [[[[[]]]]],
    {"role": None},
    [{"role": "user"}],
    "NaN",
]
"""Replacement values: wrong types, boundary numbers, empty and huge strings, surrogates."""

RAW_INSERTS = [b"\x00", b"\xff", b"\\ud800", b'"', b"{", b"]", b",", b"[" * 5000, b"9" * 5000, b"\\", b"NaN", b"-"]


def _lone(value: Any) -> str:
    # json.dumps escapes lone surrogates (valid JSON text, invalid Unicode): what a client may send.
    return json.dumps(value)


def mutate(rng: random.Random) -> tuple[str, bytes]:
    """One seeded mutation of a real body: a structural one (a field replaced, dropped, nested) or
    a byte-level one (flip, truncate, insert, duplicate)."""
    path, original = rng.choice(REAL_BODIES)
    body = json.loads(json.dumps(original))
    op = rng.randrange(8)
    if op == 0:  # replace a top-level field
        body[rng.choice(sorted(body))] = rng.choice(HOSTILE_VALUES)
    elif op == 1:  # replace something inside the first message or prompt
        if "messages" in body:
            msg = body["messages"][rng.randrange(len(body["messages"]))]
            msg[rng.choice(["role", "content", "name", "tool_calls"])] = rng.choice(HOSTILE_VALUES)
        else:
            body["prompt"] = rng.choice(HOSTILE_VALUES)
    elif op == 2:  # drop a field
        body.pop(rng.choice(sorted(body)))
    elif op == 3:  # nest a field deeply
        depth = rng.choice([64, 900, 1100, 5000])
        value: Any = body.get("messages", body.get("prompt"))
        key = rng.choice(["messages", "tools", "chat_template_kwargs", "prompt", "unknown_field"])
        text = json.dumps({k: v for k, v in body.items() if k != key})
        nested = "[" * depth + json.dumps(value) + "]" * depth
        return path, (text[:-1] + f', "{key}": {nested}}}').encode()
    raw = bytearray(_lone(body).encode())
    if op == 4:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    elif op == 5:  # truncate
        del raw[rng.randrange(len(raw)) :]
    elif op == 6:  # insert hostile bytes
        at = rng.randrange(len(raw))
        raw[at:at] = rng.choice(RAW_INSERTS)
    else:  # duplicate a slice
        a = rng.randrange(len(raw))
        b = min(len(raw), a + rng.randint(1, 200))
        raw[b:b] = raw[a:b]
    return path, bytes(raw)


def check(status: int, headers: dict[str, str], body: bytes, tally: Counter[str]) -> None:
    """One answer of the battery: a success, or a 4xx in the JSON shape (every input here is a
    client's, so a 5xx — the proxy's or the engines' — is a failure)."""
    tally[str(status)] += 1
    if status == 200:
        return
    assert headers.get("content-type", "").startswith("application/json"), (status, body[:200])
    err = error_of(status, body)
    assert status < 500, ("no 5xx for a client's mistake", status, err)
    if status == 404:
        assert err["param"] == "model" and len(body) < 1000, err


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    started = [FakeEngine(port=0, speedup=1000).start() for _ in range(3)]
    yield started
    for e in started:
        e.stop()


@pytest.fixture
def proxy(engines: list[FakeEngine]) -> Iterator[ProxyServer]:
    p = hostile_proxy([e.url for e in engines], max_body_bytes=1 << 20)
    yield p
    p.stop()


def send(
    p: ProxyServer, path: str, raw: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return request(p.url, path, raw=raw, headers=headers)


def test_seeded_mutations_of_real_bodies(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(SEED)
    for path, original in REAL_BODIES:  # the unmutated bodies are served
        assert send(proxy, path, json.dumps(original).encode())[0] == 200
    before = rss_bytes()
    tally: Counter[str] = Counter()
    for _ in range(MUTATIONS):
        path, raw = mutate(rng)
        status, headers, body = send(proxy, path, raw)
        check(status, headers, body, tally)
    print("mutations by status:", dict(sorted(tally.items())))
    assert tally["400"] > MUTATIONS // 4, "most mutations are client mistakes the proxy refuses"
    assert proxy.proxy is not None and sum(proxy.proxy.telemetry.ejections.values()) == 0
    assert rss_bytes() - before < RSS_BOUND
    assert_healthy(proxy, caplog)


HOSTILE_HINTS: list[dict[str, str]] = [
    {"x-session-id": "s" * 8000},
    {"x-session-id": "\u00ff\u00fe".encode().decode("latin-1")},
    {"x-claude-code-session-id": "a", "x-claude-code-agent-id": "b" * 7000},
    {"session-id": "../../etc/passwd"},
    {"x-dynamo-session-id": "%00%0d%0a"},
    {"x-session-id": ""},
    {"x-session-id": "s" * 9000},  # over the engines' 8 KiB: refused before forwarding
]


def test_hostile_hint_values(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    tally: Counter[str] = Counter()
    body = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()
    for headers in HOSTILE_HINTS:
        status, got, answer = send(proxy, COMPLETIONS, body, headers)
        check(status, got, answer, tally)
        assert status in (200, 400, 431), (headers.keys(), status)
    for value in ("\ud800", "u" * 500_000, "\x00\x01", "é" * 1000):
        for field in ("user", "prompt_cache_key"):
            raw = json.dumps({"prompt": "hello", "max_tokens": 1, field: value}).encode()
            status, got, answer = send(proxy, COMPLETIONS, raw)
            check(status, got, answer, tally)
            assert status in (200, 400), (field, value[:10], status)
    assert proxy.proxy is not None and len(proxy.proxy.sessions) < 20
    assert_healthy(proxy, caplog)


def _burst_case(i: int, rng: random.Random) -> tuple[str, bytes, Callable[[int], bool]]:
    kind = i % 5
    if kind == 0:
        body = {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 3, "stream": i % 2 == 0}
        return CHAT, json.dumps(body).encode(), lambda s: s == 200
    if kind == 1:
        return COMPLETIONS, json.dumps({"prompt": f"p{i} " * 50, "max_tokens": 2}).encode(), lambda s: s == 200
    if kind == 2:
        path, raw = mutate(rng)
        return path, raw, lambda s: s < 500  # and check() checks the error's shape
    if kind == 3:
        return CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', lambda s: s == 400
    return COMPLETIONS, b"[" * 3000 + b"]" * 3000, lambda s: s == 400


def test_a_mixed_burst_is_served_and_refused_correctly(proxy: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(SEED + 1)
    cases = [_burst_case(i, rng) for i in range(BURST)]
    before = rss_bytes()
    tally: Counter[str] = Counter()

    def one(case: tuple[str, bytes, Callable[[int], bool]]) -> tuple[int, dict[str, str], bytes, bool]:
        path, raw, ok = case
        status, headers, body = send(proxy, path, raw)
        return status, headers, body, ok(status)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, cases))
    for status, headers, body, ok in results:
        assert ok, (status, body[:200])
        check(status, headers, body, tally)
    print("burst by status:", dict(sorted(tally.items())))
    assert tally["200"] >= 2 * BURST // 5
    assert rss_bytes() - before < RSS_BOUND
    assert_healthy(proxy, caplog)
