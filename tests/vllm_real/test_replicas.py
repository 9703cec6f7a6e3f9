"""Two ``smetric serve`` replicas on the same engines' bound KV-event publishers.

vLLM binds an ``ipc://`` (or ``tcp://*:N``) publisher, so both replicas subscribe to the same
streams and keep the same index (``docs/serve.md``, "Several proxy replicas"). Sessions alternate
their turns between the replicas; each follow-up waits until *both* replicas' feeds hold its
predecessor's blocks (the index staleness the docs describe: the engine step plus delivery). Then
whichever replica routes a follow-up must decide as the other did for the turn before: keep the
session at home (sticky), and predict exactly the engine's ``cached_tokens``.

(Connect-mode endpoints, which only one subscriber can bind, are checked without an engine in
``tests/test_kv_events_connect_mode.py``.)
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from conversations import SHAPES, Conversation
from real_util import Fleet, Serve
from sessions import Record, mark_stored, run_session

pytestmark = pytest.mark.vllm_real


def test_two_replicas_make_the_same_decisions(vllm_fleet: Fleet, tmp_path: Path) -> None:
    replicas = [Serve(vllm_fleet.urls, log=tmp_path / f"serve{i}.log") for i in range(2)]
    try:
        for r in replicas:
            r.wait_ready()
        bases = [r.url for r in replicas]

        async def main() -> list[Record]:
            out: list[Record] = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
                await mark_stored(client, bases, vllm_fleet.urls)
                for i in range(12):
                    conv = Conversation(SHAPES[i % len(SHAPES)], seed=7000 + i)
                    # Odd sessions start on the second replica.
                    order = bases if i % 2 == 0 else bases[::-1]
                    out += await run_session(client, order, conv, turns=4, paced=True, stream=i % 3 == 0)
            return out

        records = asyncio.run(main())
    finally:
        errors = [r.stop() for r in replicas]
    for err in errors:
        assert "Traceback" not in err, err[-3000:]
    follow = [r for r in records if r.turn > 1]
    home = {(r.session, r.turn): r.instance for r in records}
    assert all(r.instance == home[(r.session, r.turn - 1)] for r in follow), Counter(r.reason for r in follow)
    assert all(r.reason == "sticky" and r.predicted == r.cached > 0 for r in follow), [
        r for r in follow if r.predicted != r.cached or r.reason != "sticky"
    ]
    assert {r.instance for r in records if r.turn == 1} == set(vllm_fleet.urls)
