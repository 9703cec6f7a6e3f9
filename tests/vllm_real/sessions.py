"""Drives conversations through ``smetric serve`` and records, for every request, the proxy's
decision beside the engine's own numbers (``usage.prompt_tokens_details.cached_tokens``).

``paced``: after every request, wait until the proxy's KV-event feed has received every block the
engine stored for it — ``(prompt + completion - 1) // 32 - cached // 32`` new full blocks (the
last sampled token's KV is never computed), read from the proxy's own
``kv_events_stored_blocks_total`` counter of the home instance. The wait counts from the counter
the previous wait on that instance left, so it waits after a session's last turn too: otherwise
that turn's blocks, arriving unwaited, were counted by the next session's first wait on the
instance, which could then end before its own answer's last block was in (a follow-up
under-predicted by that block). Not paced: the follow-up leaves as soon as the answer is in (back
to back, as an agent sends the next turn when a tool returns).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from conversations import Conversation
from real_util import decision, fleet, metric_sum

STORED = "smetric_kv_events_stored_blocks_total"


@dataclass
class Record:
    session: str
    turn: int
    endpoint: str
    stream: bool
    instance: str
    reason: str
    predicted: int
    cached: int
    prompt_tokens: int
    completion_tokens: int
    gap_ms: float
    """From the previous answer's last byte to this request's send."""


async def _stored(client: aiohttp.ClientSession, base: str, instance: str) -> float:
    async with client.get(base + "/metrics") as r:
        return metric_sum(await r.text(), STORED, instance=instance)


async def _post(
    client: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, str], str, dict[str, Any]]:
    """The decision, the answer's text and its usage (streams: with ``include_usage``)."""
    async with client.post(base + path, json=body, headers=headers) as r:
        raw = await r.read()
        if r.status != 200:
            raise AssertionError(f"{path} answered {r.status}: {raw[:500]!r}")
        d = decision(r.headers["x-smetric-decision"])
    if not body.get("stream"):
        doc = json.loads(raw)
        choice = doc["choices"][0]
        content = choice["message"]["content"] if "message" in choice else choice["text"]
        return d, content or "", doc["usage"]
    parts: list[str] = []
    usage: dict[str, Any] = {}
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
            parts.append(delta or "")
        usage = chunk.get("usage") or usage
    assert usage, "the stream carried no usage (stream_options.include_usage)"
    return d, "".join(parts), usage


async def run_session(
    client: aiohttp.ClientSession,
    base: str | Sequence[str],
    conv: Conversation,
    *,
    turns: int,
    endpoint: str = "chat",
    stream: bool = False,
    paced: bool = False,
    max_tokens: int = 8,
) -> list[Record]:
    """``turns`` requests of ``conv`` (chat) or of a growing text prompt (``endpoint="completions"``).

    With several ``base`` URLs (proxy replicas) turn k goes to ``base[(k - 1) % len(base)]``; paced
    follow-ups then wait for every replica's feed."""
    bases = [base] if isinstance(base, str) else list(base)
    records: list[Record] = []
    prompt = " ".join(
        m["content"] if isinstance(m["content"], str) else "".join(p["text"] for p in m["content"])
        for m in conv.messages
    )
    headers = {"x-session-id": conv.key}
    answered_at: float | None = None
    for turn in range(1, turns + 1):
        body: dict[str, Any] = {"model": fleet.MODEL_NAME, "max_tokens": max_tokens, "ignore_eos": True}
        if endpoint == "chat":
            path = "/v1/chat/completions"
            body.update(messages=conv.messages, **conv.extra())
        else:
            path = "/v1/completions"
            body["prompt"] = prompt
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        gap_ms = 0.0 if answered_at is None else (time.monotonic() - answered_at) * 1000
        d, content, usage = await _post(client, bases[(turn - 1) % len(bases)], path, body, headers)
        answered_at = time.monotonic()
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        rec = Record(
            conv.key, turn, endpoint, stream, d["instance"], d["reason"], int(d["local_hit_tokens"]), cached,
            int(usage["prompt_tokens"]), int(usage["completion_tokens"]), gap_ms,
        )  # fmt: skip
        records.append(rec)
        if paced:
            # After every turn, the last one too: the next paced wait on this instance (the next
            # session's) counts from the counter this one leaves, so it must include these blocks.
            for b in bases:
                await _wait_for_blocks(client, b, rec)
            answered_at = time.monotonic()
        if turn == turns:
            break
        if endpoint == "chat":
            conv.answer(content)
        else:
            prompt = prompt + content + " " + " ".join(conv.rng.choice(("next", "turn", "tool")) for _ in range(30))
    return records


_stored_seen: dict[tuple[str, str], float] = {}
"""(proxy, instance) → the proxy's stored-blocks counter of the instance when last checked."""


async def _wait_for_blocks(client: aiohttp.ClientSession, base: str, rec: Record) -> None:
    """Waits (≤ 10 s) until the proxy's feed counted the blocks ``rec`` made the engine store."""
    bs = fleet.BLOCK_SIZE
    new_blocks = (rec.prompt_tokens + rec.completion_tokens - 1) // bs - rec.cached // bs
    start = _stored_seen.get((base, rec.instance))
    if start is None:
        raise AssertionError("call mark_stored() before a paced session")
    deadline = time.monotonic() + 10
    while True:
        now = await _stored(client, base, rec.instance)
        if now - start >= new_blocks:
            _stored_seen[(base, rec.instance)] = now
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the proxy's feed got {now - start} of {new_blocks} blocks of {rec} in 10 s")
        await asyncio.sleep(0.005)


async def mark_stored(client: aiohttp.ClientSession, base: str | Sequence[str], instances: list[str]) -> None:
    """Brings the feed of every proxy in ``base`` up to date, then remembers its stored-blocks
    counter of each instance (paced sessions must then run one at a time).

    A proxy that subscribed after the engines served requests catches up by a replay when the first
    live batch shows the gap, and the replayed blocks raise the counter too; so first make every
    engine publish (a request straight to it, a block of new tokens) and wait until each proxy has
    received it and its counter holds still for 0.3 s (≤ 30 s).
    """
    bases = [base] if isinstance(base, str) else list(base)
    for i, url in enumerate(instances):
        before = {b: await _stored(client, b, url) for b in bases}
        body = {"model": fleet.MODEL_NAME, "prompt": f"warm-up {i} {time.time()} " * 20, "max_tokens": 1}
        async with client.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
        for b in bases:
            deadline = time.monotonic() + 30
            last, still_since = before[b], time.monotonic()
            while True:
                now = await _stored(client, b, url)
                if now != last:
                    last, still_since = now, time.monotonic()
                elif now > before[b] and time.monotonic() - still_since >= 0.3:
                    break
                assert time.monotonic() < deadline, f"the feed of {b} from {url} did not settle"
                await asyncio.sleep(0.02)
            _stored_seen[(b, url)] = now
